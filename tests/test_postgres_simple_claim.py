"""PostgreSQL's one-statement claim of work under simple limits (``claim_simple``):
ungrouped tasks whose every limit, plain or keyed, is a cap alone. Exact across
processes claiming at once, keys in turn, and it leaves every other kind of
work (a rate, a pause, a group, a breaker) to the other path.
"""

from __future__ import annotations

import multiprocessing
import select
from collections import Counter

import psycopg
import pytest
from psycopg.rows import dict_row

from corral.core import breaker as brk
from corral.core.claims import ClaimRequest
from corral.core.gates import keyed_name, split_key
from corral.core.model import LimitSpec, NewTask, Outcome
from corral.core.states import State
from corral.stores import open_store
from corral.stores.postgres import _claim_params
from helpers import ARGS, wait_for

pytestmark = pytest.mark.postgres


def task(*limits: str, name: str = "t", **kw) -> NewTask:
    return NewTask(name=name, args=ARGS, limits=tuple(limits), **kw)


def key(k: str, limit: str = "merchant") -> str:
    return keyed_name(limit, k)


@pytest.fixture
def pg(pg_url):
    s = open_store(pg_url)
    s.migrate()
    try:
        yield s
    finally:
        s.close()


def simple(store, n: int, queues: tuple[str, ...] = ("default",)) -> tuple[list[dict], bool]:
    """One claim_simple statement, as a worker's claim makes it (with the
    default retry share): the rows it took, and whether it left the claim
    to the other path."""
    base = _claim_params("w", ClaimRequest(queues, n, retry_share=0.25))
    store._simple_off = 0.0  # judge every call afresh
    with store._pool.connection() as conn:
        return store._claim_simple(conn.cursor(row_factory=dict_row), base, n)


def keys_of(rows: list[dict]) -> list[str]:
    return [split_key(n)[1] for r in rows for n in r["limits"] if split_key(n)[1]]


def test_a_keyed_claim_is_one_statement(pg, monkeypatch):
    pg.set_limit(LimitSpec("merchant", concurrency=1000, per_key=True))
    pg.submit([task(key(f"k{i % 50}")) for i in range(200)])
    assert len(pg.claim("w", ClaimRequest(("default",), 8))) == 8  # (the hints settle)
    statements: list[str] = []
    for cls in (psycopg.Cursor, psycopg.Connection):
        real = cls.execute

        def execute(self, query, *a, real=real, **kw):
            statements.append(str(query).split("\n", 1)[0])
            return real(self, query, *a, **kw)

        monkeypatch.setattr(cls, "execute", execute)
    got = pg.claim("w", ClaimRequest(("default",), 8))
    assert len(got) == 8 and len({c.tasks[0].limits[0] for c in got}) == 8
    assert len(statements) == 1, statements


def test_keys_in_turn_a_keys_first_task_before_any_keys_second(pg):
    pg.set_limit(LimitSpec("merchant", concurrency=10))
    # key after key: a's three tasks, then b's, then c's (the whole queue in reach)
    pg.submit([task(key(k)) for k in "abc" for _ in range(3)])
    rows, more = simple(pg, 5)
    assert not more
    assert keys_of(rows) == ["a", "b", "c", "a", "b"]


def test_keys_in_turn_beyond_the_look_ahead_each_keys_first_or_the_other_path(pg):
    pg.set_limit(LimitSpec("merchant", concurrency=10))
    pg.submit([task(key(f"z{i:02}")) for i in range(20) for _ in range(3)])  # key after key
    rows, more = simple(pg, 2)
    assert not more and keys_of(rows) == ["z00", "z01"]
    rows, more = simple(pg, 6)  # six keys' first tasks are in reach: one each
    assert not more and keys_of(rows) == [f"z{i:02}" for i in range(6)]
    # twenty units would take some key's second before the keys out of reach
    rows, more = simple(pg, 20)
    assert more and rows == []


def test_a_hot_keys_backlog_in_front_is_left_to_the_other_path(pg):
    # n units each its key's first are not in the look-ahead: a second unit of
    # the hot key could come before the keys behind it, so it takes nothing
    pg.set_limit(LimitSpec("merchant", concurrency=10_000))
    pg.submit([task(key("hot")) for _ in range(100)] + [task(key(f"cold{i}")) for i in range(10)])
    rows, more = simple(pg, 5)
    assert more and rows == []
    got = pg.claim("w", ClaimRequest(("default",), 5))  # the other path serves them in turn
    assert Counter(t.limits[0] for c in got for t in c.tasks)[key("hot")] == 1


def test_each_cap_holds_plain_and_keyed_and_a_keys_own_value(pg):
    pg.set_limit(LimitSpec("merchant", concurrency=2))
    pg.set_limit(LimitSpec("partner", concurrency=3))
    pg.submit([task(key(k), "partner") for k in "ab" for _ in range(3)] + [task(key("c")) for _ in range(3)])
    # an adaptive limit's key writes its own concurrency: c may run one only
    with pg._pool.connection() as conn:
        conn.execute("INSERT INTO corral_limit_keys (name, concurrency) VALUES (%s, 1)", (key("c"),))
    rows, more = simple(pg, 20)
    assert not more
    got = Counter(keys_of(rows))
    assert got == {"a": 2, "b": 1, "c": 1}  # partner's 3 over a and b; c its own 1
    assert simple(pg, 20) == ([], False)  # every cap full: nothing, and nothing for the other path


@pytest.mark.parametrize("kind", ["rate", "key_rate", "paused_until", "key_paused", "breaker", "group"])
def test_work_it_cannot_judge_is_never_taken_and_left_to_the_other_path(pg, kind):
    # first in claim order: a task under "other", which is more than a cap
    # (or the task is grouped, or under an open breaker); behind it, simple work
    pg.set_limit(LimitSpec("merchant", concurrency=5))
    pg.set_limit(LimitSpec("other", concurrency=5, rate="100/s" if kind == "rate" else None))
    name, group = ("flaky", None) if kind == "breaker" else ("t", "g" if kind == "group" else None)
    if kind == "breaker":
        pg.set_breaker("flaky", brk.BreakerConfig())
        pg.force_breaker("flaky", brk.BreakerState.OPEN, "test")
    (blocked,) = [r.id for r in pg.submit([task(key("a", "other"), name=name, group=group)])]
    behind = [r.id for r in pg.submit([task(key(f"b{i}")) for i in range(3)])]
    with pg._pool.connection() as conn:
        if kind == "paused_until":
            conn.execute("UPDATE corral_limits SET paused_until = extract(epoch FROM now()) + 60 WHERE name = 'other'")
        if kind in ("key_rate", "key_paused"):
            column = "rate = '1/s'" if kind == "key_rate" else "paused_until = extract(epoch FROM now()) + 60"
            conn.execute("INSERT INTO corral_limit_keys (name) VALUES (%s)", (key("a", "other"),))
            conn.execute(f"UPDATE corral_limit_keys SET {column}")
    rows, more = simple(pg, 4)
    assert rows == [] and more  # what comes first is the other path's, and so is the claim
    assert pg.get(blocked).status is State.PENDING
    # the other path takes the work behind it as before
    got = {t.id for c in pg.claim("w", ClaimRequest(("default",), 4)) for t in c.tasks}
    assert set(behind) <= got


def test_paused_limit_and_queue_are_passed_over(pg):
    pg.set_limit(LimitSpec("merchant", concurrency=5))
    pg.set_limit(LimitSpec("other", concurrency=5))
    pg.submit([task(key("a", "other")), task(key("a"), queue="stopped")])
    (free,) = [r.id for r in pg.submit([task(key("b"))])]
    pg.pause("limit", "other")
    pg.pause("queue", "stopped")
    rows, more = simple(pg, 5, ("default", "stopped"))
    assert [r["id"] for r in rows] == [free] and not more


def _claimer(url: str, n: int, out) -> None:
    """A process that claims keyed work until none is left, checking after
    each claim (holding it) how many tasks of each of its keys run."""
    store = open_store(url)
    worst = 0
    try:
        with psycopg.connect(url, autocommit=True) as db:
            idle = 0
            while idle < 20:
                got = store.claim(f"w{n}", ClaimRequest(("default",), 4))
                if not got:
                    idle += 1
                    store.wait_for_work(0.02)
                    continue
                idle = 0
                mine = sorted({t.limits[0] for c in got for t in c.tasks})
                running = db.execute(
                    "SELECT max(c) FROM (SELECT count(*) AS c FROM corral_tasks, unnest(limits) AS n"
                    " WHERE status = 'RUNNING' AND n = ANY(%s) GROUP BY n) x",
                    (mine,),
                ).fetchone()[0]
                worst = max(worst, running or 0)
                store.complete([Outcome(t.id, c.token, t.version, State.SUCCESS) for c in got for t in c.tasks])
    finally:
        store.close()
    out.put(worst)


def test_each_keys_cap_holds_with_three_processes_claiming_at_once(pg, pg_url):
    pg.set_limit(LimitSpec("merchant", concurrency=2, per_key=True))
    pg.submit([task(key(f"k{i % 4}")) for i in range(120)])
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(pg_url, i, out)) for i in range(3)]
    for p in procs:
        p.start()
    worst = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert pg.counts() == {"SUCCESS": 120}
    assert max(worst) <= 2 and max(worst) >= 1, worst


def _notified(pg_url: str, store, outcomes: list[Outcome]) -> list[str]:
    """The corral_work notifications a completion sends (a marker sent after
    it comes after them: notifications arrive in commit order)."""
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute("LISTEN corral_work")
        store.complete(outcomes)
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("NOTIFY corral_work, 'marker'")
        seen: list[str] = []

        def marker() -> bool:
            select.select([listener.fileno()], [], [], 0.05)
            seen.extend(n.payload for n in listener.notifies(timeout=0.01, stop_after=10))
            return "marker" in seen

        wait_for(marker, timeout=10)
        return [p for p in seen if p != "marker"]


def test_a_completion_wakes_the_workers_only_for_a_cap_that_was_full(pg, pg_url):
    pg.set_limit(LimitSpec("merchant", concurrency=2))
    pg.submit([task(key("a")) for _ in range(3)] + [task(key("b")) for _ in range(3)])
    got = pg.claim("w", ClaimRequest(("default",), 3))  # a: 2 of 2, b: 1 of 2
    by_key = {c.tasks[0].limits[0]: c for c in got}
    assert len(got) == 3 and set(by_key) == {key("a"), key("b")}
    b = by_key[key("b")]
    assert _notified(pg_url, pg, [Outcome(b.tasks[0].id, b.token, b.tasks[0].version, State.SUCCESS)]) == []
    a = next(c for c in got if c.tasks[0].limits[0] == key("a"))
    assert _notified(pg_url, pg, [Outcome(a.tasks[0].id, a.token, a.tasks[0].version, State.SUCCESS)]) == ["default:g"]


def test_plain_work_alone_goes_back_to_the_plain_claim_and_its_marks(pg):
    """The one-statement claim of work under caps reads from the start of the
    claim order (no mark). Once a claim of it took nothing limited, claims go
    back to the plain path, whose mark spares the dead index entries a pinned
    horizon leaves (they stayed on it for good: under a pinned horizon the
    claim-order index was read 7 800 entries a scan instead of about 600)."""
    pg.submit([NewTask(name="t", args="[]") for _ in range(50)])
    assert pg.claim("w", ClaimRequest(["default"], 5))
    assert pg._limited_hint is False
