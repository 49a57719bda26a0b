"""Named SQL queries, one ``.sql`` file per dialect.

Each file holds blocks that start with a ``-- name: query_name`` line; the
same names are used in every dialect so the stores read alike. Blocks may hold
several statements when a store runs them as a script (schema).

A block that starts with ``-- fragment: fragment_name`` is a piece of SQL
several queries share (the gate check of a claim, for one): a query writes
``{{fragment_name}}`` where it goes, and the loader puts it in. A fragment is
no query of its own.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_BLOCK = re.compile(r"^--\s*(name|fragment):\s*(\w+)\s*$", re.MULTILINE)
_USE = re.compile(r"\{\{(\w+)\}\}")


@cache
def load(dialect: str) -> dict[str, str]:
    """Return ``{name: sql}`` from ``<dialect>.sql`` beside this module, its
    fragments put in."""
    text = resources.files(__package__).joinpath(f"{dialect}.sql").read_text(encoding="utf-8")
    parts = _BLOCK.split(text)
    queries: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3]):
        into = queries if kind == "name" else fragments
        if name in into:
            raise ValueError(f"{dialect}.sql defines {kind} {name!r} twice")
        if kind == "fragment":  # put in without its leading comment (what it is, said once in the file)
            lines = body.strip().rstrip(";").splitlines()
            while lines and lines[0].lstrip().startswith("--"):
                lines.pop(0)
            body = "\n".join(lines)
        into[name] = body.strip()

    def put(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fragments:
            raise ValueError(f"{dialect}.sql uses fragment {name!r}, which it does not define")
        return fragments[name]

    return {name: _USE.sub(put, sql) for name, sql in queries.items()}
