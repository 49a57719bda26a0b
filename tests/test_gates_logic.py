"""Flow control's pure logic: token buckets, breakers, levels, Retry-After.
No threads, no store, no sleeping: time is a number passed in."""

from __future__ import annotations

import email.utils

import pytest

from corral.core.breaker import (
    Breaker,
    BreakerConfig,
    BreakerState,
    admit,
    counts_as_failure,
    force,
    record,
)
from corral.core.clock import FakeClock
from corral.core.levels import (
    CALM_PERIOD,
    HANDED_BACK,
    Dispatch,
    Level,
    LevelState,
    Signals,
    Thresholds,
    dispatch_at,
    step,
    target_level,
)
from corral.core.rates import SLICES, Bucket, Window, parse_rate
from corral.core.retry_after import MAX_RETRY_AFTER, parse_retry_after, retry_after


# ---- rates ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, per_second",
    [("100/s", 100.0), ("6000/m", 100.0), ("20/h", 20 / 3600), ("5/10s", 0.5), (" 3 / min ", 0.05)],
)
def test_parse_rate(text, per_second):
    assert parse_rate(text).per_second == pytest.approx(per_second)


@pytest.mark.parametrize("bad", ["", "100", "fast", "0/s", "-1/s", "10/day"])
def test_parse_rate_refuses_what_it_cannot_read(bad):
    with pytest.raises(ValueError):
        parse_rate(bad)


def test_a_rate_is_a_sliding_window_unless_a_burst_is_asked_for():
    r = parse_rate("100/s")
    # at most 100 in any second, paced: at most 10 together
    assert (r.burst, r.window, r.pace, r.bucket_size) == (100, 1.0, 10, 10)
    r = parse_rate("20/h")
    assert (r.burst, r.window, r.pace) == (20, 3600.0, 2)
    r = parse_rate("5/10s")
    assert (r.burst, r.window, r.pace) == (5, 10.0, 2)
    assert parse_rate("1/s").pace == 1
    r = parse_rate("2.5/s")  # a fractional count: evenly spaced, one in any 0.4 s
    assert r.burst == 1 and r.window == pytest.approx(0.4)
    r = parse_rate("100/s", burst=5)  # opt-in: a token bucket
    assert (r.burst, r.window, r.bucket_size) == (5, None, 5)
    with pytest.raises(ValueError):
        parse_rate("100/s", burst=0)


def _greedy_starts(rate_text: str, burst: int | None, ask_every: float, seconds: float) -> list[float]:
    """Start times when a claim asks for 50 every ``ask_every`` seconds (far
    more than the rate), through the gates a store's claim uses."""
    from corral.core.gates import Gates, LimitState
    from corral.core.model import LimitSpec

    lim = LimitState(LimitSpec("api", rate=rate_text, burst=burst))
    starts: list[float] = []
    t = 1_700_000_000.0
    for _ in range(int(seconds / ask_every)):
        gates = Gates(t, {"api": lim}, {}, {})
        while gates.fits(("api",), "t"):
            gates.take(("api",), "t")
            starts.append(t)
        for charge in gates.rate_writes().values():
            lim.tokens, lim.counted_at, lim.starts = charge.tokens, charge.counted_at, charge.starts
        t += ask_every
    return starts


@pytest.mark.parametrize("text, n, period", [("20/s", 20, 1.0), ("200/s", 200, 1.0), ("30/m", 30, 60.0)])
def test_by_default_no_sliding_period_holds_more_than_n_starts(text, n, period):
    from corral.edges.partner import max_in_window

    for every in (0.001, 0.007, 0.0333):
        starts = _greedy_starts(text, None, every * period, 12 * period)
        assert max_in_window(starts, period) <= n, every
        # paced: never more than a tenth of N (at least 2) together
        assert max(starts.count(t) for t in set(starts)) <= max(2, n // 10)
        # and the rate is used: a start leaves the window at most a slice late
        span = starts[-1] - starts[0]
        assert len(starts) >= n * span / (period + 2 * period / SLICES + every * period)


def test_a_claim_that_comes_late_loses_no_rate_by_default():
    """Claims every 33 ms under 45/s (a token every 22 ms): each comes late,
    and the pacing bucket keeps what the lateness would have lost."""
    starts = _greedy_starts("45/s", None, 0.033, 20.0)
    assert len(starts) / (starts[-1] - starts[0]) >= 0.95 * 45
    spaced = _greedy_starts("45/s", 1, 0.033, 20.0)  # burst=1: the lateness is lost
    assert len(spaced) / (spaced[-1] - spaced[0]) < 0.7 * 45


def test_a_burst_is_opt_in_and_lets_more_into_a_sliding_second():
    from corral.edges.partner import max_in_window

    starts = _greedy_starts("20/s", 20, 0.001, 5.0)
    assert max_in_window(starts, 1.0) == 39  # the burst, then a second's refill
    smooth = _greedy_starts("20/s", 1, 0.001, 5.0)
    assert max_in_window(smooth, 1.0) <= 20
    assert min(b - a for a, b in zip(smooth, smooth[1:], strict=False)) >= 0.05 - 1e-6


def test_a_worker_behind_a_busy_rate_looks_again_for_a_batch_not_each_start():
    from corral.core.gates import Gates, LimitState
    from corral.core.model import LimitSpec

    def drained(text: str) -> tuple[LimitState, float]:
        lim = LimitState(LimitSpec("api", rate=text))
        gates = Gates(1000.0, {"api": lim}, {}, {})
        while gates.fits(("api",), "t"):
            gates.take(("api",), "t")
        for charge in gates.rate_writes().values():
            lim.tokens, lim.counted_at, lim.starts = charge.tokens, charge.counted_at, charge.starts
        return lim, 1000.0

    lim, now = drained("200/s")
    rate = lim.rate()
    assert lim.wait(rate, now) == pytest.approx(0.005)  # the next start: what limit_frees_at() says
    assert lim.wake(rate, now) == pytest.approx(0.05)  # ten starts' worth: half the pacing bucket
    gates = Gates(now, {"api": lim}, {}, {})
    assert not gates.fits(("api",), "t") and gates.wait == pytest.approx(0.05)
    lim, now = drained("20/s")
    assert lim.wake(lim.rate(), now) == lim.wait(lim.rate(), now) == pytest.approx(0.05)


def test_a_window_says_when_the_next_start_may_come():
    rate = parse_rate("4/s")
    w = Window().take(rate, 100.0, 3).take(rate, 100.3, 1)
    assert w.room(rate, 100.3) == 0
    # the first three leave together once their slice's end is a second old
    wait = w.wait(rate, 100.3)
    assert 0.7 < wait <= 0.7 + rate.slice + 1e-9
    assert w.room(rate, 100.3 + wait) == 3
    assert w.room(rate, 100.3 + wait - 1e-6) == 0
    assert Window.from_json(w.to_json()) == w
    assert Window.from_json("not json") == Window() and Window.from_json(None) == Window()


def test_a_window_survives_a_clock_that_went_back():
    rate = parse_rate("2/s")
    w = Window().take(rate, 1000.0, 2)
    assert w.room(rate, 999.7) == 0  # set back a little: the starts still count
    assert w.room(rate, 1000.0 + 1.0 + rate.slice) == 2
    # set back an hour: not shut for an hour
    assert w.room(rate, 1000.0 - 3600) == 2


def test_a_bucket_never_gives_more_than_the_rate_over_time():
    rate = parse_rate("100/s", burst=10)
    b = Bucket.full(rate, 0.0)
    taken = 0
    t = 0.0
    while t < 10.0:  # ask for 50 every 10 ms: far more than the rate
        got, b = b.take(rate, t, 50)
        taken += got
        t += 0.01
    # the burst, then 100 a second for 10 s (the last tick is at 9.99 s)
    assert 10 + 998 <= taken <= 10 + 1000


def test_a_bucket_refills_up_to_the_burst_only_and_says_how_long_to_wait():
    rate = parse_rate("2/s", burst=3)
    got, b = Bucket.full(rate, 100.0).take(rate, 100.0, 10)
    assert got == 3
    assert b.wait(rate, 100.0) == pytest.approx(0.5)
    assert b.wait(rate, 100.5) == 0
    assert b.level(rate, 1000.0) == 3  # a long quiet spell saves up the burst, no more
    assert b.level(rate, 50.0) == 0  # a clock that went back refills nothing


# ---- breaker -------------------------------------------------------------------------------
CFG = BreakerConfig(failure_ratio=0.5, min_calls=4, window=10, cooldown=30, probes=2, max_cooldown=100)


def _calls(b: Breaker, now: float, outcomes: str):
    changes = []
    for o in outcomes:
        b, ch = record(b, CFG, now, o == "x")
        if ch:
            changes.append(ch)
    return b, changes


def test_closed_opens_at_the_ratio_only_after_min_calls():
    b, ch = _calls(Breaker(), 0.0, "xxx")
    assert b.state is BreakerState.CLOSED and not ch  # 3 calls < min_calls
    b, ch = _calls(b, 0.0, "x")
    assert b.state is BreakerState.OPEN
    assert ch[0].calls == 4 and ch[0].failures == 4 and "4 of 4" in ch[0].reason


def test_failures_outside_the_window_are_forgotten():
    b, _ = _calls(Breaker(), 0.0, "xxx")
    b, _ = _calls(b, 20.0, "o")  # 20 s later the first three left the 10 s window
    assert b.state is BreakerState.CLOSED
    assert b.counts(CFG, 20.0) == (1, 0)


def test_open_admits_nothing_until_the_cooldown_then_exactly_the_probes():
    b, _ = _calls(Breaker(), 0.0, "xxxx")
    assert admit(b, CFG, 29.9, 5)[0] == 0
    n, b, ch = admit(b, CFG, 30.0, 5)
    assert n == 2 and b.state is BreakerState.HALF_OPEN and ch.after is BreakerState.HALF_OPEN
    n, b, _ = admit(b, CFG, 30.1, 5)
    assert n == 0  # the fleet together gets exactly `probes`


def test_probes_that_succeed_close_it_and_a_failed_one_reopens_with_a_longer_cooldown():
    b, _ = _calls(Breaker(), 0.0, "xxxx")
    _, half, _ = admit(b, CFG, 30.0, 2)
    closed, ch = _calls(half, 31.0, "oo")
    assert closed.state is BreakerState.CLOSED and ch[-1].after is BreakerState.CLOSED
    reopened, ch = _calls(half, 31.0, "x")
    assert reopened.state is BreakerState.OPEN and reopened.cooldown == 60
    _, again, _ = admit(reopened, CFG, 91.0, 2)
    worse, _ = _calls(again, 92.0, "x")
    assert worse.cooldown == 100  # doubled, capped at max_cooldown


def test_a_forced_open_breaker_stays_open_until_closed_by_hand():
    b, ch = force(Breaker(), CFG, 0.0, BreakerState.OPEN, "partner outage")
    assert ch.reason == "partner outage"
    assert admit(b, CFG, 10_000.0, 3)[0] == 0
    b, _ = force(b, CFG, 10_000.0, BreakerState.CLOSED, "resolved")
    assert admit(b, CFG, 10_000.0, 3)[0] == 3


def test_slow_calls_count_when_configured():
    cfg = BreakerConfig(min_calls=1, failure_ratio=1.0, slow_call=2.0)
    b, ch = record(Breaker(), cfg, 0.0, False, duration=2.5)
    assert b.state is BreakerState.OPEN


class _HTTPError(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status_code = status


def test_which_errors_count_against_a_breaker():
    assert counts_as_failure(None) is False
    assert counts_as_failure(TimeoutError()) is True
    assert counts_as_failure(ConnectionError()) is True
    assert counts_as_failure(_HTTPError(503)) is True
    for status in (401, 403, 429, 400):
        assert counts_as_failure(_HTTPError(status)) is False
    assert counts_as_failure(ValueError("bad sku"), permanent=True) is False


# ---- levels --------------------------------------------------------------------------------
def test_level_names_parse_every_way():
    assert Level.parse("degraded") is Level.DEGRADED
    assert Level.parse("L3") is Level.CIRCUIT_OPEN
    assert Level.parse(4) is Level.EMERGENCY
    with pytest.raises(ValueError, match="one of NORMAL"):
        Level.parse("PANIC")


def test_target_level_follows_the_signals():
    assert target_level(Signals()) is Level.NORMAL
    assert target_level(Signals(queue_depth=90, queue_bound=100)) is Level.WARNING
    assert target_level(Signals(failing_kinds=3)) is Level.DEGRADED
    assert target_level(Signals(lease_losses_per_min=10)) is Level.DEGRADED
    assert target_level(Signals(failing_kinds=5)) is Level.CIRCUIT_OPEN


def test_steps_up_at_once_and_down_one_level_per_calm_period():
    t = Thresholds(calm_period=60)
    s = step(LevelState(), Level.CIRCUIT_OPEN, 0.0, t)
    assert s.level is Level.CIRCUIT_OPEN
    s = step(s, Level.NORMAL, 10.0, t)
    assert s.level is Level.CIRCUIT_OPEN  # calm only just began
    s = step(s, Level.NORMAL, 69.0, t)
    assert s.level is Level.CIRCUIT_OPEN
    s = step(s, Level.NORMAL, 70.0, t)
    assert s.level is Level.DEGRADED
    s = step(s, Level.DEGRADED, 80.0, t)  # a flare-up resets the calm
    s = step(s, Level.NORMAL, 90.0, t)
    assert step(s, Level.NORMAL, 149.0, t).level is Level.DEGRADED
    assert step(s, Level.NORMAL, 150.0, t).level is Level.WARNING


def test_a_manual_level_is_left_alone():
    manual = LevelState(Level.WARNING, manual=True)
    assert step(manual, Level.CIRCUIT_OPEN, 0.0) is manual
    assert step(LevelState(Level.EMERGENCY, manual=True), Level.NORMAL, 1e9).level is Level.EMERGENCY


@pytest.mark.parametrize("held", [Level.EMERGENCY, Level.CIRCUIT_OPEN, Level.WARNING])
def test_a_level_handed_back_goes_to_what_the_signals_say_in_one_evaluation(held):
    clock = FakeClock()
    t = Thresholds(calm_period=60)
    s = step(LevelState(held, False, HANDED_BACK, "handed back"), Level.NORMAL, clock.time(), t)
    assert (s.level, s.manual, s.calm_since) == (Level.NORMAL, False, None)
    # from there the usual rules: up at once, down one level per calm period
    clock.advance(5)
    s = step(s, Level.DEGRADED, clock.time(), t)
    assert s.level is Level.DEGRADED
    s = step(s, Level.NORMAL, clock.advance(1), t)
    assert step(s, Level.NORMAL, clock.advance(59), t).level is Level.DEGRADED
    assert step(s, Level.NORMAL, clock.advance(1), t).level is Level.WARNING


def test_a_level_handed_back_rises_at_once_when_the_signals_are_worse():
    s = step(LevelState(Level.WARNING, False, HANDED_BACK), Level.CIRCUIT_OPEN, 0.0)
    assert s.level is Level.CIRCUIT_OPEN and s.calm_since is None


def test_an_emergency_no_longer_held_by_hand_is_left_at_once():
    # the rules never set EMERGENCY: one not held by hand was handed back
    assert step(LevelState(Level.EMERGENCY), Level.WARNING, 0.0).level is Level.WARNING


def test_the_step_down_pace_defaults_to_a_minute_per_level():
    assert Thresholds().calm_period == CALM_PERIOD == 60.0
    s = step(LevelState(), Level.CIRCUIT_OPEN, 0.0)
    now = 0.0
    while s.level is not Level.NORMAL:
        now += 30.0  # one evaluation per default sweep interval
        s = step(s, Level.NORMAL, now)
    assert now <= 3 * 60 + 3 * 30  # CIRCUIT_OPEN to NORMAL: three levels, a minute each


def test_what_each_level_lets_a_worker_claim():
    assert dispatch_at(Level.NORMAL, 10) == Dispatch(10, 10)
    assert dispatch_at(Level.WARNING, 10).max_units == 5
    assert dispatch_at(Level.DEGRADED, 10) == Dispatch(5, 5, only_critical=True)
    assert dispatch_at(Level.CIRCUIT_OPEN, 10).only_retries
    assert dispatch_at(Level.EMERGENCY, 10).max_units is None


# ---- Retry-After ---------------------------------------------------------------------------
class _Response:
    def __init__(self, headers):
        self.headers = headers


class _ClientError(Exception):
    def __init__(self, headers):
        super().__init__("429 Too Many Requests")
        self.response = _Response(headers)


def test_retry_after_in_seconds_or_as_an_http_date():
    now = 1_700_000_000.0
    assert retry_after(_ClientError({"Retry-After": "12"}), now) == 12.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after(_ClientError({"retry-after": date}), now) == pytest.approx(30, abs=1)
    assert parse_retry_after("-5", now) == 0.0
    assert parse_retry_after("99999999", now) == MAX_RETRY_AFTER
    assert parse_retry_after("soon", now) is None
    assert retry_after(ValueError("no response"), now) is None
