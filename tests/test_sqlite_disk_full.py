"""SQLite with a full disk (``PRAGMA max_page_count`` caps the file): a submit
that does not fit fails with one clear StoreError and stores nothing; the
worker rides through the full disk and goes on once there is room again."""

from __future__ import annotations

import sqlite3

import pytest

import corral
from corral.core.model import TaskFilter
from corral.core.states import State
from corral.errors import StoreError
from corral.stores.sqlite import SQLiteStore
from helpers import wait_for

PAD = "x" * 3000  # about a page of arguments per task


@pytest.fixture
def page_cap(monkeypatch):
    """Every connection the store opens gets ``max_page_count`` from ``cap``;
    ``cap.set(n)`` changes it on the open connections too (None: no cap)."""

    class Cap:
        pages: int | None = None
        stores: list[SQLiteStore] = []

        def apply(self, con: sqlite3.Connection) -> None:
            con.execute(f"PRAGMA max_page_count = {self.pages or 1073741823}")

        def set(self, pages: int | None) -> None:
            self.pages = pages
            for store in self.stores:
                for con in list(store._conns):
                    self.apply(con)

    cap = Cap()
    real = SQLiteStore._con

    def capped(self: SQLiteStore) -> sqlite3.Connection:
        fresh = getattr(self._local, "con", None) is None
        con = real(self)
        if fresh:
            if self not in cap.stores:
                cap.stores.append(self)
            cap.apply(con)
        return con

    monkeypatch.setattr(SQLiteStore, "_con", capped)
    return cap


def test_a_full_disk_refuses_a_submit_cleanly_and_the_worker_goes_on(sqlite_url, page_cap):
    app = corral.App(sqlite_url)

    @app.task(retries=3)
    def pad(i: int, text: str) -> int:
        return i

    first = pad.submit_many([(i, PAD) for i in range(5)])
    app.start(workers=2, poll_interval=0.05)
    try:
        assert [h.result(timeout=30) for h in first] == list(range(5))
        con = app.store._con()
        page_cap.set(con.execute("PRAGMA page_count").fetchone()[0] + 8)

        refused = None
        for n in range(200):  # fill the room left, a batch at a time
            before = app.store.list_tasks(TaskFilter(limit=100_000))
            try:
                pad.submit_many([(1000 + n * 10 + i, PAD) for i in range(10)])
            except StoreError as exc:
                refused = exc
                break
        assert refused is not None, "the capped file never filled"
        text = str(refused)
        assert "full" in text and "\n" not in text, text
        # nothing of the refused batch was stored
        after = app.store.list_tasks(TaskFilter(limit=100_000))
        assert sorted(t.id for t in after) == sorted(t.id for t in before)

        page_cap.set(None)  # room again
        later = pad.submit_many([(i, PAD) for i in range(20)])
        assert [h.result(timeout=60) for h in later] == list(range(20))
        wait_for(
            lambda: set(app.counts()) == {State.SUCCESS.value},
            timeout=60,
            message="every accepted task ran once there was room",
        )
    finally:
        app.close(10)
