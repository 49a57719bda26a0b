"""Every Python block of the README, docs/tasks.md and docs/keys.md runs as a new user
would run it: copied into a file of its own, in an empty directory, with
`python FILE` (or `pytest FILE` for a block that defines tests).

A block preceded by ``<!-- continues -->`` goes on from the block before it
(the same file); one preceded by ``<!-- not run: REASON -->`` is skipped and
must say why (it needs something of the reader's own, such as a database)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/tasks.md", "docs/keys.md")
_BLOCK = re.compile(r"(?:<!-- (continues|not run: [^>]*?) -->\n)?```python\n(.*?)```", re.S)


def snippets(doc: str) -> list[tuple[str, str | None]]:
    """(code, why not run) per snippet of ``doc``, continued blocks joined."""
    out: list[tuple[str, str | None]] = []
    for mark, code in _BLOCK.findall((REPO / doc).read_text()):
        if mark == "continues":
            assert out, f"{doc}: the first block cannot continue another"
            prev, why = out[-1]
            out[-1] = (prev + "\n" + code, why)
        elif mark.startswith("not run:"):
            out.append((code, mark.removeprefix("not run:").strip()))
        else:
            out.append((code, None))
    return out


CASES = [(doc, i, code, why) for doc in DOCS for i, (code, why) in enumerate(snippets(doc))]


def test_the_docs_have_snippets_and_few_are_not_run():
    assert len(CASES) >= 8
    skipped = [(doc, i, why) for doc, i, _, why in CASES if why is not None]
    assert all(why for _, _, why in skipped), "a block not run must say why"
    assert len(skipped) <= 1, skipped


@pytest.mark.parametrize("doc, i, code, why", CASES, ids=[f"{c[0]}#{c[1]}" for c in CASES])
def test_a_snippet_runs_as_written(doc, i, code, why, tmp_path):
    if why is not None:
        pytest.skip(why)
    path = tmp_path / f"test_snippet_{i}.py"
    path.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("CORRAL_STORE", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)]
    if "def test_" not in code:
        cmd = [sys.executable, str(path)]
    got = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert got.returncode == 0, f"{doc} block {i} failed:\n{got.stdout[-2000:]}\n{got.stderr[-3000:]}"
