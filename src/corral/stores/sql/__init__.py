"""Named SQL queries, one ``.sql`` file per dialect.

Each file holds blocks that start with a ``-- name: query_name`` line; the
same names are used in every dialect so the stores read alike. Blocks may hold
several statements when a store runs them as a script (schema).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@cache
def load(dialect: str) -> dict[str, str]:
    """Return ``{name: sql}`` from ``<dialect>.sql`` beside this module."""
    text = resources.files(__package__).joinpath(f"{dialect}.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise ValueError(f"{dialect}.sql defines {name!r} twice")
        queries[name] = body.strip()
    return queries
