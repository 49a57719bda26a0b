"""A worker process holds at most 3 PostgreSQL connections, whatever its
slots: one listening, and a pool of two for claims, completions and the rest."""

from __future__ import annotations

import threading

import corral
from corral.stores.postgres import POOL_MAX_SIZE

APP_NAME = "corral-conn-test"


def test_a_worker_with_20_slots_holds_at_most_3_connections(pg_url, pg_admin_url):
    import psycopg

    url = pg_url + ("&" if "?" in pg_url else "?") + f"application_name={APP_NAME}"
    dbname = pg_url.rsplit("/", 1)[1].split("?")[0]
    app = corral.App(url)
    app.limit("api", concurrency=4)

    @app.task
    def work(i, ctx=None):
        threading.Event().wait(0.002)  # the workload

    @app.task(limits=["api"])
    def limited(i):
        threading.Event().wait(0.002)

    for i in range(300):
        work.submit(i, group=f"g{i % 7}" if i % 3 == 0 else None)
        limited.submit(i)
    seen: list[int] = []
    done = threading.Event()

    def sample() -> None:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            while not done.is_set():
                (n,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = %s",
                    (APP_NAME, dbname),
                ).fetchone()
                seen.append(n)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        app.start(workers=20, sweep_interval=0.2)
        assert app.drain(120)
    finally:
        done.set()
        sampler.join(30)
        app.close(10)
    assert seen, "pg_stat_activity was never read"
    assert max(seen) >= 2  # the sampler saw the worker's connections at all
    assert max(seen) <= POOL_MAX_SIZE + 1 == 3
