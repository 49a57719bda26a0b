"""What the adaptive keeper's second costs with a keyed adaptive limit (``python -m corral.bench.adaptive_keys``).

A fresh store holds ``queued`` tasks: a first backlog of one hot key (half
of them, all first in line), then the others spread over ``keys`` keys. The
sweeper's leader runs the keeper (:class:`corral.maintenance.adaptive_keeper.AdaptiveKeeper`)
once per round after a worker's report: first with a plain adaptive limit
reporting alone (the cost before per-key limits), then with every key
reporting calls that use its whole rate (the worst case: each key is asked
whether work waits under it, and each is decided and written). The cost is
the keeper's tick, wall time; one JSON object per run on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from corral.bench.common import temp_store_url
from corral.core.adaptive import LimitReport, bucket_of
from corral.core.gates import keyed_name
from corral.core.model import NewTask
from corral.maintenance.adaptive_keeper import AdaptiveKeeper
from corral.stores import open_store

BATCH = 1000


class _Leading:
    def __init__(self, holder: str):
        self.holder, self.is_leader = holder, True


def run(url: str, keys: int, queued: int, ticks: int) -> dict[str, Any]:
    import corral

    store = open_store(url)
    store.migrate()
    try:
        app = corral.App(store)
        app.limit("plain", rate="auto", max_rate="200/s")
        app.limit("merchant", rate="auto", max_rate="200/s", per_key=True)  # each key starts at 10/s
        hot = queued // 2
        gates = [keyed_name("merchant", "hot")] * hot + [
            keyed_name("merchant", f"m-{i % keys}") for i in range(queued - hot)
        ]
        tasks = [NewTask("t", "[[], {}]", limits=(g,)) for g in gates]
        for i in range(0, len(tasks), BATCH):
            store.submit(tasks[i : i + BATCH])
        if not store.try_lead("sweeper", "bench", 3600.0):
            raise RuntimeError("another process leads this store's sweeper")
        keeper = AdaptiveKeeper(store, _Leading("bench"), aligned=False)
        busy = LimitReport(1.0, 10, 9, 1, 0, 2, latency={bucket_of(20.0): 9}).to_dict()
        keeper.tick()  # a new leader's first second only takes the reports
        out: dict[str, Any] = {"store": url.split(":", 1)[0], "keys": keys, "queued": queued, "ticks": ticks}
        for what, names in (("plain", ["plain"]), ("keyed", [keyed_name("merchant", f"m-{i}") for i in range(keys)])):
            spent = []
            for _ in range(ticks):
                store.report_limits("w1", json.dumps({n: busy for n in names}))
                t = time.perf_counter()
                keeper.tick()
                spent.append(time.perf_counter() - t)
            out[f"{what}_tick_ms_median"] = round(statistics.median(spent) * 1000, 2)
        out["keys_decided"] = keeper.key_decisions
        out["key_events"] = keeper.key_events
        return out
    finally:
        store.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--store", default="sqlite", choices=("memory", "sqlite", "postgres"))
    p.add_argument("--pg-url", default=None)
    p.add_argument("--keys", type=int, default=256, help="keys reporting each second (a worker sends at most 256)")
    p.add_argument("--queued", type=int, default=20_000)
    p.add_argument("--ticks", type=int, default=20)
    a = p.parse_args(argv)
    with temp_store_url(a.store, a.pg_url) as url:
        print(json.dumps(run(url, a.keys, a.queued, a.ticks)), flush=True)


if __name__ == "__main__":
    main()
