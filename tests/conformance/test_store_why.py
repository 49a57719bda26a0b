"""Why a task waits, read from every store: the snapshot's reads (a group's
head, the gates as a claim reads them) and the reasons they give, and the
claim agreeing: what a claim takes is what ``why`` calls ready, and every
task it leaves has a reason."""

from __future__ import annotations

from corral.core import breaker as brk
from corral.core.claims import ClaimRequest
from corral.core.gates import keyed_name
from corral.core.model import LimitSpec, NewTask, WorkerInfo
from corral.core.states import State
from corral.edges.why import explain, explain_one

from .conftest import claim, finish, new, submit, submit_one

QUEUES = ("default", "other")


def alive(store, wid: str = "w1", queues=QUEUES) -> None:
    store.report_worker(WorkerInfo(wid, "vm-1", 42, tuple(queues), 8, 0, "1.0", 5.0))


def main_reason(store, tid: int):
    return explain_one(store, store.get(tid))[0]


def test_line_head_is_the_smallest_id_still_in_the_line(store):
    a, b, c = submit(store, new("a", "g"), new("b", "g"), new("c", "g"))
    assert store.line_head("g").id == a and store.line_head("none") is None
    (unit,) = claim(store)
    assert store.line_head("g").status is State.RUNNING
    finish(store, unit.tasks[0])
    assert store.line_head("g").id == b
    store.cancel(b)
    assert store.line_head("g").id == c


def test_behind_a_head_held_by_a_dead_worker(store, advance):
    alive(store, "w-gone")
    alive(store, "w-live")
    head, behind = submit(store, new("charge", "acct-1"), new("charge", "acct-1"))
    store.claim("w-gone", ClaimRequest(QUEUES, 1, lease_seconds=30))
    r = main_reason(store, behind)
    assert r.kind == "group" and r.fields["head_id"] == head and r.fields["worker_alive"] is True
    advance(40)  # w-gone neither reports nor renews; w-live does
    alive(store, "w-live")
    r = main_reason(store, behind)
    assert (r.kind, r.fields["worker"], r.fields["worker_alive"]) == ("group", "w-gone", False)
    assert f"task {head} (charge), RUNNING on worker w-gone (dead: lease lost" in r.text


def test_a_keyed_limit_full_for_its_key(store):
    alive(store)
    store.set_limit(LimitSpec("merchant", concurrency=1))
    a1, a2, b1 = submit(
        store,
        new(limits=(keyed_name("merchant", "a"),)),
        new(limits=(keyed_name("merchant", "a"),)),
        new(name="other", limits=(keyed_name("merchant", "b"),)),
    )
    store.claim("w1", ClaimRequest(QUEUES, 1, names=frozenset({"t"})))
    got = explain(store, [store.get(a2), store.get(b1)])
    assert got[a2][0].text == "limit 'merchant' for key 'a' full: 1 of 1 running"
    assert got[b1][0].kind == "ready"


def test_a_rate_says_when_the_next_start_comes(store, advance):
    alive(store)
    store.set_limit(LimitSpec("api", rate="1/m", burst=1))
    first, second = submit(store, new(limits=("api",)), new(limits=("api",)))
    assert [t.id for c in claim(store, 5) for t in c.tasks] == [first]
    r = main_reason(store, second)
    assert r.kind == "rate" and r.text.startswith("rate 1/m of limit 'api': next start allowed in")
    assert 50 < r.fields["next_at"] - store.now() <= 60
    advance(61)
    alive(store)
    assert main_reason(store, second).kind == "ready"


def test_a_breaker_open_by_hand_then_closed(store):
    alive(store)
    store.set_breaker("call_partner", brk.BreakerConfig(cooldown=30))
    tid = submit_one(store, "call_partner")
    store.force_breaker("call_partner", brk.BreakerState.OPEN, "partner down")
    r = main_reason(store, tid)
    assert (r.kind, r.fields["state"]) == ("breaker", "OPEN") and "held open by hand" in r.text
    store.force_breaker("call_partner", brk.BreakerState.CLOSED, "back")
    assert main_reason(store, tid).kind == "ready"


def test_a_delay_and_a_dependency(store, advance):
    alive(store)
    later = submit_one(store, run_at=store.now() + 120)
    up = submit_one(store, "fetch")
    down = submit_one(store, "load", depends_on=(up,))
    r = main_reason(store, later)
    assert r.kind == "delay" and "runs in" in r.text
    r = main_reason(store, down)
    assert (r.kind, r.text, r.fields["on"]) == ("dependency", f"waiting on task {up} (fetch, PENDING)", [up])


def test_a_debounced_task_says_its_window(store):
    alive(store)
    tid = store.submit([NewTask("reindex", "{}", debounce_key="shop-7", debounce=5.0)])[0].id
    r = main_reason(store, tid)
    assert r.kind == "debounce" and r.fields["debounce_key"] == "shop-7"


def test_the_claim_takes_what_why_calls_ready_and_leaves_what_it_explains(store, advance):
    """Each kind of hold beside a task it does not hold, over every store; no
    two ready tasks compete for one place, so a claim of everything takes
    exactly the ready ones."""
    alive(store)
    store.set_limit(LimitSpec("full", concurrency=1))
    store.set_limit(LimitSpec("roomy", concurrency=5))
    store.set_limit(LimitSpec("merchant", concurrency=1))
    store.set_limit(LimitSpec("api", rate="1/m", burst=1))
    store.set_breaker("flaky", brk.BreakerConfig(cooldown=30))
    store.force_breaker("flaky", brk.BreakerState.OPEN, "down")
    store.set_limit(LimitSpec("partner", concurrency=5))
    store.pause("queue", "other", "ops")
    store.pause("group", "g3", "ops")
    store.pause("limit", "partner", "ops")
    submit(
        store,
        new("holder", limits=("full",)),
        new("holder", limits=(keyed_name("merchant", "a"),)),
        new("holder", limits=("api",)),
        new("holder", "g1"),
    )
    assert len(store.claim("w1", ClaimRequest(QUEUES, 10, names=frozenset({"holder"})))) == 4
    up = submit_one(store, "up")
    expect = {
        submit_one(store, "full_waits", limits=("full",)): "limit",
        submit_one(store, "roomy_runs", limits=("roomy",)): "ready",
        submit_one(store, "key_a_waits", limits=(keyed_name("merchant", "a"),)): "limit",
        submit_one(store, "key_b_runs", limits=(keyed_name("merchant", "b"),)): "ready",
        submit_one(store, "rate_waits", limits=("api",)): "rate",
        submit_one(store, "flaky"): "breaker",
        submit_one(store, "g1_waits", "g1"): "group",
        submit_one(store, "g2_head", "g2"): "ready",
        submit_one(store, "g2_waits", "g2"): "group",
        submit_one(store, "later", run_at=store.now() + 60): "delay",
        submit_one(store, "down", depends_on=(up,)): "dependency",
        submit_one(store, "nobody_serves", queue="nowhere"): "no_worker",
        submit_one(store, "plain"): "ready",
        submit_one(store, "queue_paused", queue="other"): "paused",
        submit_one(store, "queue_paused_and_full", queue="other", limits=("full",)): "paused",
        submit_one(store, "group_paused", "g3"): "paused",
        submit_one(store, "limit_paused", limits=("partner",)): "paused",
        submit_one(store, "limit_paused_key", limits=(keyed_name("partner", "x"),)): "paused",
        submit_one(store, "deadline_ready", expires_at=store.now() + 600): "ready",
        up: "ready",
    }
    queued = [store.get(tid) for tid in expect]
    reasons = explain(store, queued)
    assert {tid: reasons[tid][0].kind for tid in expect} == expect
    taken = {t.id for c in store.claim("w1", ClaimRequest(QUEUES, 100)) for t in c.tasks}
    assert taken == {tid for tid, kind in expect.items() if kind == "ready"}


def test_a_name_no_live_worker_of_its_queue_registers(store):
    from corral.core.model import dumps
    from corral.engine.heartbeat import HEALTH_EVENT

    alive(store, "w1")
    alive(store, "w2")
    tid = submit_one(store, "ghost")
    store.add_event(HEALTH_EVENT, "w1", dumps({"unregistered": {"default:ghost": 1}}))
    assert main_reason(store, tid).kind == "ready"  # w2 has not said it cannot run it
    store.add_event(HEALTH_EVENT, "w2", dumps({"unregistered": {"default:ghost": 1}}))
    r = main_reason(store, tid)
    assert (r.kind, r.fields["name"]) == ("no_worker", "ghost")


def test_a_pause_by_hand_outranks_a_full_limit_and_ends_with_the_resume(store):
    alive(store)
    store.set_limit(LimitSpec("full", concurrency=1))
    submit_one(store, "holder", limits=("full",))
    assert len(claim(store, 1)) == 1
    tid = submit_one(store, "waits", limits=("full",))
    assert main_reason(store, tid).kind == "limit"
    store.pause("queue", "default", "alice@ops")
    reasons = explain_one(store, store.get(tid))
    assert [r.kind for r in reasons] == ["paused", "limit"]
    assert (reasons[0].fields["pause"], reasons[0].fields["name"], reasons[0].fields["by"]) == (
        "queue",
        "default",
        "alice@ops",
    )
    assert reasons[0].text.startswith("queue 'default' paused by hand by alice@ops")
    store.resume("queue", "default", "alice@ops")
    assert main_reason(store, tid).kind == "limit"


def test_a_deadline_is_a_note_while_it_waits_and_the_end_when_it_expired(store, advance):
    from corral.maintenance.recovery import expire_queued

    alive(store)
    tid = submit_one(store, "send", expires_at=store.now() + 12)
    ready, note = explain_one(store, store.get(tid))
    assert (ready.kind, note.kind, note.fields["expires_at"]) == ("ready", "deadline", store.get(tid).expires_at)
    assert note.text.startswith("expires in 12 s")
    later = submit_one(store, "send", run_at=store.now() + 5, expires_at=store.now() + 12)
    assert [r.kind for r in explain_one(store, store.get(later))] == ["delay", "deadline"]
    advance(20)
    assert expire_queued(store).expired_canceled == [tid, later]
    (r,) = explain_one(store, store.get(tid))
    assert (r.kind, r.fields["expired"]) == ("final", True)
    assert r.text.startswith("not waiting: it ended CANCELED, expired: not started by its deadline")
