"""A model-based test of the state machine and the store, on every store.

Hypothesis drives random submits (groups, dependencies, halting heads),
claims (chunks), heartbeats, recorded starts of chunk members, outcomes (success, failure with and without
retries left, timeout, hand-back, stale writes), cancels, operator retries,
sweeps and clock moves, and after every step compares each task with a small
model: its status and attempts (RESERVED while held and not started), at
most one unit of a group in flight and one task of a group RUNNING, group
heads only, versions increasing, nothing lost.

Time moves in steps of 10 s while every threshold (lease 25 s, timeout 43 s,
backoff 5 s, stale pending 127.5 s) sits between steps, so PostgreSQL (whose
clock keeps running while the rows' times are shifted back) decides the same
way as the fake clock of memory and SQLite.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from conformance.conftest import PG_SHIFT  # every stored time, shifted back to move time forward
from corral.core.claims import ClaimRequest
from corral.core.clock import FakeClock
from corral.core.model import NewTask, Outcome, Start
from corral.core.states import ACTIVE, FINAL, QUEUED, State
from corral.maintenance.recovery import MAX_CRASH_RERUNS, sweep_once
from corral.stores import open_store
from helpers import ARGS

LEASE = 25.0
TIMEOUT = 43.0
BACKOFF = 5.0
STALE = 127.5
GROUPS = (None, "a", "b")

pytestmark = pytest.mark.slow


@dataclass
class M:
    """The model of one task."""

    id: int
    group: str | None
    deps: tuple[int, ...]
    max_retries: int
    halt: bool
    timeout: float | None
    status: State = State.PENDING
    attempt: int = 0
    run_at: float = 0.0
    started: bool = False  # the store knows this run started (claim's first member, or recorded)
    started_at: float | None = None
    token: str | None = None
    lease_exp: float = 0.0
    cancel: bool = False
    policy: str = "cancel"  # on_upstream_failure
    version: int = 0
    crashes: int = 0  # runs lost with a lease that expired after their start


@dataclass
class Unit:
    token: str
    tasks: list[int]
    versions: dict[int, int]
    done: int = 0  # members completed (in order)
    first_started: bool = True
    attempts: dict[int, int] = field(default_factory=dict)


class StoreModel(RuleBasedStateMachine):
    """Subclassed per store kind with ``open``/``advance_store`` set."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = self.open_store(self.clock)
        self.t = 0.0
        self.tasks: dict[int, M] = {}
        self.units: list[Unit] = []
        self.group_claimed: dict[str, float] = {}  # when each group was last claimed

    # ---- wiring, set by the test -------------------------------------------------
    def open_store(self, clock):  # pragma: no cover - replaced
        raise NotImplementedError

    def advance_store(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def teardown(self) -> None:
        self.store.close()

    # ---- model rules -------------------------------------------------------------------
    def occupies(self, m: M) -> bool:
        return m.status in ACTIVE or (m.status is State.FAILED and m.halt)

    def is_head(self, m: M) -> bool:
        return m.group is None or not any(
            o.group == m.group and o.id < m.id and self.occupies(o) for o in self.tasks.values()
        )

    def group_running(self, group: str | None) -> bool:
        return group is not None and any(o.group == group and o.status is State.RUNNING for o in self.tasks.values())

    def idle_head(self, m: M) -> bool:
        """Stale only if not waiting its turn: ungrouped, or its group's head with
        nothing of the group running and no claim of the group within STALE."""
        return m.group is None or (
            self.is_head(m)
            and not self.group_running(m.group)
            and self.group_claimed.get(m.group, float("-inf")) < self.t - STALE
        )

    def claimable(self, m: M) -> bool:
        return m.status in QUEUED and m.run_at <= self.t and self.is_head(m) and not self.group_running(m.group)

    def set_status(self, m: M, status: State) -> None:
        m.status = status
        if status is not State.RUNNING:
            m.token = None
        if status in FINAL:
            self.finish_effects(m)

    def finish_effects(self, m: M) -> None:
        for d in sorted(self.tasks.values(), key=lambda x: x.id):
            if m.id not in d.deps or d.status is not State.WAITING:
                continue
            if m.status is not State.SUCCESS and d.policy == "cancel":
                self.set_status(d, State.CANCELED)
            elif all(self.tasks[x].status is State.SUCCESS for x in d.deps) or (
                d.policy == "run" and all(self.tasks[x].status in FINAL for x in d.deps)
            ):
                d.status = State.PENDING  # keeps its submit time as run_at

    # ---- steps ---------------------------------------------------------------------------
    @rule(
        specs=st.lists(
            st.tuples(
                st.sampled_from(GROUPS),
                st.integers(0, 2),
                st.booleans(),
                st.sampled_from([None, TIMEOUT]),
                st.integers(0, 2),
                st.sampled_from(["cancel", "run"]),
            ),
            min_size=1,
            max_size=4,
        ),
        data=st.data(),
    )
    def submit(self, specs, data) -> None:
        batch = []
        for group, retries, halt, timeout, ndeps, policy in specs:
            deps: tuple[int, ...] = ()
            if self.tasks and ndeps:
                picked = data.draw(st.lists(st.sampled_from(sorted(self.tasks)), max_size=ndeps, unique=True))
                deps = tuple(sorted(picked))
            halt = halt and group is not None and retries == 0
            batch.append(
                NewTask(
                    "t",
                    ARGS,
                    group=group,
                    max_retries=retries,
                    halt_group_on_failure=halt,
                    timeout=timeout,
                    depends_on=deps,
                    on_upstream_failure=policy,
                )
            )
        results = self.store.submit(batch)
        assert all(r.created for r in results)
        ids = [r.id for r in results]
        assert ids == sorted(ids) and (not self.tasks or ids[0] > max(self.tasks)), "ids increase with submit"
        for r, nt in zip(results, batch):
            m = M(r.id, nt.group, nt.depends_on, nt.max_retries, nt.halt_group_on_failure, nt.timeout, run_at=self.t)
            m.policy = nt.on_upstream_failure
            dep_states = [self.tasks[d].status for d in nt.depends_on]
            if nt.on_upstream_failure == "cancel" and any(s in FINAL and s is not State.SUCCESS for s in dep_states):
                m.status = State.CANCELED
            elif all(s is State.SUCCESS for s in dep_states) or (
                nt.on_upstream_failure == "run" and all(s in FINAL for s in dep_states)
            ):
                m.status = State.PENDING
            else:
                m.status = State.WAITING
            self.tasks[r.id] = m

    @rule(max_units=st.integers(1, 3), chunk=st.integers(1, 3))
    def claim(self, max_units, chunk) -> None:
        before = {i: self.claimable(m) for i, m in self.tasks.items()}
        claims = self.store.claim("w", ClaimRequest(["default"], max_units, chunk_size=chunk, lease_seconds=LEASE))
        assert len(claims) <= max_units
        for c in claims:
            head = self.tasks[c.tasks[0].id]
            assert before[head.id], f"claimed task {head.id} ({head.status}) was not a claimable head"
            assert len(c.tasks) <= chunk
            if head.group is None:
                assert len(c.tasks) == 1
            expected = [head.id]
            if head.group is not None:
                later = sorted(
                    (o for o in self.tasks.values() if o.group == head.group and o.id > head.id and self.occupies(o)),
                    key=lambda o: o.id,
                )
                for o in later:
                    if len(expected) >= chunk or o.status not in QUEUED or o.run_at > self.t:
                        break
                    expected.append(o.id)
            # the head, then the ready tasks of its group in order, passing over tasks
            # that ended (they no longer hold a place) and stopping at the first that
            # holds a place but is not ready
            got = [t.id for t in c.tasks]
            assert got == expected, f"chunk of group {head.group}: {got}, ready in order {expected}"
            for i, rec in enumerate(c.tasks):
                m = self.tasks[rec.id]
                assert rec.version > m.version
                m.version = rec.version
                m.status = State.RUNNING
                m.token = c.token
                m.lease_exp = self.t + LEASE
                if i == 0:
                    m.attempt += 1
                    m.started = True
                    m.started_at = self.t
                else:
                    m.started = False
                    m.started_at = None
                assert rec.attempt == m.attempt
            if head.group is not None:
                self.group_claimed[head.group] = self.t
            self.units.append(Unit(c.token, [t.id for t in c.tasks], {t.id: t.version for t in c.tasks}))

    def live_units(self) -> list[Unit]:
        return [u for u in self.units if u.done < len(u.tasks)]

    @precondition(lambda self: self.live_units())
    @rule(data=st.data())
    def heartbeat(self, data) -> None:
        unit = data.draw(st.sampled_from(self.live_units()))
        reply = self.store.heartbeat([unit.token], LEASE)
        held = [self.tasks[i] for i in unit.tasks if self.tasks[i].token == unit.token]
        if held:
            assert unit.token not in reply.lost_tokens
            for m in held:
                m.lease_exp = self.t + LEASE
            assert reply.cancel_requested == {m.id for m in held if m.cancel}
        else:
            assert unit.token in reply.lost_tokens

    @precondition(lambda self: self.live_units())
    @rule(data=st.data(), kind=st.sampled_from(["success", "fail", "retryable", "timeout", "hand_back"]))
    def complete(self, data, kind) -> None:
        unit = data.draw(st.sampled_from(self.live_units()))
        idx = unit.done
        tid = unit.tasks[idx]
        m = self.tasks[tid]
        held = m.token == unit.token and m.status is State.RUNNING
        first = idx == 0
        # what the engine sends: a chunk member records its start with its
        # outcome (its attempt, raised once whether or not its start was recorded)
        attempt = None if first else m.attempt if m.started and held else m.attempt + 1
        started_at = None if first else self.store.now()
        if kind == "hand_back":
            outcomes = []
            for j, i in enumerate(unit.tasks[idx:], start=idx):
                o = self.tasks[i]
                outcomes.append(
                    Outcome(
                        i, unit.token, unit.versions[i], State.PENDING, attempt=o.attempt - 1 if j == 0 else o.attempt
                    )
                )
            applied = self.store.complete(outcomes)
            for j, (i, ok) in enumerate(zip(unit.tasks[idx:], applied), start=idx):
                o = self.tasks[i]
                mine = o.token == unit.token and o.status is State.RUNNING
                assert ok == mine, f"hand-back of {i}: applied={ok}, model holds={mine}"
                if mine:
                    o.attempt = o.attempt - 1 if j == 0 else o.attempt
                    o.run_at = self.t
                    self.set_status(o, State.PENDING)
            unit.done = len(unit.tasks)
            return
        run_attempt = m.attempt if first or (m.started and held) else m.attempt + 1
        retries_left = run_attempt <= m.max_retries
        status, run_at = {
            "success": (State.SUCCESS, None),
            "fail": (State.FAILED, None),
            "retryable": (State.RETRYING, BACKOFF) if retries_left else (State.FAILED, None),
            "timeout": (State.RETRYING, BACKOFF) if retries_left else (State.TIMEOUT, None),
        }[kind]
        out = Outcome(
            tid,
            unit.token,
            unit.versions[tid],
            status,
            result="1" if status is State.SUCCESS else None,
            error=None if status is State.SUCCESS else kind,
            run_at=None if run_at is None else self.store.now() + run_at,
            attempt=attempt,
            started_at=started_at,
        )
        (ok,) = self.store.complete([out])
        assert ok == held, f"outcome of {tid}: applied={ok}, model holds the lease={held}"
        unit.done += 1
        if not ok:
            unit.done = len(unit.tasks)  # the worker saw its lease lost: it starts nothing more
            return
        m.attempt = run_attempt
        if not first and not m.started:
            m.started = True
            m.started_at = self.t
        if status is State.RETRYING:
            m.run_at = self.t + BACKOFF
        self.set_status(m, status)

    @precondition(lambda self: self.live_units())
    @rule(data=st.data())
    def start(self, data) -> None:
        """The worker records the start of the member it runs now (the unit's next)."""
        unit = data.draw(st.sampled_from(self.live_units()))
        m = self.tasks[unit.tasks[unit.done]]
        mine = m.token == unit.token and m.status is State.RUNNING and not m.started
        applied = self.store.record_starts([Start(m.id, unit.token, m.attempt + (0 if m.started else 1), self.t)])
        assert applied == (1 if mine else 0), f"start of {m.id}: applied={applied}, model holds it unstarted={mine}"
        if mine:
            m.attempt += 1
            m.started = True
            m.started_at = self.t

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def cancel(self, data) -> None:
        tid = data.draw(st.sampled_from(sorted(self.tasks)))
        m = self.tasks[tid]
        rec = self.store.cancel(tid)
        assert rec is not None
        if m.status is State.RUNNING:
            m.cancel = True
            assert rec.cancel_requested and rec.status in (State.RUNNING, State.RESERVED)
        elif m.status in (State.WAITING, State.PENDING, State.RETRYING):
            self.set_status(m, State.CANCELED)
        assert rec.status is self.shown(m)

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def retry(self, data) -> None:
        tid = data.draw(st.sampled_from(sorted(self.tasks)))
        m = self.tasks[tid]
        ok = self.store.retry(tid)
        expect = m.status in (State.FAILED, State.TIMEOUT, State.CANCELED)
        assert ok == expect
        if ok:
            m.attempt = 0
            m.crashes = 0
            m.run_at = self.t
            m.cancel = False
            m.status = State.PENDING

    @rule()
    def sweep(self) -> None:
        expected: dict[str, list[int]] = {
            "lost_leases_retried": [],
            "lost_leases_failed": [],
            "overdue_failed": [],
            "stale_pending_canceled": [],
            "exhausted_failed": [],
        }
        moves: list[tuple[M, State]] = []
        for m in sorted(self.tasks.values(), key=lambda x: x.id):
            if m.status is State.RUNNING and m.lease_exp < self.t:  # a live lease is its worker's
                if not m.started:
                    moves.append((m, State.PENDING))
                    expected["lost_leases_retried"].append(m.id)
                    continue
                # however long ago it started: the worker died, not the task
                if m.attempt > m.max_retries + 1:
                    moves.append((m, State.FAILED))
                    expected["exhausted_failed"].append(m.id)
                elif m.crashes < MAX_CRASH_RERUNS:  # a crash re-run: its attempt given back
                    moves.append((m, State.RETRYING))
                    expected["lost_leases_retried"].append(m.id)
                    m.attempt -= 1
                elif m.attempt <= m.max_retries:
                    moves.append((m, State.RETRYING))
                    expected["lost_leases_retried"].append(m.id)
                else:
                    moves.append((m, State.FAILED))
                    expected["lost_leases_failed"].append(m.id)
                m.crashes += 1
            elif m.status is State.PENDING and m.run_at < self.t - STALE and self.idle_head(m):
                moves.append((m, State.CANCELED))
                expected["stale_pending_canceled"].append(m.id)
        report = sweep_once(self.store, stale_pending_age=STALE)
        got = {f: getattr(report, f) for f in expected}
        assert got == expected
        for m, to in moves:
            if to in QUEUED:
                m.run_at = self.t
            self.set_status(m, to)

    @rule(seconds=st.sampled_from([10.0, 20.0, 50.0]))
    def advance(self, seconds) -> None:
        self.t += seconds
        self.advance_store(seconds)

    # ---- after every step ---------------------------------------------------------------
    @staticmethod
    def shown(m: M) -> State:
        """What a reader sees: a task held but not started is RESERVED."""
        return State.RESERVED if m.status is State.RUNNING and not m.started else m.status

    @invariant()
    def matches_the_model(self) -> None:
        counts = self.store.counts()
        assert sum(counts.values()) == len(self.tasks), "a task was lost or invented"
        shown = [self.shown(m) for m in self.tasks.values()]
        assert counts == {s.value: shown.count(s) for s in set(shown)}
        running: dict[str, set[str]] = {}
        started: dict[str, list[int]] = {}
        for tid, m in self.tasks.items():
            rec = self.store.get(tid)
            assert rec is not None, f"task {tid} lost"
            assert (rec.status, rec.attempt) == (self.shown(m), m.attempt), (
                f"task {tid}: store has {rec.status.value}/attempt {rec.attempt}, "
                f"model {self.shown(m).value}/attempt {m.attempt}"
            )
            assert rec.version >= m.version, f"task {tid}: version went back"
            m.version = rec.version
            if rec.status in (State.RUNNING, State.RESERVED):
                assert rec.lease_token == m.token
                if rec.group is not None:
                    running.setdefault(rec.group, set()).add(rec.lease_token)
                    if rec.status is State.RUNNING:
                        started.setdefault(rec.group, []).append(tid)
        for group, tokens in running.items():
            assert len(tokens) == 1, f"group {group}: {len(tokens)} units in flight"
        for group, ids in started.items():
            assert len(ids) == 1, f"group {group}: tasks {ids} RUNNING at once"


@pytest.mark.parametrize(
    "kind, examples",
    [("memory", 50), ("sqlite", 15), pytest.param("postgres", 15, marks=pytest.mark.postgres)],
)
def test_store_follows_the_model(kind, examples, request, tmp_path):
    counter = itertools.count()
    if kind == "postgres":
        request.getfixturevalue("pg_url")
        reset = request.getfixturevalue("pg_reset")  # each example on an emptied database

    class Machine(StoreModel):
        def open_store(self, clock):
            if kind == "memory":
                s = open_store("memory://", clock=clock)
            elif kind == "sqlite":
                s = open_store(f"sqlite:///{tmp_path}/model-{next(counter)}.db", clock=clock)
            else:
                s = open_store(reset())
            s.migrate()
            return s

        def advance_store(self, seconds):
            if kind != "postgres":
                self.clock.advance(seconds)
                return
            import psycopg

            with psycopg.connect(self.store.url) as conn, conn.transaction():
                for statement in PG_SHIFT:
                    conn.execute(statement, {"s": seconds})

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=30,
            deadline=None,
            phases=[Phase.generate],
            database=None,
            derandomize=True,  # the same examples every run: a failure reproduces
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
