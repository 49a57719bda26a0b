"""Transactional enqueue: ``app.submit(..., connection=conn)`` writes the task
inside the caller's own transaction, so it exists if and only if the caller's
business write commits. Real SQLite files and a real PostgreSQL database."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import corral
from corral import State
from corral.core.claims import ClaimRequest
from corral.errors import ConfigError


@pytest.fixture
def app(durable_url) -> Iterator[corral.App]:
    a = corral.App(durable_url)

    @a.task
    def ship(order_id: int) -> int:
        return order_id

    a.limit("carrier", concurrency=2)

    @a.task(limits=["carrier"])
    def label(order_id: int) -> int:
        return order_id

    yield a
    a.close(5)


@contextmanager
def business(app: corral.App) -> Iterator[Any]:
    """A connection of the application's own, with an ``orders`` table, as a
    web request would hold it: not in autocommit, committed by its owner."""
    if app.store.url.startswith("sqlite"):
        con = sqlite3.connect(app.store.path)  # type: ignore[attr-defined]
        con.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY)")
        con.commit()
    else:
        import psycopg

        con = psycopg.connect(app.store.url)
        con.execute("CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY)")
        con.commit()
    try:
        yield con
    finally:
        con.close()


def insert_order(con: Any, order_id: int) -> None:
    mark = "?" if isinstance(con, sqlite3.Connection) else "%s"
    con.execute(f"INSERT INTO orders (id) VALUES ({mark})", (order_id,))


def orders(con: Any) -> list[int]:
    return sorted(r[0] for r in con.execute("SELECT id FROM orders").fetchall())


def test_rolled_back_business_write_leaves_no_task(app):
    with business(app) as con:
        insert_order(con, 1)
        h = app.submit("ship", args=(1,), connection=con)
        con.rollback()
        assert orders(con) == []
    assert app.store.get(h.id) is None
    assert app.tasks() == []


def test_committed_business_write_leaves_exactly_one_task(app):
    with business(app) as con:
        insert_order(con, 7)
        h = app.submit("ship", args=(7,), connection=con)
        con.commit()
        assert orders(con) == [7]
    rows = app.tasks()
    assert [r.id for r in rows] == [h.id]
    assert rows[0].status is State.PENDING and rows[0].name == "ship"


def test_task_is_invisible_to_others_until_the_commit(app, durable_url):
    other = corral.App(durable_url)
    try:
        with business(app) as con:
            insert_order(con, 3)
            h = app.submit("ship", args=(3,), connection=con)
            assert other.store.get(h.id) is None
            con.commit()
        assert other.get(h.id).status is State.PENDING
    finally:
        other.close()


def test_a_worker_runs_the_committed_task(app):
    app.start(workers=1)
    with business(app) as con:
        insert_order(con, 11)
        h = app.submit("ship", args=(11,), connection=con)
        con.commit()
    assert h.result(timeout=20) == 11


def test_group_line_and_head_are_written_in_the_same_transaction(app):
    first = app.submit("ship", args=(1,), group="merchant-1")
    with business(app) as con:
        insert_order(con, 2)
        rolled = app.submit("ship", args=(2,), group="merchant-1", connection=con)
        con.rollback()
    with business(app) as con:
        insert_order(con, 3)
        kept = app.submit("ship", args=(3,), group="merchant-1", connection=con)
        con.commit()
    # the rolled-back task left nothing (SQLite may hand its id out again)
    assert sorted(r.id for r in app.tasks()) == sorted({first.id, kept.id}) and len(app.tasks()) == 2
    assert rolled.id == kept.id or app.store.get(rolled.id) is None
    # only the group's head is claimable; the committed task comes next, in submit order
    (claim,) = app.store.claim("w", ClaimRequest(["default"], 5))
    assert [t.id for t in claim.tasks] == [first.id]
    assert app.store.claim("w", ClaimRequest(["default"], 5)) == []
    t = claim.tasks[0]
    assert app.store.complete([corral.core.model.Outcome(t.id, claim.token, t.version, State.SUCCESS)]) == [True]
    (claim,) = app.store.claim("w", ClaimRequest(["default"], 5))
    assert [t.id for t in claim.tasks] == [kept.id]


def test_idempotency_key_and_limits_hold_inside_a_transaction(app):
    with business(app) as con:
        insert_order(con, 5)
        h = app.submit("label", args=(5,), key="order-5", connection=con)
        again = app.submit("label", args=(5,), key="order-5", connection=con)
        con.commit()
    assert again.id == h.id and not again.created
    assert app.submit("label", args=(5,), key="order-5").id == h.id
    assert app.get(h.id).limits == ("carrier",)


def test_a_rolled_back_key_is_free_again(app):
    with business(app) as con:
        app.submit("ship", args=(1,), key="k", connection=con)
        con.rollback()
    again = app.submit("ship", args=(1,), key="k")
    assert again.created and len(app.tasks()) == 1


def test_connection_to_another_database_is_refused(app, durable_url, tmp_path):
    if durable_url.startswith("sqlite"):
        con: Any = sqlite3.connect(tmp_path / "elsewhere.db")
        with pytest.raises(ConfigError, match="not on this store's database"):
            app.submit("ship", args=(1,), connection=con)
        con.close()
        con = sqlite3.connect(":memory:")
        with pytest.raises(ConfigError, match="in-memory"):
            app.submit("ship", args=(1,), connection=con)
        con.close()
    else:
        import psycopg

        con = psycopg.connect(durable_url.rsplit("/", 1)[0] + "/postgres")
        with pytest.raises(ConfigError, match="connection= is open on database"):
            app.submit("ship", args=(1,), connection=con)
        con.close()
    assert app.tasks() == []


def test_a_foreign_object_is_refused_in_one_line(app):
    with pytest.raises(ConfigError) as err:
        app.submit("ship", args=(1,), connection=object())
    assert "\n" not in str(err.value)


def test_memory_store_says_it_is_not_supported():
    app = corral.App("memory://")

    @app.task
    def ship(order_id: int) -> int:
        return order_id

    with pytest.raises(ConfigError, match="not supported by the memory"):
        ship.submit(1, connection=sqlite3.connect(":memory:"))
    assert app.tasks() == []


def test_postgres_autocommit_without_a_transaction_is_refused(pg_url):
    import psycopg

    app = corral.App(pg_url)
    try:

        @app.task
        def ship(order_id: int) -> int:
            return order_id

        with psycopg.connect(pg_url, autocommit=True) as con:
            with pytest.raises(ConfigError, match="autocommit"):
                ship.submit(1, connection=con)
            with con.transaction():  # an explicit block is the caller's transaction
                h = ship.submit(2, connection=con)
        assert app.get(h.id).status is State.PENDING
    finally:
        app.close()


def test_sqlite_connection_outside_a_transaction_gets_one(sqlite_url):
    app = corral.App(sqlite_url)
    try:

        @app.task
        def ship(order_id: int) -> int:
            return order_id

        con = sqlite3.connect(app.store.path)  # type: ignore[attr-defined]
        con.row_factory = sqlite3.Row  # the caller's row factory does not matter
        h = ship.submit(1, connection=con)
        assert con.in_transaction
        con.rollback()
        assert app.store.get(h.id) is None
        h = ship.submit(2, connection=con)
        con.commit()
        con.close()
        assert app.get(h.id).status is State.PENDING
    finally:
        app.close()


def test_a_graph_commits_or_rolls_back_with_the_business_write(app):
    ship, label = app.registry["ship"], app.registry["label"]
    with business(app) as con:
        insert_order(con, 21)
        app.submit_many([ship.node(21, ref="ship"), label.node(21, depends_on=["ship"])], connection=con)
        con.rollback()
    assert app.tasks() == []
    with business(app) as con:
        insert_order(con, 22)
        h_ship, h_label = app.submit_many(
            [ship.node(22, ref="ship"), label.node(22, ref="label", depends_on=["ship"])], connection=con
        )
        con.commit()
    assert app.get(h_label.id).depends_on == (h_ship.id,)
    assert app.get(h_label.id).status is State.WAITING
    app.start(workers=2)
    assert h_label.result(timeout=20) == 22
