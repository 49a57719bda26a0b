"""The claim planner alone (core/claims.py): heads, each gate, chunks,
prefetch, relays and the retry path decided over candidates given by hand,
no store. The conformance suite holds the stores to the same rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from corral.core.breaker import Breaker, BreakerConfig, BreakerState
from corral.core.claims import Candidate, ClaimPlanner, ClaimRequest
from corral.core.gates import BreakerRow, Gates, LimitState
from corral.core.model import LimitSpec

NOW = 1_000.0


def cand(
    tid: int,
    *,
    name: str = "t",
    queue: str = "default",
    group: str | None = None,
    limits: Sequence[str] = (),
    retrying: bool = False,
    due: bool = True,
    queued: bool = True,
) -> Candidate:
    return Candidate(tid, name, queue, group, frozenset(limits), retrying, due=due, queued=queued)


def breaker(name: str, state: BreakerState, *, probes: int = 2, issued: int = 0) -> BreakerRow:
    cfg = BreakerConfig(probes=probes, cooldown=30.0)
    return BreakerRow(name, cfg, Breaker(state=state, opened_at=NOW - 60.0, cooldown=30.0, probes_issued=issued))


class Planned:
    """A planner run the way a store runs it: shut_out while reading, then
    admits, reach, chunk and take for each head."""

    def __init__(
        self,
        request: ClaimRequest,
        heads: Sequence[Candidate],
        *,
        retries: Sequence[Candidate] | None = None,
        limits: Mapping[str, LimitSpec] = {},
        usage: Mapping[str, int] = {},
        breakers: Sequence[BreakerRow] = (),
        lines: Mapping[int, Sequence[Candidate]] = {},
        relay: frozenset[str] | None = None,
        dry: bool = False,
    ):
        self.limit_states = {n: LimitState(spec) for n, spec in limits.items()}
        rows = {b.name: b for b in breakers}
        self.read_lines: list[int] = []

        def gates() -> Gates:
            return Gates(NOW, self.limit_states, dict(usage), rows)

        closed = {n: row.state.state is BreakerState.CLOSED for n, row in rows.items()}
        self.plan = plan = ClaimPlanner(request, gates, closed, relay=relay, dry=dry)

        def ordered(cs: Sequence[Candidate]):
            return (c for c in cs if not plan.shut_out(c))

        def read_line(c: Candidate, far: int) -> list[Candidate]:
            self.read_lines.append(c.id)
            return list(lines.get(c.id, ()))[:far]

        def try_take(c: Candidate) -> bool:
            return plan.admits(c) and plan.try_head(c, read_line)

        plan.run(ordered(heads), None if retries is None else ordered(retries), try_take, lambda c: (c.id,))
        self.units = [[m.id for m in unit] for unit in plan.units]


def req(max_units: int = 10, **kw) -> ClaimRequest:
    return ClaimRequest(("default",), max_units, **kw)


# ---- the request -------------------------------------------------------------
def test_a_request_keeps_its_queues_sorted_and_names_as_a_set():
    r = ClaimRequest(["b", "a", "b"], 3, names=["x", "y"], tail=[2, 8])  # type: ignore[arg-type]
    assert r.queues == ("a", "b") and r.names == frozenset({"x", "y"}) and r.tail == (2, 8)
    assert r.units(5).max_units == 5 and r.units(5).queues == ("a", "b")
    with pytest.raises(AttributeError):
        r.max_units = 4  # type: ignore[misc]
    assert r.knows("x") and not r.knows("z") and ClaimRequest(("a",)).knows("z")


def test_a_request_turns_its_retry_share_into_bounds():
    assert req(10).retry_bounds() == (None, 10)
    assert req(10, retry_share=0.2).retry_bounds() == (2, 10)
    assert req(10, retry_share=0.2, retry_cap=0, retry_max=3).retry_bounds() == (0, 3)
    assert req(10, retry_share=0.2, only_retries=True).retry_bounds() == (None, 10)  # no fresh work to share with


# ---- heads -------------------------------------------------------------------
def test_heads_are_taken_in_the_order_read_up_to_max_units():
    p = Planned(req(2), [cand(3), cand(1), cand(2)])
    assert p.units == [[3], [1]]


def test_heads_of_unknown_names_or_fresh_work_under_only_retries_are_passed_over():
    p = Planned(req(names={"a"}), [cand(1, name="b"), cand(2, name="a")])
    assert p.units == [[2]]
    p = Planned(req(only_retries=True), [cand(1), cand(2, retrying=True)])
    assert p.units == [[2]]


def test_a_plain_claim_builds_no_gates():
    p = Planned(req(), [cand(1), cand(2, group="g")])
    assert p.units == [[1], [2]] and not p.plan.gated


# ---- gates -------------------------------------------------------------------
def test_a_concurrency_limit_takes_only_its_free_places():
    p = Planned(
        req(),
        [cand(i, limits=("api",)) for i in range(1, 6)] + [cand(9)],
        limits={"api": LimitSpec("api", 3)},
        usage={"api": 1},
    )
    assert p.units == [[1], [2], [9]] and p.plan.gated


def test_a_candidate_under_two_limits_needs_room_in_both():
    limits = {"a": LimitSpec("a", 5), "b": LimitSpec("b", 1)}
    p = Planned(req(), [cand(1, limits=("a", "b")), cand(2, limits=("a", "b")), cand(3, limits=("a",))], limits=limits)
    assert p.units == [[1], [3]]


def test_a_rate_charges_each_start_and_is_written_back():
    p = Planned(
        req(), [cand(i, limits=("api",)) for i in range(1, 6)], limits={"api": LimitSpec("api", rate="2/s", burst=2)}
    )
    assert p.units == [[1], [2]]
    gates = p.plan.gates
    assert gates is not None and set(gates.rate_writes()) == {"api"}


def test_a_paused_limit_lets_nothing_start_until_its_pause_ends():
    spec = LimitSpec("api", 10, paused_until=NOW + 4.0)
    p = Planned(req(), [cand(1, limits=("api",)), cand(2)], limits={"api": spec})
    assert p.units == [[2]]
    assert p.plan.gates is not None and p.plan.gates.wait == pytest.approx(4.0)


def test_an_open_breaker_on_a_name_holds_its_tasks():
    p = Planned(req(), [cand(1, name="push"), cand(2, name="other")], breakers=[breaker("push", BreakerState.OPEN)])
    # its cooldown is over: it turns half-open and lets its probes through
    assert p.units == [[1], [2]]
    forced = breaker("push", BreakerState.OPEN)
    forced.state = Breaker(state=BreakerState.OPEN, opened_at=NOW, cooldown=30.0)
    p = Planned(req(), [cand(1, name="push"), cand(2, name="other")], breakers=[forced])
    assert p.units == [[2]]


def test_a_half_open_breaker_lets_exactly_its_probes_through_and_writes_them():
    row = breaker("api", BreakerState.HALF_OPEN, probes=2)
    p = Planned(req(), [cand(i, limits=("api",)) for i in range(1, 5)], breakers=[row])
    assert p.units == [[1], [2]]
    gates = p.plan.gates
    assert gates is not None
    ((state, _),) = gates.breaker_writes().values()
    assert state.probes_issued == 2


def test_gates_shut_for_one_set_of_limits_are_not_asked_again():
    asked = []

    class Counting(Gates):
        def fits(self, limits, task_name):  # type: ignore[override]
            asked.append(task_name)
            return super().fits(limits, task_name)

    plan = ClaimPlanner(req(), lambda: Counting(NOW, {"api": LimitState(LimitSpec("api", 1))}, {"api": 1}, {}), {})
    assert all(plan.shut_out(cand(i, limits=("api",))) for i in range(1, 50))
    assert len(asked) == 1


# ---- chunks ------------------------------------------------------------------
def test_a_chunk_takes_the_groups_next_ready_tasks_of_its_queue():
    line = [cand(2, group="g"), cand(3, group="g"), cand(4, group="g", queue="other"), cand(5, group="g")]
    p = Planned(req(chunk_size=4), [cand(1, group="g")], lines={1: line})
    assert p.units == [[1, 2, 3]]


@pytest.mark.parametrize(
    "stop",
    [
        cand(3, group="g", due=False),
        cand(3, group="g", queued=False),
        cand(3, group="g", name="unknown"),
        cand(3, group="g", name="push"),  # a name under a breaker
        cand(3, group="g", limits=("api",)),  # a limit the head does not hold, full
    ],
)
def test_a_chunk_stops_at_the_first_task_that_may_not_go_with_it(stop):
    line = [cand(2, group="g"), stop, cand(4, group="g")]
    p = Planned(
        req(chunk_size=4, names={"t", "push"} | ({stop.name} if stop.name != "unknown" else set())),
        [cand(1, group="g")],
        lines={1: line},
        limits={"api": LimitSpec("api", 1)},
        usage={"api": 1},
        breakers=[breaker("push", BreakerState.CLOSED)],
    )
    assert p.units == [[1, 2]]


def test_a_chunk_stretches_a_quarter_to_take_a_groups_whole_line():
    line = [cand(i, group="g") for i in range(2, 6)]  # a line of 5 under chunks of 4: reach 5
    assert Planned(req(chunk_size=4), [cand(1, group="g")], lines={1: line}).units == [[1, 2, 3, 4, 5]]
    line = [cand(i, group="g") for i in range(2, 7)]  # 6: beyond the reach, a chunk of 4
    assert Planned(req(chunk_size=4), [cand(1, group="g")], lines={1: line}).units == [[1, 2, 3, 4]]


def test_near_the_end_a_short_line_takes_short_chunks_a_long_one_keeps_its_chunk():
    short = [cand(i, group="g") for i in range(2, 6)]  # 5 tasks, under long=8
    assert Planned(req(chunk_size=4, tail=(2, 8)), [cand(1, group="g")], lines={1: short}).units == [[1, 2]]
    long = [cand(i, group="g") for i in range(2, 12)]  # 11 tasks
    assert Planned(req(chunk_size=4, tail=(2, 8)), [cand(1, group="g")], lines={1: long}).units == [[1, 2, 3, 4]]


def test_a_unit_under_a_rate_or_a_probing_breaker_is_one_task_and_reads_no_line():
    line = [cand(2, group="g", limits=("api",))]
    p = Planned(
        req(chunk_size=4),
        [cand(1, group="g", limits=("api",))],
        lines={1: line},
        limits={"api": LimitSpec("api", rate="100/s")},
    )
    assert p.units == [[1]] and p.read_lines == []
    p = Planned(
        req(chunk_size=4),
        [cand(1, group="g", name="push")],
        lines={1: [cand(2, group="g")]},
        breakers=[breaker("push", BreakerState.HALF_OPEN)],
    )
    assert p.units == [[1]] and p.read_lines == []


def test_a_chunks_members_charge_their_own_limits_once_for_the_unit():
    limits = {"a": LimitSpec("a", 5), "b": LimitSpec("b", 1)}
    line = [cand(2, group="g", limits=("b",)), cand(3, group="g", limits=("b",))]
    p = Planned(
        req(chunk_size=4), [cand(1, group="g", limits=("a",)), cand(9, limits=("b",))], lines={1: line}, limits=limits
    )
    assert p.units == [[1, 2, 3]]  # b's one place went to the chunk: 9 waits
    assert p.plan.gates is not None and p.plan.gates.room("a") == 4


def test_a_dry_look_takes_one_unit_and_no_chunk():
    p = Planned(req(chunk_size=4), [cand(1, group="g"), cand(5)], lines={1: [cand(2, group="g")]}, dry=True)
    assert p.units == [[1]] and p.read_lines == []


# ---- prefetch ----------------------------------------------------------------
def test_a_prefetch_takes_nothing_under_a_limit_or_a_breaker_not_closed():
    heads = [cand(1, limits=("api",)), cand(2, name="push"), cand(3, name="ok"), cand(4)]
    p = Planned(
        req(prefetch=True),
        heads,
        limits={"api": LimitSpec("api", 10)},
        breakers=[breaker("push", BreakerState.HALF_OPEN), breaker("ok", BreakerState.CLOSED)],
    )
    assert p.units == [[3], [4]]


def test_a_prefetched_chunk_stops_at_a_limited_member():
    line = [cand(2, group="g"), cand(3, group="g", limits=("api",)), cand(4, group="g")]
    p = Planned(
        req(chunk_size=4, prefetch=True), [cand(1, group="g")], lines={1: line}, limits={"api": LimitSpec("api", 10)}
    )
    assert p.units == [[1, 2]]


# ---- relays ------------------------------------------------------------------
def test_a_relay_takes_only_work_under_the_places_it_passes_on():
    limits = {"api": LimitSpec("api", 1), "db": LimitSpec("db", 5)}
    heads = [cand(1, limits=("api", "db")), cand(2), cand(3, name="push"), cand(4, limits=("api",))]
    p = Planned(
        req(1),
        heads,
        limits=limits,
        usage={"api": 1},  # the predecessor's place, passed on
        breakers=[breaker("push", BreakerState.CLOSED)],
        relay=frozenset({"api"}),
    )
    assert p.units == [[2]]  # 1 names db too, 3 is under a breaker
    p = Planned(
        req(1), [cand(1, limits=("api", "db")), cand(4, limits=("api",))], limits=limits, relay=frozenset({"api"})
    )
    assert p.units == [[4]]


def test_a_relayed_chunk_stops_at_a_member_naming_another_limit():
    limits = {"api": LimitSpec("api", 2), "db": LimitSpec("db", 5)}
    line = [cand(2, group="g", limits=("api",)), cand(3, group="g", limits=("db",))]
    p = Planned(
        req(1, chunk_size=4),
        [cand(1, group="g", limits=("api",))],
        lines={1: line},
        limits=limits,
        relay=frozenset({"api"}),
    )
    assert p.units == [[1, 2]]


# ---- the retry path ----------------------------------------------------------
def test_retries_take_at_most_their_share_while_fresh_work_waits():
    fresh = [cand(i) for i in (2, 4, 6, 8)]
    retries = [cand(i, retrying=True) for i in (1, 3, 5)]
    p = Planned(req(4, retry_share=0.25), fresh, retries=retries)
    assert p.units == [[1], [2], [4], [6]]


def test_retries_take_what_fresh_work_leaves_up_to_their_most():
    fresh = [cand(2)]
    retries = [cand(i, retrying=True) for i in (1, 3, 5, 7)]
    assert Planned(req(4, retry_share=0.25), fresh, retries=retries).units == [[1], [2], [3], [5]]
    p = Planned(req(4, retry_share=0.25, retry_max=2), fresh, retries=retries)
    assert p.units == [[1], [2], [3]]
    p = Planned(req(4, retry_share=0.25, retry_cap=0, retry_max=0), fresh, retries=retries)
    assert p.units == [[2]]


# ---- keys in turn --------------------------------------------------------------
KEYED = {"m": LimitSpec("m", concurrency=100)}


def key(k: str) -> tuple[str, ...]:
    return (f"m\x1f{k}",)


def test_the_key_a_task_waits_its_turn_under_is_its_least_keyed_limit():
    from corral.core.claims import turn_key

    assert turn_key(cand(1, limits=("p", "m\x1fb", "m\x1fa"))) == "m\x1fa"
    assert turn_key(cand(1, limits=("p",))) is None
    assert turn_key(cand(1, group="g", limits=key("a"))) is None  # its group serves it in turn


def test_a_key_heads_one_unit_a_pass_then_the_next_pass_serves_it_again():
    hot = [cand(i, limits=key("hot")) for i in range(1, 6)]
    cold = [cand(10 + i, limits=key(f"c{i}")) for i in range(3)]
    p = Planned(req(6), [*hot, *cold, cand(20)], limits=KEYED)
    # the first pass: the hot key once, each cold key, the unkeyed task; then the hot key again
    assert p.units == [[1], [10], [11], [12], [20], [2]]


def test_a_key_alone_takes_the_claim_one_pass_at_a_time():
    p = Planned(req(3), [cand(i, limits=key("a")) for i in range(1, 6)], limits=KEYED)
    assert p.units == [[1], [2], [3]]


def test_a_key_waits_no_more_candidates_than_its_room_and_then_is_passed_over():
    spec = {"m": LimitSpec("m", concurrency=2)}
    cs = [cand(i, limits=key("a")) for i in range(1, 6)]
    p = Planned(req(10), cs, limits=spec)
    assert p.units == [[1], [2]]  # its room, over two passes
    assert p.plan.passes_over(cand(9, limits=key("a")))
    assert not p.plan.passes_over(cand(9, limits=key("b")))
