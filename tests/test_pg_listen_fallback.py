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
from corral.stores.postgres import _listen_option
from helpers import wait_for

pytestmark = pytest.mark.postgres

#: far longer than the test's deadline: only the store's own short polling can
#: explain a pick-up before it
SLOW_POLL = 120.0


def with_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


def test_listen_option_is_taken_out_of_the_url_and_other_parameters_stay():
    url, listen = _listen_option("postgresql://u@h:5432/db?sslmode=disable&listen=off&application_name=x")
    assert listen is False
    assert url == "postgresql://u@h:5432/db?sslmode=disable&application_name=x"
    assert _listen_option("postgresql://u@h/db?listen=on") == ("postgresql://u@h/db", True)
    assert _listen_option("postgresql://u@h/db") == ("postgresql://u@h/db", True)


def test_a_bad_listen_value_is_refused_in_one_line(pg_url):
    with pytest.raises(StoreUnavailable) as info:
        open_store(with_query(pg_url, "listen=maybe"))
    assert "\n" not in str(info.value)
    assert "listen=on or listen=off" in str(info.value)


def _runs_without_notifications(worker_app: corral.App, producer_url: str) -> None:
    """A worker of ``worker_app`` waiting SLOW_POLL between empty claims still
    runs a task another process submits, well before that."""
    ran: list[int] = []

    @worker_app.task(name="probe")
    def probe(i: int) -> None:
        ran.append(i)

    producer = corral.App(producer_url)
    producer.task(name="probe")(lambda i: None)
    worker_app.start(workers=2, poll_interval=SLOW_POLL)
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
