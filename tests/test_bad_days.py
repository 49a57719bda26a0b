"""Bad input and bad days: undecodable rows, unreachable stores, database restarts."""

from __future__ import annotations

import pytest

import corral
from corral import State
from corral.core.model import NewTask
from corral.errors import StoreUnavailable
from helpers import wait_for


def test_undecodable_args_fail_that_task_and_the_worker_goes_on(url):
    app = corral.App(url)

    @app.task
    def echo(x):
        return x

    bad = app.store.submit([NewTask(name="echo", args="{not json")])[0].id
    good = echo.submit(5)
    app.start(workers=2)
    try:
        assert good.result(timeout=10) == 5
        rec = wait_for(lambda: (r := app.get(bad)).status.final and r)
        assert rec.status is State.FAILED and "cannot decode" in rec.error
        assert echo.submit(6).result(timeout=10) == 6  # the worker is still alive
    finally:
        app.close(10)


@pytest.mark.parametrize(
    "bad_url",
    [
        "sqlite:///no/such/dir/corral.db",
        "postgresql://postgres@127.0.0.1:1/postgres",
        "redis://localhost",
        "nonsense",
    ],
)
def test_bad_store_urls_give_one_line_errors(bad_url):
    with pytest.raises((StoreUnavailable, corral.ConfigError)) as exc:
        corral.App(bad_url)
    assert "\n" not in str(exc.value) and str(exc.value)


@pytest.mark.postgres
def test_workers_reconnect_after_the_database_drops_connections(pg_url):
    import psycopg

    app = corral.App(pg_url)

    @app.task
    def echo(x):
        return x

    app.start(workers=4)
    try:
        assert echo.submit(1).result(timeout=10) == 1
        dbname = pg_url.rsplit("/", 1)[1]
        with psycopg.connect(pg_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            ).fetchone()[0]
        assert killed > 0  # as a restart would, every connection of the app is gone
        handles = wait_for(lambda: _try_submit(echo), timeout=20, message="submit works again")
        assert [h.result(timeout=20) for h in handles] == list(range(10))
    finally:
        app.close(10)


def _try_submit(task):
    try:
        return task.submit_many([(i,) for i in range(10)])
    except corral.StoreError:
        return None
