"""The architecture holds: each layer imports only the layers below it,
no two modules import each other (even through others, even inside a
function), and users never read references to documents they do not have."""

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


#: Every package and top-level module of corral, lowest first; a module may
#: import its own layer and the layers before it. The engine's plugins
#: (hooks the app plugs in) sit above the engine they plug into.
LAYERS = (
    ("errors",),
    ("core",),
    ("stores",),
    ("maintenance",),
    ("engine",),
    ("engine.level_follower", "engine.batch_settler"),
    ("app",),
    ("testing",),
    ("edges", "cli", "bench"),
    ("", "__main__"),  # the package itself: corral's public names
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _named(name: str) -> str | None:
    """The corral module an imported name is (or is in): the longest that exists."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    """Each module of corral -> the modules of corral it imports, at the top
    or inside a function (``from pkg import sub`` counts as ``pkg.sub``)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{parent}.{base}" if base else parent
                names += [f"{base}.{a.name}" for a in node.names]
        graph[module] = {n for n in map(_named, names) if n and n != module and n != "corral"}
    return graph


def _layer(module: str) -> int | None:
    inner = module.removeprefix("corral").removeprefix(".")
    best = None
    for rank, names in enumerate(LAYERS):
        for name in names:
            if inner == name or (name and inner.startswith(name + ".")):
                if best is None or len(name) > len(best[1]):
                    best = (rank, name)
    return best[0] if best else None


def test_every_module_belongs_to_a_layer():
    assert [m for m in sorted(MODULES) if _layer(m) is None] == []


def test_each_layer_imports_only_itself_and_the_layers_below():
    offenders = [
        f"{module} imports {dep}"
        for module, deps in sorted(_graph().items())
        for dep in sorted(deps)
        if (_layer(dep) or 0) > (_layer(module) or 0)
    ]
    assert offenders == []


def test_stores_never_import_maintenance_or_the_engine():
    offenders = [
        f"{module} imports {dep}"
        for module, deps in sorted(_graph().items())
        if module.startswith("corral.stores")
        for dep in sorted(deps)
        if dep.startswith(("corral.maintenance", "corral.engine"))
    ]
    assert offenders == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


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
