"""Every test docs/reliability.md names as the proof of a promise exists: a
renamed or folded test must not leave a promise pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = (REPO / "docs" / "reliability.md").read_text()
TESTS = {p.relative_to(REPO).as_posix(): p.read_text() for p in (REPO / "tests").rglob("*.py")}


def named_missing(doc: str, tests: dict[str, str]) -> list[str]:
    """What ``doc`` names that ``tests`` (path -> source) does not hold:
    ``tests/FILE.py``, ``tests/FILE.py::NAME``, a bare `` `test_NAME` ``, or
    a family `` `test_PREFIX_*` ``."""
    everything = "\n".join(tests.values())
    missing = []
    for m in re.finditer(r"(tests/[\w/]+\.py)(?:::(\w+))?", doc):
        path, name = m.group(1), m.group(2)
        if path not in tests:
            missing.append(path)
        elif name and not re.search(rf"def {name}\b", tests[path]):
            missing.append(f"{path}::{name}")
    for m in re.finditer(r"(?<![\w/:])`(test_\w+?)(\*?)`", doc):
        name, family = m.group(1), m.group(2)
        if family:
            if not re.search(rf"def {name}", everything):
                missing.append(f"{name}*")
        elif not re.search(rf"def {name}\b", everything) and not any(p.endswith(f"/{name}.py") for p in tests):
            missing.append(name)
    return missing


def test_every_test_named_as_a_proof_exists():
    assert named_missing(DOC, TESTS) == []


def test_a_name_that_points_at_nothing_is_found():
    tests = {"tests/test_a.py": "def test_real():\n    pass\n"}
    doc = (
        "`tests/test_a.py::test_real`, `tests/test_a.py::test_gone`, `tests/test_b.py`,"
        " `test_real`, `test_nope`, `test_re*`, `test_zz*`"
    )
    assert named_missing(doc, tests) == ["tests/test_a.py::test_gone", "tests/test_b.py", "test_nope", "test_zz*"]
