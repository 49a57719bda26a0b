"""The architecture holds: lower layers never import the edges, and users
never read references to documents they do not have."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import corral

SRC = Path(corral.__file__).resolve().parent
LOWER = ("core", "engine", "stores", "maintenance")
EDGES = ("corral.app", "corral.cli", "corral.edges", "corral.bench")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_lower_layers_never_import_the_public_api_or_the_edges():
    offenders = []
    for layer in LOWER:
        for path in sorted((SRC / layer).rglob("*.py")):
            for name in _imports(path):
                if any(name == e or name.startswith(e + ".") for e in EDGES):
                    offenders.append(f"{path.relative_to(SRC)} imports {name}")
    assert offenders == []


def test_core_needs_no_thread_process_or_database():
    banned = {"threading", "multiprocessing", "sqlite3", "psycopg", "subprocess", "corral.stores", "corral.engine"}
    offenders = []
    for path in sorted((SRC / "core").rglob("*.py")):
        if path.name == "clock.py":  # FakeClock takes a lock so test threads may move it
            continue
        offenders += [f"{path.name} imports {n}" for n in _imports(path) if n.split(".")[0] in banned or n in banned]
    assert offenders == []


def test_no_source_text_cites_the_requirement_documents():
    cited = re.compile(r"seed\s+00\d", re.IGNORECASE)
    hits = [
        f"{path.relative_to(SRC)}:{i}"
        for path in sorted(SRC.rglob("*"))
        if path.suffix in (".py", ".sql", ".html", ".txt")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if cited.search(line)
    ]
    assert hits == []
