"""The conformance suite: every store must pass every test here.

The ``store`` fixture runs each test once per store (ids ``memory``,
``sqlite``, ``postgres``), each time on a fresh, migrated, empty store. The
PostgreSQL run skips on its own when no server is configured.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from corral.core.model import Claim, NewTask, Outcome, TaskRecord
from corral.core.states import State
from corral.stores import open_store
from corral.stores.base import Store

from helpers import wait_for  # noqa: F401  (re-exported to the test modules)

ARGS = '{"args":[],"kwargs":{}}'
STORE_KINDS = ("memory", "sqlite", "postgres")


def new(name: str = "t", group: str | None = None, **kw) -> NewTask:
    """A NewTask with empty arguments unless ``args=`` is given."""
    kw.setdefault("args", ARGS)
    return NewTask(name=name, group=group, **kw)


def _url(request: pytest.FixtureRequest, kind: str) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")  # skips this run alone without a server


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    url = _url(request, request.param)
    s = open_store(url)
    try:
        s.migrate()
        yield s
    finally:
        s.close()


@pytest.fixture
def store_kind(request: pytest.FixtureRequest, store: Store) -> str:
    """Which store the current test runs on (``memory``, ``sqlite``, ``postgres``)."""
    return request.node.callspec.params["store"]


@pytest.fixture
def second_store(store: Store, store_kind: str) -> Iterator[Store]:
    """Another instance on the same URL (skips for memory://, which is not shared)."""
    if store_kind == "memory":
        pytest.skip("memory:// instances do not share tasks")
    other = open_store(store.url)
    try:
        other.migrate()
        yield other
    finally:
        other.close()


# ---- terse helpers used by every test module ---------------------------------


def submit(store: Store, *tasks: NewTask) -> list[int]:
    return [r.id for r in store.submit(list(tasks))]


def submit_one(store: Store, name: str = "t", group: str | None = None, **kw) -> int:
    return submit(store, new(name, group, **kw))[0]


def claim(store: Store, max_units: int = 1, *, queues=("default",), **kw) -> list[Claim]:
    return store.claim("w1", list(queues), max_units, **kw)


def claim_one(store: Store, **kw) -> TaskRecord:
    """Claim exactly one single-task unit and return its task."""
    claims = claim(store, 1, **kw)
    assert len(claims) == 1, f"expected one claim, got {claims!r}"
    assert len(claims[0].tasks) == 1
    return claims[0].tasks[0]


def claimed_ids(claims: list[Claim]) -> list[int]:
    return [t.id for c in claims for t in c.tasks]


def finish(store: Store, rec: TaskRecord, status: State = State.SUCCESS, **kw) -> bool:
    """Complete a claimed task (guarded by the token and version it was claimed with)."""
    (ok,) = store.complete([Outcome(rec.id, rec.lease_token, rec.version, status, **kw)])
    return ok


def status_of(store: Store, task_id: int) -> State:
    rec = store.get(task_id)
    assert rec is not None
    return State(rec.status)


def expire_lease(store: Store, rec: TaskRecord) -> None:
    """Wait (by the store's clock) until the lease ``rec`` was claimed with has run out."""
    expires = store.get(rec.id).lease_expires_at
    assert expires is not None
    wait_for(lambda: store.now() > expires + 0.01, timeout=10, message="lease expiry")
