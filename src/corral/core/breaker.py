"""Circuit breakers as a pure state machine.

    CLOSED --(failure ratio over the window >= threshold, after min_calls)--> OPEN
    OPEN --(cooldown passed)--> HALF_OPEN: exactly ``probes`` calls let through
    HALF_OPEN --(every probe succeeded)--> CLOSED
    HALF_OPEN --(a probe failed)--> OPEN, with the cooldown doubled (capped)

The state is a small value (:class:`Breaker`) a store keeps in one row and
changes inside the claim (admitting probes) and with outcomes (recording
calls), so the whole fleet shares one breaker and exactly ``probes`` tasks
pass in HALF_OPEN across every worker. Time is always passed in.

Which errors count (:func:`counts_as_failure`): transient ones — timeouts,
connection errors, 5xx — and slow calls when configured. Permanent errors
and 401, 403 and 429 do not: the downstream is up and answering; a 429 is a
rate question for the limit, not an outage.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from corral.core.retries import http_status


class BreakerState(str, enum.Enum):
    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_ratio: float = 0.5
    min_calls: int = 20
    window: float = 60.0
    cooldown: float = 30.0
    probes: int = 3
    #: the cooldown doubles after each failed probe, up to this
    max_cooldown: float = 600.0
    #: a successful call slower than this counts as a failure (None: never)
    slow_call: float | None = None

    def __post_init__(self) -> None:
        if not (0 < self.failure_ratio <= 1) or not math.isfinite(self.failure_ratio):
            raise ValueError("failure_ratio must be in (0, 1]")
        for name in ("window", "cooldown", "max_cooldown"):
            v = getattr(self, name)
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0")
        if isinstance(self.min_calls, bool) or not isinstance(self.min_calls, int) or self.min_calls < 1:
            raise ValueError("min_calls must be a whole number >= 1")
        if isinstance(self.probes, bool) or not isinstance(self.probes, int) or self.probes < 1:
            raise ValueError("probes must be a whole number >= 1")
        if self.slow_call is not None and (not math.isfinite(self.slow_call) or self.slow_call <= 0):
            raise ValueError("slow_call must be a finite number of seconds > 0")


#: One second of calls: (second, ok, failed).
Slot = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Breaker:
    state: BreakerState = BreakerState.CLOSED
    #: calls per whole second over the window, oldest first
    slots: tuple[Slot, ...] = ()
    opened_at: float | None = None
    cooldown: float | None = None  # the current one (grows after failed probes)
    probes_issued: int = 0
    probes_ok: int = 0
    #: set by an operator: the breaker stays as forced until closed by hand
    forced: bool = False

    # ---- reading ------------------------------------------------------------
    def counts(self, cfg: BreakerConfig, now: float) -> tuple[int, int]:
        """(calls, failures) in the window ending at ``now``."""
        start = math.floor(now - cfg.window)
        calls = failed = 0
        for sec, ok, bad in self.slots:
            if sec > start:
                calls += ok + bad
                failed += bad
        return calls, failed

    def reopens_at(self) -> float | None:
        if self.state is not BreakerState.OPEN or self.opened_at is None or self.cooldown is None:
            return None
        return self.opened_at + self.cooldown


@dataclass(frozen=True, slots=True)
class Change:
    """A state change, with why and the counts behind it (for the event log)."""

    before: BreakerState
    after: BreakerState
    reason: str
    calls: int
    failures: int


def _trim(slots: tuple[Slot, ...], cfg: BreakerConfig, now: float) -> tuple[Slot, ...]:
    start = math.floor(now - cfg.window)
    return tuple(s for s in slots if s[0] > start)


def _open(
    b: Breaker, cfg: BreakerConfig, now: float, cooldown: float, reason: str, calls: int, failed: int
) -> tuple[Breaker, Change]:
    after = replace(b, state=BreakerState.OPEN, opened_at=now, cooldown=cooldown, probes_issued=0, probes_ok=0)
    return after, Change(b.state, BreakerState.OPEN, reason, calls, failed)


def admit(b: Breaker, cfg: BreakerConfig, now: float, wanted: int) -> tuple[int, Breaker, Change | None]:
    """How many of ``wanted`` calls may start now; the new state; a change if any.

    Called inside a claim: in HALF_OPEN the probes handed out are counted in
    the state, so the fleet together never gets more than ``probes``."""
    if b.state is BreakerState.CLOSED:
        return wanted, b, None
    if b.state is BreakerState.OPEN:
        reopen = b.reopens_at()
        if b.forced or reopen is None or now < reopen:
            return 0, b, None
        calls, failed = b.counts(cfg, now)
        b2 = replace(b, state=BreakerState.HALF_OPEN, probes_issued=0, probes_ok=0)
        change = Change(BreakerState.OPEN, BreakerState.HALF_OPEN, "cooldown passed", calls, failed)
        n, b3, _ = admit(b2, cfg, now, wanted)
        return n, b3, change
    left = max(0, cfg.probes - b.probes_issued)
    n = min(wanted, left)
    return n, replace(b, probes_issued=b.probes_issued + n), None


def record(
    b: Breaker, cfg: BreakerConfig, now: float, failed: bool, *, duration: float | None = None
) -> tuple[Breaker, Change | None]:
    """Count one finished call (``failed``: it counts as a failure; see
    :func:`counts_as_failure`). Returns the new state and a change if any."""
    if cfg.slow_call is not None and duration is not None and duration > cfg.slow_call:
        failed = True
    sec = math.floor(now)
    slots = list(_trim(b.slots, cfg, now))
    if slots and slots[-1][0] == sec:
        s, ok, bad = slots[-1]
        slots[-1] = (s, ok + (not failed), bad + failed)
    else:
        slots.append((sec, int(not failed), int(failed)))
    b = replace(b, slots=tuple(slots))
    calls, fails = b.counts(cfg, now)
    if b.forced:
        return b, None
    if b.state is BreakerState.CLOSED:
        if calls >= cfg.min_calls and fails / calls >= cfg.failure_ratio:
            reason = f"{fails} of {calls} calls failed in {cfg.window:g}s (threshold {cfg.failure_ratio:.0%})"
            return _open(b, cfg, now, cfg.cooldown, reason, calls, fails)
        return b, None
    if b.state is BreakerState.HALF_OPEN:
        if failed:
            grown = min(cfg.max_cooldown, (b.cooldown or cfg.cooldown) * 2)
            return _open(b, cfg, now, grown, f"a probe failed; cooling down {grown:g}s", calls, fails)
        ok = b.probes_ok + 1
        if ok >= cfg.probes:
            closed = replace(
                b, state=BreakerState.CLOSED, slots=(), opened_at=None, cooldown=None, probes_issued=0, probes_ok=0
            )
            return closed, Change(BreakerState.HALF_OPEN, BreakerState.CLOSED, f"{ok} probes succeeded", calls, fails)
        return replace(b, probes_ok=ok), None
    return b, None  # OPEN: late outcomes of calls started before it opened


def force(b: Breaker, cfg: BreakerConfig, now: float, state: BreakerState, reason: str) -> tuple[Breaker, Change]:
    """An operator opens (held until closed by hand) or closes the breaker."""
    calls, fails = b.counts(cfg, now)
    if state is BreakerState.OPEN:
        after = replace(
            b, state=BreakerState.OPEN, opened_at=now, cooldown=cfg.cooldown, forced=True, probes_issued=0, probes_ok=0
        )
    elif state is BreakerState.CLOSED:
        after = Breaker()
    else:
        raise ValueError("a breaker is forced OPEN or CLOSED; HALF_OPEN comes by itself after the cooldown")
    return after, Change(b.state, after.state, reason, calls, fails)


def counts_as_failure(exc: BaseException | None, *, permanent: bool = False) -> bool:
    """Does this outcome count against a breaker? None (success) never does.

    Transient errors count (timeouts, connection errors, 5xx); a permanent
    error (bad input, a bug) or a 401/403/429 answer does not."""
    if exc is None:
        return False
    status = http_status(exc)
    if status is not None:
        return status >= 500 or status == 408
    if isinstance(exc, TimeoutError | ConnectionError | OSError):
        return True
    return not permanent


# ---- keeping a breaker in a store row -------------------------------------------------
def config_to_json(cfg: BreakerConfig) -> str:
    """The config as JSON text (a store keeps it beside the state)."""
    import json

    return json.dumps({f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, separators=(",", ":"))


def config_from_json(text: str) -> BreakerConfig:
    import json

    return BreakerConfig(**json.loads(text))


def state_to_json(b: Breaker) -> str:
    """The state as JSON text: the state name, the window's slots, the cooldown and probes."""
    import json

    return json.dumps(
        {
            "state": b.state.value,
            "slots": [list(s) for s in b.slots],
            "opened_at": b.opened_at,
            "cooldown": b.cooldown,
            "probes_issued": b.probes_issued,
            "probes_ok": b.probes_ok,
            "forced": b.forced,
        },
        separators=(",", ":"),
    )


def state_from_json(text: str | None) -> Breaker:
    import json

    if not text:
        return Breaker()
    d = json.loads(text)
    return Breaker(
        state=BreakerState(d["state"]),
        slots=tuple((int(s), int(ok), int(bad)) for s, ok, bad in d.get("slots", ())),
        opened_at=d.get("opened_at"),
        cooldown=d.get("cooldown"),
        probes_issued=int(d.get("probes_issued", 0)),
        probes_ok=int(d.get("probes_ok", 0)),
        forced=bool(d.get("forced", False)),
    )


def give_back_probe(b: Breaker) -> Breaker:
    """A probe ended without a verdict (snoozed, canceled, handed back): its
    place goes back, so HALF_OPEN never waits forever for an answer."""
    if b.state is BreakerState.HALF_OPEN and b.probes_issued > b.probes_ok:
        return replace(b, probes_issued=b.probes_issued - 1)
    return b
