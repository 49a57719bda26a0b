"""The conformance suite: every store must pass every test here.

The ``store`` fixture runs each test once per store (ids ``memory``,
``sqlite``, ``postgres``), each time on a fresh, migrated, empty store. The
PostgreSQL run skips on its own when no server is configured.

Time never passes by itself here: a test moves it with ``advance(seconds)``.
Memory and SQLite run on a :class:`FakeClock`; PostgreSQL keeps the database
clock, so there every stored time is shifted back by the same amount instead,
which is the same as time moving forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from corral.core.claims import ClaimRequest
from corral.core.clock import FakeClock
from corral.core.model import Claim, NewTask, Outcome, TaskRecord
from corral.core.states import State
from corral.stores import open_store
from corral.stores.base import Store
from helpers import ARGS


def new(name: str = "t", group: str | None = None, **kw) -> NewTask:
    """A NewTask with empty arguments unless ``args=`` is given."""
    kw.setdefault("args", ARGS)
    return NewTask(name=name, group=group, **kw)


@pytest.fixture
def clock() -> FakeClock:
    """The time of the memory and SQLite stores (PostgreSQL ignores it)."""
    return FakeClock()


@pytest.fixture
def store(url: str, clock: FakeClock) -> Iterator[Store]:
    s = open_store(url, clock=clock)
    try:
        s.migrate()
        yield s
    finally:
        s.close()


@pytest.fixture
def store_kind(request: pytest.FixtureRequest, store: Store) -> str:
    """Which store the current test runs on (``memory``, ``sqlite``, ``postgres``)."""
    return request.node.callspec.params["url"]


@pytest.fixture
def second_store(store: Store, store_kind: str, clock: FakeClock) -> Iterator[Store]:
    """Another instance on the same URL (skips for memory://, which is not shared)."""
    if store_kind == "memory":
        pytest.skip("memory:// instances do not share tasks")
    other = open_store(store.url, clock=clock)
    try:
        other.migrate()
        yield other
    finally:
        other.close()


# Every stored time of the PostgreSQL schema, shifted back to move time forward.
# Groups first: the statement triggers on corral_tasks recompute a head's
# ready_at from its group's last_claimed_at.
PG_SHIFT = (
    "UPDATE corral_groups SET last_claimed_at = last_claimed_at - %(s)s WHERE last_claimed_at > 0",
    "UPDATE corral_tasks SET created_at = created_at - %(s)s, run_at = run_at - %(s)s,"
    " ready_at = ready_at - %(s)s, started_at = started_at - %(s)s, finished_at = finished_at - %(s)s,"
    " lease_expires_at = lease_expires_at - %(s)s, expires_at = expires_at - %(s)s",
    "UPDATE corral_leaders SET expires_at = expires_at - %(s)s",
    "UPDATE corral_fleet SET calm_since = calm_since - %(s)s, changed_at = changed_at - %(s)s",
    "UPDATE corral_events SET at = at - %(s)s",
    *(
        stmt.replace("corral_limits", table)
        for table in ("corral_limits", "corral_limit_keys")  # a keyed limit's keys have their own rows
        for stmt in (
            "UPDATE corral_limits SET counted_at = counted_at - %(s)s, paused_until = paused_until - %(s)s",
            # a sliding window's log: [[slice end, starts], ...]
            "UPDATE corral_limits SET starts = (SELECT coalesce(json_agg(json_build_array((e->>0)::float8 - %(s)s,"
            " e->1) ORDER BY n), '[]'::json) FROM json_array_elements(starts::json) WITH ORDINALITY AS x(e, n))::text"
            " WHERE starts IS NOT NULL",
        )
    ),
    # a keyed adaptive limit's key's controller: when the key last had a call
    "UPDATE corral_limit_keys SET controller = jsonb_set(controller::jsonb, '{seen}',"
    " to_jsonb((controller::jsonb->>'seen')::float8 - %(s)s))::text WHERE controller IS NOT NULL",
    "UPDATE corral_breakers SET state = jsonb_set(state::jsonb, '{opened_at}',"
    " to_jsonb((state::jsonb->>'opened_at')::float8 - %(s)s))::text"
    " WHERE state IS NOT NULL AND state::jsonb->>'opened_at' IS NOT NULL",
    # a breaker's window counts calls per whole second
    "UPDATE corral_breakers SET state = jsonb_set(state::jsonb, '{slots}', coalesce((SELECT jsonb_agg("
    "jsonb_build_array(floor((e->>0)::float8 - %(s)s)::bigint, e->1, e->2) ORDER BY n)"
    " FROM jsonb_array_elements(state::jsonb->'slots') WITH ORDINALITY AS x(e, n)), '[]'::jsonb))::text"
    " WHERE state IS NOT NULL AND jsonb_typeof(state::jsonb->'slots') = 'array'",
    "UPDATE corral_breaker_events SET at = at - %(s)s",
    "UPDATE corral_workers SET started_at = started_at - %(s)s, heartbeat_at = heartbeat_at - %(s)s",
    "UPDATE corral_limit_reports SET at = at - %(s)s",
)


@pytest.fixture
def advance(store: Store, store_kind: str, clock: FakeClock) -> Callable[[float], None]:
    """``advance(seconds)``: move the store's time forward, instead of waiting."""
    if store_kind != "postgres":
        return clock.advance

    import psycopg

    def shift(seconds: float) -> None:
        with psycopg.connect(store.url) as conn, conn.transaction():
            for statement in PG_SHIFT:
                conn.execute(statement, {"s": float(seconds)})
        # the claim's low-water marks hold run_at values as they were: moved
        # back under them, a task would wait for a claim that walks from the start
        store._end_plain()  # type: ignore[attr-defined]

    return shift


# ---- terse helpers used by every test module ---------------------------------


def submit(store: Store, *tasks: NewTask) -> list[int]:
    return [r.id for r in store.submit(list(tasks))]


def submit_one(store: Store, name: str = "t", group: str | None = None, **kw) -> int:
    return submit(store, new(name, group, **kw))[0]


def claim(store: Store, max_units: int = 1, *, queues=("default",), **kw) -> list[Claim]:
    return store.claim("w1", ClaimRequest(tuple(queues), max_units, **kw))


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


def expire_lease(store: Store, rec: TaskRecord, advance: Callable[[float], None]) -> None:
    """Move time just past the end of the lease ``rec`` was claimed with."""
    expires = store.get(rec.id).lease_expires_at
    assert expires is not None
    advance(max(0.0, expires - store.now()) + 0.01)
