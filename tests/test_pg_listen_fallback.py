"""A PostgreSQL store where LISTEN/NOTIFY cannot reach it polls instead.

Behind a transaction pooler (PgBouncer ``pool_mode=transaction``) LISTEN is
accepted but no notification ever comes back, so a worker waiting for one
would only see new work at its own poll interval. ``?listen=off`` in the URL
makes the store poll at a short interval, and so does a store whose first
LISTEN fails or whose test notification does not come back.
"""

from __future__ import annotations

import pytest

import corral
from corral import State
from corral.errors import StoreUnavailable
from corral.stores import open_store
from corral.stores.postgres import _corral_options
from helpers import wait_for

pytestmark = pytest.mark.postgres

#: far longer than the test's deadline: only the store's own short polling can
#: explain a pick-up before it
SLOW_POLL = 120.0


def with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


def test_corral_options_are_taken_out_of_the_url_and_other_parameters_stay():
    url, listen, pooler = _corral_options("postgresql://u@h:5432/db?sslmode=disable&listen=off&application_name=x")
    assert (listen, pooler) == (False, None)
    assert url == "postgresql://u@h:5432/db?sslmode=disable&application_name=x"
    assert _corral_options("postgresql://u@h/db?listen=on") == ("postgresql://u@h/db", True, None)
    assert _corral_options("postgresql://u@h/db") == ("postgresql://u@h/db", True, None)
    # a transaction pooler passes no notification: it polls unless told otherwise
    assert _corral_options("postgresql://u@h/db?pooler=transaction") == ("postgresql://u@h/db", False, "transaction")
    assert _corral_options("postgresql://u@h/db?pooler=session") == ("postgresql://u@h/db", True, "session")


@pytest.mark.parametrize(
    "query, rule", [("listen=maybe", "listen=on or listen=off"), ("pooler=yes", "pooler=session or pooler=transaction")]
)
def test_a_bad_value_is_refused_in_one_line(pg_url, query, rule):
    with pytest.raises(StoreUnavailable) as info:
        open_store(with_query(pg_url, query))
    assert "\n" not in str(info.value)
    assert rule in str(info.value)


def _runs_without_notifications(worker_app: corral.App, producer_url: str, poll: float = SLOW_POLL) -> None:
    """A worker of ``worker_app`` waiting ``poll`` between empty claims still
    runs a task another process submits, well before that."""
    ran: list[int] = []

    @worker_app.task(name="probe")
    def probe(i: int) -> None:
        ran.append(i)

    producer = corral.App(producer_url)
    producer.task(name="probe")(lambda i: None)
    worker_app.start(workers=2, poll_interval=poll)
    try:
        wait_for(lambda: worker_app.store._listening is False or worker_app.store._listen_conn is not None)
        first = producer.submit("probe", args=(1,))
        wait_for(lambda: ran == [1], timeout=30, message="the worker should poll without notifications")
        second = producer.submit("probe", args=(2,))  # and again, once idle
        wait_for(lambda: ran == [1, 2], timeout=30, message="the worker should keep polling")
        for h in (first, second):  # completions are written a moment later
            wait_for(lambda h=h: producer.get(h.id).status is State.SUCCESS)
    finally:
        worker_app.close(10)
        producer.close(10)


def test_listen_off_polls_and_never_listens(pg_url):
    app = corral.App(with_query(pg_url, "listen=off"))
    assert app.store._listening is False
    _runs_without_notifications(app, pg_url)
    assert app.store._listen_conn is None


def test_a_store_whose_test_notification_is_lost_polls_instead(pg_url):
    """As behind a transaction pooler: LISTEN is accepted, nothing comes back."""
    app = corral.App(pg_url)
    app.store._send_check = lambda channel: None  # the pooler loses it
    _runs_without_notifications(app, pg_url)
    assert app.store._listening is False
    assert app.store._listen_conn is None


def test_a_store_that_hears_its_test_notification_keeps_listening(pg_url):
    store = open_store(pg_url)
    try:
        store.migrate()
        store.wait_for_work(0.05)
        assert store._listening is True
        assert store._listen_conn is not None
    finally:
        store.close()


@pytest.mark.parametrize("pooler", ["session", "transaction"])
def test_a_store_for_a_pooler_works_end_to_end(pg_url, pooler):
    """Without the `options` startup parameter a pooler refuses; a transaction
    pooler's store prepares nothing, migrates under a transaction's lock and
    polls. (Run here straight against the server: a pooler is not needed to
    check that the store does all of that.)"""
    app = corral.App(with_query(pg_url, f"pooler={pooler}"))
    store = app.store
    assert "options" not in store._conn_kwargs
    assert store._listening is (pooler == "session")
    with store._pool.connection() as conn:
        assert conn.execute("SHOW enable_bitmapscan").fetchone()[0] == ("off" if pooler == "session" else "on")
        parallel = conn.execute("SHOW max_parallel_workers_per_gather").fetchone()[0]
        assert (parallel == "0") is (pooler == "session")
        if pooler == "transaction":
            assert conn.prepare_threshold is None
    store.migrate()  # again: idempotent, under either lock
    # a listening worker waits its whole poll interval in wait_for_work when
    # stopped: keep it short where the store listens
    _runs_without_notifications(app, pg_url, SLOW_POLL if pooler == "transaction" else 2.0)
    if pooler == "transaction":
        assert store._listen_conn is None
