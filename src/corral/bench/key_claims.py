"""What a claim costs with many active keys (``python -m corral.bench.key_claims``).

A fresh store holds ``keys x per_key`` queued tasks, submitted in batches of
1 000, and one claim of ``units`` at a time takes work and completes it, as a
worker does. Three runs, each on its own store with the same number of
queued tasks: no limit; a plain limit that never binds; a keyed limit whose
budget never binds (concurrency 2 per key; ``--rate``: and a rate), one key per ``per_key`` tasks, so
every key stays active (queued or running work) throughout. Before
measuring, ``--warm`` tasks (default: one per key) are claimed and completed,
so that under a rate every key has its row. The claim's cost
is the store call's wall time per claim (and per task claimed); the submit's,
the time of the setup's batches. One JSON object per run on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from corral.bench.common import temp_store_url
from corral.core.claims import ClaimRequest
from corral.core.gates import keyed_name
from corral.core.model import LimitSpec, NewTask, Outcome
from corral.core.states import State
from corral.stores import open_store

MODES = ("none", "plain", "keyed")
BATCH = 1000


def _tasks(mode: str, keys: int, per_key: int) -> list[NewTask]:
    out = []
    for _ in range(per_key):  # the keys in turn, so the warm-up touches each one
        for k in range(keys):
            limits: tuple[str, ...] = ()
            if mode == "plain":
                limits = ("partner",)
            elif mode == "keyed":
                limits = (keyed_name("merchant", f"m-{k}"),)
            out.append(NewTask(name="t", args="[[], {}]", limits=limits))
    return out


def run(
    url: str, mode: str, keys: int, per_key: int, claims: int, units: int, rate: str | None = None, warm: int = 0
) -> dict[str, Any]:
    store = open_store(url)
    store.migrate()
    try:
        if mode == "plain":
            store.set_limit(LimitSpec("partner", concurrency=1_000_000, rate=rate))
        elif mode == "keyed":
            store.set_limit(LimitSpec("merchant", concurrency=2, rate=rate))
        tasks = _tasks(mode, keys, per_key)
        t0 = time.perf_counter()
        for i in range(0, len(tasks), BATCH):
            store.submit(tasks[i : i + BATCH])
        submit_s = time.perf_counter() - t0
        req = ClaimRequest(("default",), units)

        def cycle() -> tuple[float, int]:
            t = time.perf_counter()
            got = store.claim("bench", req)
            spent = time.perf_counter() - t
            recs = [r for c in got for r in c.tasks]
            store.complete([Outcome(r.id, r.lease_token or "", r.version, State.SUCCESS) for r in recs])
            return spent, len(recs)

        warmed = 0
        while warmed < warm:  # each key's first task: a rate's key gets its row
            _, n = cycle()
            if not n:
                break
            warmed += n
        times: list[float] = []
        taken = 0
        for _ in range(claims):
            spent, n = cycle()
            times.append(spent)
            taken += n
            if not n:
                break
        steady = times[len(times) // 10 :] or times  # the first tenth: the caches warming
        return {
            "store": url.split(":", 1)[0],
            "mode": mode,
            "keys": keys if mode == "keyed" else 0,
            "rate": rate if mode != "none" else None,
            "queued": len(tasks),
            "submit_s": round(submit_s, 3),
            "warmed": warmed,
            "claims": len(times),
            "tasks_claimed": taken,
            "claim_ms_median": round(statistics.median(steady) * 1000, 3),
            "claim_ms_mean": round(statistics.fmean(steady) * 1000, 3),
            "ms_per_task": round(sum(times) * 1000 / max(1, taken), 3),
        }
    finally:
        store.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", default="sqlite", choices=("memory", "sqlite", "postgres"))
    p.add_argument("--pg-url", default=None)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--per-key", type=int, default=3)
    p.add_argument("--warm", type=int, default=None, help="tasks claimed before measuring (default: --keys)")
    p.add_argument("--claims", type=int, default=300)
    p.add_argument("--units", type=int, default=10)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--rate", default=None, help="a rate on the limit (plain and keyed) that never binds, e.g. 1000/s")
    a = p.parse_args(argv)
    for mode in a.modes.split(","):
        with temp_store_url(a.store, a.pg_url) as url:
            print(
                json.dumps(
                    run(url, mode, a.keys, a.per_key, a.claims, a.units, a.rate, a.keys if a.warm is None else a.warm)
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
