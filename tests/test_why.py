"""Why a task waits, judged without a store (corral.core.why): one test per
kind of hold, the order of the reasons, and ready when nothing holds it."""

from __future__ import annotations

from corral.core import breaker as brk
from corral.core.gates import BreakerRow, Gates, LimitState, keyed_name
from corral.core.levels import Level
from corral.core.model import EXPIRED, LimitSpec, TaskRecord, WorkerInfo
from corral.core.pauses import Pause
from corral.core.states import State
from corral.core.why import CHECKS, Reason, Snapshot, span, why

NOW = 1_000_000.0


def task(tid: int = 10, **kw) -> TaskRecord:
    kw.setdefault("status", State.PENDING)
    kw.setdefault("run_at", NOW - 1)
    kw.setdefault("created_at", NOW - 5)
    return TaskRecord(id=tid, name=kw.pop("name", "sync"), args="{}", **kw)


def worker(wid: str = "vm-1:42:abc", queues=("default",), beat_at: float = NOW - 1) -> WorkerInfo:
    return WorkerInfo(wid, "vm-1", 42, tuple(queues), 4, 1, "1.0", 5.0, NOW - 100, beat_at)


def snap(**kw) -> Snapshot:
    kw.setdefault("workers", [worker()])
    return Snapshot(NOW, **kw)


def gates(limits=(), usage=None, breakers=()) -> Gates:
    return Gates(NOW, {lim.spec.name: lim for lim in limits}, dict(usage or {}), {b.name: b for b in breakers})


def kinds(reasons: list[Reason]) -> list[str]:
    return [r.kind for r in reasons]


def test_nothing_holds_it_ready():
    (r,) = why(task(), snap(gates=gates()))
    assert (r.kind, r.text) == ("ready", "ready: next to be claimed")


def test_behind_a_head_held_by_a_dead_worker_names_the_head_the_worker_and_the_lease():
    head = task(7, name="charge", status=State.RUNNING, group="acct-1", worker_id="vm-1:42:abc")
    head.started_at, head.lease_expires_at = NOW - 40, NOW - 3  # its worker stopped renewing
    t = task(group="acct-1")
    (r,) = why(t, snap(heads={"acct-1": head}))
    assert r.kind == "group"
    assert "task 7 (charge), RUNNING on worker vm-1:42:abc (dead: lease lost 3.0 s ago" in r.text
    assert (r.fields["head_id"], r.fields["worker_alive"], r.fields["lease_expires_at"]) == (7, False, NOW - 3)


def test_behind_a_head_of_a_silent_worker_and_of_a_live_one():
    head = task(7, status=State.RUNNING, group="g", worker_id="w", lease_expires_at=NOW + 20)
    silent = why(task(group="g"), snap(heads={"g": head}, workers=[worker("w", beat_at=NOW - 60), worker()]))
    assert "dead: silent for 60 s, lease expires in 20 s" in silent[0].text
    alive = why(task(group="g"), snap(heads={"g": head}, workers=[worker("w")]))
    assert "(alive, lease expires in 20 s)" in alive[0].text and alive[0].fields["worker_alive"] is True


def test_behind_a_failed_head_that_halts_its_group():
    head = task(3, status=State.FAILED, group="g", halt_group_on_failure=True, error="boom\nline 2")
    (r,) = why(task(group="g"), snap(heads={"g": head}))
    assert r.text.endswith("FAILED, which halts the group: retry or cancel it") and r.fields["error"] == "boom"


def test_its_own_group_head_is_not_held_by_its_group():
    t = task(group="g")
    assert kinds(why(t, snap(heads={"g": t}))) == ["ready"]


def test_a_full_limit_and_a_full_key():
    lim = LimitState(LimitSpec("partner", concurrency=2))
    (r,) = why(task(limits=("partner",)), snap(gates=gates([lim], {"partner": 2})))
    assert (r.kind, r.text, r.fields["used"], r.fields["of"]) == ("limit", "limit 'partner' full: 2 of 2 running", 2, 2)
    merchant = LimitState(LimitSpec("merchant", concurrency=1))
    gate = keyed_name("merchant", "m-7")
    (r,) = why(task(limits=(gate,)), snap(gates=gates([merchant], {gate: 1, "partner": 0})))
    assert r.text == "limit 'merchant' for key 'm-7' full: 1 of 1 running" and r.fields["key"] == "m-7"
    # another key's budget is its own
    assert kinds(why(task(limits=(keyed_name("merchant", "m-8"),)), snap(gates=gates([merchant], {gate: 1})))) == [
        "ready"
    ]


def test_a_rate_names_when_the_next_start_is_allowed():
    lim = LimitState(LimitSpec("api", rate="10/s", burst=1), tokens=0.0, counted_at=NOW - 0.07)
    (r,) = why(task(limits=("api",)), snap(gates=gates([lim])))
    assert r.kind == "rate" and r.text == "rate 10/s of limit 'api': next start allowed in 0.0 s"
    assert abs(r.fields["next_at"] - (NOW + 0.03)) < 1e-6


def test_a_limit_paused_by_retry_after():
    lim = LimitState(LimitSpec("api", paused_until=NOW + 12))
    (r,) = why(task(limits=("api",)), snap(gates=gates([lim])))
    assert (r.kind, r.fields["until"]) == ("paused", NOW + 12) and "for 12 s more" in r.text


def test_a_breaker_open_half_open_and_held_open_by_hand():
    cfg = brk.BreakerConfig(cooldown=30, probes=2)
    opened = BreakerRow("sync", cfg, brk.Breaker(brk.BreakerState.OPEN, opened_at=NOW - 18, cooldown=30))
    (r,) = why(task(), snap(gates=gates(breakers=[opened])))
    assert (r.kind, r.text, r.fields["probe_at"]) == ("breaker", "breaker 'sync' open, probe in 12 s", NOW + 12)
    probing = BreakerRow("sync", cfg, brk.Breaker(brk.BreakerState.HALF_OPEN, probes_issued=2))
    assert "its 2 probe(s) are out" in why(task(), snap(gates=gates(breakers=[probing])))[0].text
    forced = BreakerRow("sync", cfg, brk.Breaker(brk.BreakerState.OPEN, opened_at=NOW - 99, cooldown=30, forced=True))
    assert "held open by hand" in why(task(), snap(gates=gates(breakers=[forced])))[0].text
    # past its cooldown an open breaker lets a probe through: not held
    due = BreakerRow("sync", cfg, brk.Breaker(brk.BreakerState.OPEN, opened_at=NOW - 31, cooldown=30))
    assert kinds(why(task(), snap(gates=gates(breakers=[due])))) == ["ready"]


def test_the_level():
    assert kinds(why(task(), snap(level=int(Level.WARNING)))) == ["ready"]
    (r,) = why(task(), snap(level=int(Level.CIRCUIT_OPEN)))
    assert r.kind == "level" and "only retries are claimed" in r.text
    assert kinds(why(task(status=State.RETRYING), snap(level=int(Level.CIRCUIT_OPEN)))) == ["ready"]
    assert "nothing is claimed" in why(task(), snap(level=int(Level.EMERGENCY)))[0].text
    assert "marked critical" in why(task(), snap(level=int(Level.DEGRADED)))[0].text


def test_a_delay_a_debounce_window_and_a_retry_backoff():
    (r,) = why(task(run_at=NOW + 300), snap())
    assert (r.kind, r.text, r.fields["run_at"]) == ("delay", "scheduled for later: runs in 5 min", NOW + 300)
    (r,) = why(task(run_at=NOW + 4, debounce_key="shop-7"), snap())
    assert r.kind == "debounce" and "runs in 4.0 s unless another submit with key 'shop-7' moves it" in r.text
    retrying = task(status=State.RETRYING, run_at=NOW + 8, attempt=1, error="429 from downstream: retry after 8s")
    (r,) = why(retrying, snap())
    assert r.text == "retry in 8.0 s (after: 429 from downstream: retry after 8s)"


def test_a_dependency_names_the_upstream_tasks_not_done():
    t = task(status=State.WAITING, depends_on=(1, 2, 3))
    ups = [task(1, status=State.SUCCESS), task(2, name="fetch", status=State.RUNNING), task(3, status=State.PENDING)]
    (r,) = why(t, snap(upstream={t.id: ups}))
    assert r.kind == "dependency" and r.text == "waiting on task 2 (fetch, RUNNING), task 3 (sync, PENDING)"
    assert r.fields["on"] == [2, 3]


def test_no_live_worker_serves_its_queue():
    (r,) = why(task(queue="emails"), snap(workers=[worker(queues=("default",))]))
    assert r.kind == "no_worker" and r.text == "no live worker serves queue 'emails' (live workers serve 'default')"
    dead = why(task(), snap(workers=[worker(beat_at=NOW - 600)]))
    assert dead[0].text == "no live worker serves queue 'default' (no worker is alive)"
    assert kinds(why(task(), Snapshot(NOW))) == ["ready"]  # rows not known: nothing said


def test_reasons_in_order_the_main_one_first():
    lim = LimitState(LimitSpec("partner", concurrency=1))
    head = task(7, status=State.PENDING, group="g")
    t = task(group="g", limits=("partner",), run_at=NOW + 60, queue="q", expires_at=NOW + 90)
    pauses = [Pause("queue", "q", NOW - 30)]
    got = why(t, snap(gates=gates([lim], {"partner": 1}), heads={"g": head}, level=int(Level.EMERGENCY), pauses=pauses))
    assert kinds(got) == ["delay", "group", "no_worker", "level", "paused", "limit", "deadline"]
    assert CHECKS[-1].__name__ == "deadline"


def test_a_pause_by_hand_of_its_queue_group_or_limit_any_key_included():
    lim = LimitState(LimitSpec("partner", concurrency=1))
    full = gates([lim], {"partner": 1})
    t = task(queue="default", group="acct", limits=("partner", keyed_name("merchant", "k")))
    assert kinds(why(t, snap(gates=full))) == ["limit"]
    for kind, name in (("queue", "default"), ("group", "acct"), ("limit", "merchant")):
        got = why(t, snap(gates=full, pauses=[Pause(kind, name, NOW - 300, "ops@vm")]))
        assert kinds(got) == ["paused", "limit"]  # the claim skips paused work before any gate
        says = f"{kind} {name!r} paused by hand by ops@vm 5 min ago: nothing of it is claimed until resumed"
        assert got[0].text == says
        assert (got[0].fields["pause"], got[0].fields["name"]) == (kind, name)
    others = [Pause("queue", "other", NOW), Pause("group", "acct-2", NOW), Pause("limit", "partner2", NOW)]
    assert kinds(why(t, snap(gates=gates(), pauses=others))) == ["ready"]


def test_a_deadline_is_a_note_of_a_first_start_and_the_end_of_an_expired_task():
    got = why(task(expires_at=NOW + 12), snap(gates=gates()))
    assert kinds(got) == ["ready", "deadline"] and got[1].text.startswith("expires in 12 s")
    late = why(task(expires_at=NOW - 3), snap(gates=gates()))
    assert late[1].text.startswith("past its deadline by 3.0 s")
    assert kinds(why(task(expires_at=NOW + 12, attempt=1), snap())) == ["ready"]  # binds the first start only
    assert kinds(why(task(expires_at=NOW + 12, snoozes=1), snap())) == ["ready"]
    ended = task(status=State.CANCELED, error=EXPIRED, expires_at=NOW - 10, finished_at=NOW - 8)
    (r,) = why(ended, snap())
    assert r.text == "not waiting: it ended CANCELED, expired: not started by its deadline, 2.0 s after it"
    assert r.fields["expired"] is True
    assert why(task(status=State.CANCELED, error="by hand"), snap())[0].text == "not waiting: it ended CANCELED"


def test_held_tasks_name_their_worker_and_what_they_wait_for():
    lease = {"worker_id": "vm-1:42:abc", "lease_token": "L", "lease_expires_at": NOW + 9}
    head = task(5, status=State.RUNNING, group="g", **lease)
    member = task(6, status=State.RESERVED, group="g", **lease)
    (r,) = why(member, snap(heads={"g": head}))
    assert r.kind == "held" and "next in its chunk, behind task 5" in r.text and "(alive, lease expires" in r.text
    prefetched = task(8, status=State.RESERVED, worker_id="vm-1:42:abc", lease_token="M", lease_expires_at=NOW + 9)
    assert why(prefetched, snap())[0].text.endswith("waiting for a free slot there")
    assert why(head, snap())[0].kind == "running"
    assert why(task(status=State.SUCCESS), snap())[0].text == "not waiting: it ended SUCCESS"


def test_one_more_check_is_one_more_function():
    def paused_queue(t, s):
        if t.queue == "emails":
            yield Reason("paused", "queue 'emails' paused")

    got = why(task(queue="emails"), snap(workers=None), checks=(*CHECKS, paused_queue))
    assert kinds(got) == ["paused"]


def test_spans_read_as_an_operator_reads_them():
    assert [span(s) for s in (0.34, 12.4, 300, 9000, 3 * 86400)] == ["0.3 s", "12 s", "5 min", "2.5 h", "3 d"]


def test_no_live_worker_registers_its_name_when_every_one_serving_its_queue_says_so():
    a, b = worker("a"), worker("b")
    says = {"a": frozenset({"default:sync"}), "b": frozenset({"default:sync", "default:other"})}
    (r,) = why(task(), snap(workers=[a, b], unregistered=says))
    assert r.text == "no live worker registers task name 'sync' (the 2 serving queue 'default' do not)"
    # one of them runs it (or has not said): not held
    assert kinds(why(task(), snap(workers=[a, b], unregistered={"a": says["a"]}))) == ["ready"]
    assert kinds(why(task(name="other"), snap(workers=[a, b], unregistered=says))) == ["ready"]
