"""Submits one debounced task N times with one key, as fast as it can; each
submit's task id appended to IDS. The tests start two or three of these.

Run: ``python tests/apps/debounce_submitter.py`` with CORRAL_STORE, TAG, COUNT and IDS set.
"""

from __future__ import annotations

import os

import corral

app = corral.App(os.environ["CORRAL_STORE"])


@app.task(debounce="1s", debounce_max="2s")
def reindex(tag: str, n: int) -> list:
    return [tag, n]


if __name__ == "__main__":
    tag = os.environ["TAG"]
    ids = [reindex.submit(tag, n, debounce_key="shop-7").id for n in range(int(os.environ["COUNT"]))]
    with open(os.environ["IDS"], "w") as f:
        f.write(" ".join(map(str, ids)))
    app.close()
