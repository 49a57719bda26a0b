"""Submits bursts of tasks for ever; after each burst returns, appends its ids to ACKED.

Run: ``python tests/apps/burst_submitter.py`` with CORRAL_STORE and ACKED set.
"""

from __future__ import annotations

import os

import corral

app = corral.App(os.environ["CORRAL_STORE"])
noop = app.task(name="noop")(lambda ctx: 0)

if __name__ == "__main__":
    n = 0
    while True:
        handles = noop.submit_many([{"args": (), "key": f"{os.getpid()}-{n}-{i}"} for i in range(50)])
        n += 1
        with open(os.environ["ACKED"], "a") as f:
            f.write(" ".join(str(h.id) for h in handles) + "\n")
