"""Why is a task waiting? What holds it, in one line. Pure.

:func:`why` reads one task against a :class:`Snapshot` of what can hold it
(its group's head, the limits' and breakers' rows as a claim reads them, the
fleet's level, the workers' presence rows, its upstream tasks) and returns
its reasons, the main one first; with nothing holding it, one reason:
``ready``. The gates are decided by :class:`~corral.core.gates.Gates`, the
claim's own, so a limit, rate or breaker named here is one the claim planner
stops at too.

Each rule is a small check, ``(task, snapshot) -> reasons``; :data:`CHECKS`
lists them in the order their reasons are shown, so one more kind of hold is
one more function in that list. A note (a deadline) is shown after the holds
and never hides ``ready``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core import breaker as brk
from corral.core.gates import Gates, split_key
from corral.core.levels import Level
from corral.core.model import EXPIRED, TaskRecord, WorkerInfo
from corral.core.pauses import Pause
from corral.core.states import FINAL, QUEUED, State
from corral.core.workers import worker_silence


@dataclass(frozen=True, slots=True)
class Reason:
    """One thing that holds a task (or ``ready``: nothing does).

    ``kind`` names the rule (``ready``, ``dependency``, ``delay``,
    ``debounce``, ``retry``, ``group``, ``no_worker``, ``level``, ``paused``,
    ``limit``, ``rate``, ``breaker``, ``held``, ``running``, ``final``, and
    the note ``deadline``);
    ``text`` is the line an operator reads; ``fields`` the same facts as
    values (ids, names, counts, times in the store's epoch seconds)."""

    kind: str
    text: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, **self.fields}


@dataclass(slots=True)
class Snapshot:
    """What holds tasks, read once (a page of tasks shares one).

    ``gates``: the limits' and breakers' rows and the places held, as a
    claim reads them (None: none read, so none named). ``workers``: the
    presence rows (None: not known, so "no worker" is never said).
    ``heads``: each group's head (the smallest id still in its line).
    ``upstream``: a WAITING task's upstream tasks, by its id.
    ``unregistered``: by worker id, the ``queue:name`` pairs of queued tasks
    its newest health report says it does not register (a worker with no
    report is taken to run them). ``pauses``: the pauses by hand in force.
    """

    now: float
    gates: Gates | None = None
    level: int = 0
    workers: Sequence[WorkerInfo] | None = None
    heads: Mapping[str, TaskRecord | None] = field(default_factory=dict)
    upstream: Mapping[int, Sequence[TaskRecord]] = field(default_factory=dict)
    unregistered: Mapping[str, frozenset[str]] = field(default_factory=dict)
    pauses: Sequence[Pause] = ()


# ---- words --------------------------------------------------------------------------------
def span(seconds: float) -> str:
    """``0.3 s``, ``12 s``, ``5 min``, ``2.5 h``, ``3 d``: a wait as an operator reads it."""
    s = max(0.0, float(seconds))
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} d"


def _gate_label(name: str) -> str:
    limit, key = split_key(name)
    return f"{limit!r} for key {key!r}" if key is not None else repr(limit)


def _first_line(text: str | None, n: int = 120) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= n else line[: n - 1] + "…"


# ---- workers ------------------------------------------------------------------------------
def holder(worker_id: str | None, lease_expires_at: float | None, s: Snapshot) -> tuple[str, dict[str, Any]]:
    """``on worker W (alive, lease expires in 25 s)`` for a held task, and the facts."""
    now = s.now
    facts: dict[str, Any] = {"worker": worker_id, "lease_expires_at": lease_expires_at, "worker_alive": None}
    rows = {w.id: w for w in s.workers or ()}
    row = rows.get(worker_id or "")
    if lease_expires_at is not None and lease_expires_at < now:
        state = f"dead: lease lost {span(now - lease_expires_at)} ago, the sweeper takes it back"
        facts["worker_alive"] = False
    elif row is not None and (quiet := worker_silence(row, now)) is not None:
        state = f"dead: silent for {span(quiet)}, lease expires in {span((lease_expires_at or now) - now)}"
        facts["worker_alive"] = False
    else:
        lease = f"lease expires in {span(lease_expires_at - now)}" if lease_expires_at is not None else "no lease"
        if row is not None:
            state = f"alive, {lease}"
            facts["worker_alive"] = True
        else:
            state = f"no report from it, {lease}" if s.workers is not None else lease
    return f"on worker {worker_id} ({state})", facts


# ---- the checks ---------------------------------------------------------------------------
Check = Callable[[TaskRecord, Snapshot], Iterable[Reason]]


def dependency(t: TaskRecord, s: Snapshot) -> Iterator[Reason]:
    """WAITING: the upstream tasks that have not ended as it needs."""
    if t.status is not State.WAITING:
        return
    ups = s.upstream.get(t.id)
    if ups is None:
        yield Reason("dependency", f"waiting on its {len(t.depends_on)} upstream task(s)", {"on": list(t.depends_on)})
        return
    needs_success = t.on_upstream_failure != "run"
    open_ = [u for u in ups if not (u.status is State.SUCCESS or (not needs_success and u.status in FINAL))]
    if not open_:
        open_ = list(ups)
    shown = ", ".join(f"task {u.id} ({u.name}, {u.status.value})" for u in open_[:3])
    more = f" and {len(open_) - 3} more" if len(open_) > 3 else ""
    yield Reason("dependency", f"waiting on {shown}{more}", {"on": [u.id for u in open_]})


def due(t: TaskRecord, s: Snapshot) -> Iterator[Reason]:
    """Queued for later: a debounce window, a retry's backoff (or a ``Retry``), a delay."""
    if t.status not in QUEUED or t.run_at <= s.now:
        return
    wait, at = span(t.run_at - s.now), {"run_at": t.run_at}
    if t.status is State.RETRYING:
        last = _first_line(t.error)
        after = f" (after: {last})" if last else ""
        yield Reason("retry", f"retry in {wait}{after}", {**at, "attempt": t.attempt, "error": last or None})
    elif t.debounce_key is not None:
        text = f"debounce window: runs in {wait} unless another submit with key {t.debounce_key!r} moves it"
        yield Reason("debounce", text, {**at, "debounce_key": t.debounce_key})
    else:
        yield Reason("delay", f"scheduled for later: runs in {wait}", at)


def group(t: TaskRecord, s: Snapshot) -> Iterator[Reason]:
    """Behind its group's head: one task of a group runs at a time, in order."""
    if t.group is None or t.status is State.RUNNING or t.status is State.RESERVED:
        return
    head = s.heads.get(t.group)
    if head is None or head.id == t.id:
        return
    facts: dict[str, Any] = {"group": t.group, "head_id": head.id, "head_name": head.name}
    facts["head_status"] = head.status.value
    lead = f"behind its group's head, task {head.id} ({head.name})"
    if head.status in (State.RUNNING, State.RESERVED):
        where, more = holder(head.worker_id, head.lease_expires_at, s)
        facts.update(more)
        text = f"{lead}, {head.status.value} {where}"
    elif head.status in FINAL:
        text = f"{lead}, {head.status.value}, which halts the group: retry or cancel it"
        facts["error"] = _first_line(head.error) or None
    elif head.status in QUEUED and head.run_at > s.now:
        text = f"{lead}, {head.status.value}, due in {span(head.run_at - s.now)}"
    else:
        text = f"{lead}, {head.status.value}"
    yield Reason("group", text, facts)


def no_worker(t: TaskRecord, s: Snapshot) -> Iterator[Reason]:
    """No live worker process serves the task's queue (from the presence
    rows), or every one that does says it does not register the task's name
    (from their health reports)."""
    if s.workers is None or t.status in FINAL:
        return
    alive = [w for w in s.workers if worker_silence(w, s.now) is None]
    serving = [w for w in alive if t.queue in w.queues]
    if serving:
        pair = f"{t.queue}:{t.name}"
        if all(pair in s.unregistered.get(w.id, ()) for w in serving):
            text = (
                f"no live worker registers task name {t.name!r} (the {len(serving)} serving queue {t.queue!r} do not)"
            )
            yield Reason("no_worker", text, {"queue": t.queue, "name": t.name, "alive_workers": len(alive)})
        return
    served = sorted({q for w in alive for q in w.queues})
    if not alive:
        text = f"no live worker serves queue {t.queue!r} (no worker is alive)"
    else:
        text = f"no live worker serves queue {t.queue!r} (live workers serve {', '.join(map(repr, served))})"
    yield Reason("no_worker", text, {"queue": t.queue, "served": served, "alive_workers": len(alive)})


def level(t: TaskRecord, s: Snapshot) -> Iterator[Reason]:
    """The fleet's degradation level (:mod:`corral.core.levels`): what workers claim at it."""
    lv = Level(s.level) if s.level in Level._value2member_map_ else None
    if lv is None or lv < Level.DEGRADED or t.status in FINAL:
        return
    facts = {"level": int(lv), "level_name": lv.name}
    if lv is Level.EMERGENCY:
        yield Reason("level", f"fleet level {lv}: nothing is claimed until an operator sets another level", facts)
    elif lv is Level.CIRCUIT_OPEN and t.status is not State.RETRYING:
        yield Reason("level", f"fleet level {lv}: only retries are claimed, fresh work waits", facts)
    elif lv is Level.DEGRADED:
        text = f"fleet level {lv}: only queues and task names marked critical are claimed"
        yield Reason("level", text, facts)


def paused(t: TaskRecord, s: Snapshot) -> Iterator[Reason]:
    """Its queue, its group or a limit it names, paused by hand: the claim
    skips such work before it looks at any gate (a paused limit pauses
    every key of a keyed one)."""
    if not s.pauses or t.status in FINAL:
        return
    bases = {split_key(n)[0] for n in t.limits}
    for p in s.pauses:
        if (p.kind, p.name) not in (("queue", t.queue), ("group", t.group)) and not (
            p.kind == "limit" and p.name in bases
        ):
            continue
        by = f" by {p.by}" if p.by else ""
        ago = span(s.now - p.paused_at)
        text = f"{p.kind} {p.name!r} paused by hand{by} {ago} ago: nothing of it is claimed until resumed"
        yield Reason("paused", text, {"pause": p.kind, "name": p.name, "paused_at": p.paused_at, "by": p.by})


def gates(t: TaskRecord, s: Snapshot) -> Iterator[Reason]:
    """Its limits, their rates and pauses, and breakers: every gate the claim finds shut."""
    g = s.gates
    if g is None or t.status in FINAL:
        return
    for name in g.names_of(t.limits, t.name):
        if g.room(name) > 0:
            continue
        found = list(_shut(g, name))
        yield from found or [Reason("limit", f"limit {_gate_label(name)} lets nothing start now", {"limit": name})]


def _shut(g: Gates, name: str) -> Iterator[Reason]:
    """What shuts the gate ``name`` (each that does)."""
    now, label = g.now, _gate_label(name)
    limit, key = split_key(name)
    lim = g.limit(name)
    base: dict[str, Any] = {"limit": limit, "key": key}
    if lim is not None:
        spec = lim.spec
        if spec.paused_until is not None and spec.paused_until > now:
            text = f"limit {label} paused by a downstream's Retry-After, for {span(spec.paused_until - now)} more"
            yield Reason("paused", text, {**base, "until": spec.paused_until})
        used = g.usage.get(name, 0)
        if spec.concurrency is not None and used >= spec.concurrency:
            yield Reason(
                "limit",
                f"limit {label} full: {used} of {spec.concurrency} running",
                {**base, "used": used, "of": spec.concurrency},
            )
        rate = lim.rate()
        if rate is not None and lim.room(rate, now) < 1:
            wait = lim.wait(rate, now)
            text = f"rate {spec.rate} of limit {label}: next start allowed in {span(wait)}"
            yield Reason("rate", text, {**base, "rate": spec.rate, "next_at": now + wait})
    row = g.breakers.get(name)
    if row is not None and brk.admit(row.state, row.config, now, 1)[0] < 1:
        b = row.state
        facts: dict[str, Any] = {"breaker": name, "state": b.state.value, "forced": b.forced}
        reopen = b.reopens_at()
        if b.forced:
            text = f"breaker {name!r} held open by hand: closed only by an operator"
        elif b.state is brk.BreakerState.OPEN and reopen is not None:
            text = f"breaker {name!r} open, probe in {span(reopen - now)}"
            facts["probe_at"] = reopen
        elif b.state is brk.BreakerState.HALF_OPEN:
            text = f"breaker {name!r} half-open: its {row.config.probes} probe(s) are out, waiting for their outcome"
        else:
            text = f"breaker {name!r} {b.state.value.lower()}"
        yield Reason("breaker", text, facts)


def deadline(t: TaskRecord, s: Snapshot) -> Iterator[Reason]:
    """A note, not a hold: the deadline of its first start (``expires=``),
    which binds only while it has never started nor asked to run later."""
    if t.expires_at is None or t.attempt or t.snoozes or t.status in FINAL:
        return
    facts = {"expires_at": t.expires_at}
    if t.expires_at > s.now:
        text = f"expires in {span(t.expires_at - s.now)}: ends CANCELED ({EXPIRED}) unless it starts by then"
    else:
        late = span(s.now - t.expires_at)
        text = f"past its deadline by {late}: ends CANCELED ({EXPIRED}) at the next claim or sweep"
    yield Reason("deadline", text, facts)


#: The checks of a task still to run, in the order their reasons are shown:
#: what the task itself waits for, then its group, then the fleet, then a
#: pause by hand and the gates (the claim skips paused work before it reads
#: a gate), then the notes.
CHECKS: tuple[Check, ...] = (dependency, due, group, no_worker, level, paused, gates, deadline)

#: Kinds of reasons that inform but do not hold a task: with only these, it is ready.
NOTES = frozenset({"deadline"})


def held(t: TaskRecord, s: Snapshot) -> Reason:
    """A RUNNING or RESERVED task: who holds it, and for a RESERVED one what it waits for."""
    where, facts = holder(t.worker_id, t.lease_expires_at, s)
    if t.status is State.RUNNING:
        return Reason("running", f"running {where}", facts)
    head = s.heads.get(t.group) if t.group is not None else None
    if head is not None and head.id != t.id and head.lease_token is not None and head.lease_token == t.lease_token:
        text = f"held {where}: next in its chunk, behind task {head.id} ({head.name}, {head.status.value})"
        return Reason("held", text, {**facts, "behind": head.id})
    return Reason("held", f"held {where}, waiting for a free slot there", facts)


def why(t: TaskRecord, s: Snapshot, checks: Sequence[Check] = CHECKS) -> list[Reason]:
    """What holds ``t``, the main reason first; ``[ready]`` when nothing does."""
    if t.status in FINAL:
        return [ended(t)]
    if t.status in (State.RUNNING, State.RESERVED):
        return [held(t, s)]
    out = [r for check in checks for r in check(t, s)]
    if all(r.kind in NOTES for r in out):
        out.insert(0, Reason("ready", "ready: next to be claimed", {}))
    return out


def ended(t: TaskRecord) -> Reason:
    """A task that ended: its state, and for one ended by its deadline, that."""
    facts: dict[str, Any] = {"status": t.status.value}
    if t.status is State.CANCELED and t.error == EXPIRED:
        facts.update(expired=True, expires_at=t.expires_at)
        late = ""
        if t.expires_at is not None and t.finished_at is not None and t.finished_at >= t.expires_at:
            late = f", {span(t.finished_at - t.expires_at)} after it"
        text = f"not waiting: it ended {t.status.value}, expired: not started by its deadline{late}"
        return Reason("final", text, facts)
    return Reason("final", f"not waiting: it ended {t.status.value}", facts)


__all__ = ["CHECKS", "NOTES", "Check", "Reason", "Snapshot", "holder", "span", "why"]
