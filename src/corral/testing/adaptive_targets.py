"""The adaptive limits' targets, measured in the simulator, per seed.

Each scenario of ``tests/test_adaptive_limits.py`` is defined here once, with
the figures its targets read, so the tests assert them and a person can print
them seed by seed::

    python -m corral.testing.adaptive_targets            # 20 seeds, both worlds
    python -m corral.testing.adaptive_targets --seeds 5 --world bench

Two worlds: ``ideal`` (a partner whose quota is a token bucket of a tenth of a
second, workers reporting in step with the leader) and ``bench`` (the
benchmark's partner: at most N calls in any sliding second; and a loaded
machine: each worker's report is taken up to :data:`BENCH_REPORT_LAG` seconds
late, so the leader's seconds hold two reports of a worker or none, merged by
:func:`corral.core.adaptive.fleet_report` as the keeper does).
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable
from dataclasses import replace

from corral.core.adaptive import RATE_START_GROWTH, Bounds, LimitReport
from corral.testing.limits_sim import AdaptiveController, FixedController, Phase, Run, simulate

SEEDS = range(20)
BOUNDS = Bounds(min_concurrency=1, max_concurrency=200, min_rate=1.0, max_rate=400.0)
WORLDS = ("ideal", "bench")
#: the most a worker's report is late in the ``bench`` world (seconds)
BENCH_REPORT_LAG = 0.4

RAMP = (Phase(0, rate=100, latency_ms=50),)
HALVED = (Phase(0, rate=100, latency_ms=50), Phase(40, rate=50, latency_ms=50))
CAPPED = (Phase(0, rate=None, cap=20, latency_ms=100), Phase(40, rate=None, cap=10, latency_ms=100))
# a quota of N calls a second (a second's worth at once) moves 60 -> 40 -> 60; another client takes 10/s
# of it; our app is idle for 10 s
MOVING = (
    Phase(0, rate=60, latency_ms=50, background=10, burst=1.0),
    Phase(30, rate=40, latency_ms=50, background=10, burst=1.0),
    Phase(60, rate=40, latency_ms=50, background=10, burst=1.0, demand=0),
    Phase(70, rate=60, latency_ms=50, background=10, burst=1.0),
)
FIXED_RATES = (10, 20, 25, 30, 40, 50, 60, 80)
#: the rates of the limits told the share, as multiples of the share the other client leaves
TOLD_SHARE_FACTORS = (0.9, 1.0)


def _world(phases: tuple[Phase, ...], world: str) -> tuple[tuple[Phase, ...], float]:
    if world == "ideal":
        return phases, 0.0
    if world == "bench":
        return tuple(replace(p, sliding=True) for p in phases), BENCH_REPORT_LAG
    raise ValueError(f"world is one of {WORLDS}, not {world!r}")


@functools.cache
def adaptive(
    phases: tuple[Phase, ...], seconds: float, seed: int, world: str = "ideal", *, rate: float, concurrency: float
) -> Run:
    """One run of the adaptive controller (cached: the tests read each run several times)."""
    phases, lag = _world(phases, world)
    controller = AdaptiveController(BOUNDS, rate=rate, concurrency=concurrency)
    return simulate(phases, controller, seconds=seconds, seed=seed, report_lag=lag)


@functools.cache
def fixed(phases: tuple[Phase, ...], seconds: float, rate: float, seed: int, world: str = "ideal") -> Run:
    phases, lag = _world(phases, world)
    return simulate(phases, FixedController(200, rate), seconds=seconds, seed=seed, report_lag=lag)


class ToldShare:
    """A limit told at every moment the share of the partner's quota the other client leaves
    (the quota less that client's mean rate); it sends ``factor`` times that share, growing from
    ``start`` by the slow start's 1.5x a second. No controller knows as much, so its figures
    bound what one can reach against the best fixed rate at a given share of calls throttled."""

    def __init__(self, phases: tuple[Phase, ...], factor: float, start: float = 10.0):
        self.phases, self.factor, self.start_rate = phases, factor, start

    def _rate(self, now: float) -> float:
        phase = [p for p in self.phases if p.at <= now][-1]
        share = (BOUNDS.max_rate if phase.rate is None else phase.rate) - phase.background
        return min(self.factor * share, self.start_rate * RATE_START_GROWTH ** math.floor(now))

    def start(self, now: float) -> tuple[int, float]:
        return 200, self._rate(now)

    def step(self, report: LimitReport, now: float) -> tuple[int, float]:
        return 200, self._rate(now)


@functools.cache
def told_share(phases: tuple[Phase, ...], seconds: float, seed: int, world: str, factor: float) -> Run:
    """One run of :class:`ToldShare` (cached)."""
    controller = ToldShare(phases, factor)
    phases, lag = _world(phases, world)
    return simulate(phases, controller, seconds=seconds, seed=seed, report_lag=lag)


def first_window(run: Run, at_least: float, start: int = 0, width: int = 5) -> float:
    """Seconds from ``start`` to the first ``width`` s window whose throughput is at least ``at_least`` (inf: never)."""
    for s in range(start, len(run.successes) - width + 1):
        if run.throughput(s, s + width) >= at_least:
            return float(s - start)
    return math.inf


def ramp(seed: int, world: str = "ideal") -> dict[str, float]:
    """From 10/s against a hidden 100/s: >= 90/s within 30 s, < 2 % throttled."""
    run = adaptive(RAMP, 60, seed, world, rate=10, concurrency=10)
    return {
        "to_90_s": first_window(run, 90) + 5,  # the end of the first 5 s window averaging 90/s
        "throughput_30_60": run.throughput(30, 60),
        "throttled_pct": 100 * run.throttled_share(0, 60),
    }


def halved(seed: int, world: str = "ideal") -> dict[str, float]:
    """The hidden rate halves at 40 s: < 2 % throttled from 10 s after, >= 85 % of it within 20 s."""
    run = adaptive(HALVED, 80, seed, world, rate=10, concurrency=10)
    return {
        "throttled_pct_50_80": 100 * run.throttled_share(50, 80),
        "throughput_60_80": run.throughput(60, 80),
        "to_42_5_s": first_window(run, 0.85 * 50, start=40) + 5,
    }


def capped(seed: int, world: str = "ideal") -> dict[str, float]:
    """A hidden concurrency cap of 20 (latency rising past it), halved at 40 s."""
    run = adaptive(CAPPED, 70, seed, world, rate=400, concurrency=4)
    return {
        "in_flight_10_40": run.mean_in_flight(10, 40),
        "p50_ratio": run.p50_ms(10, 40) / 100,
        "overloaded_s_40_70": float(run.overloaded_seconds(40, 70)),
    }


def hindsight(seed: int, world: str = "ideal") -> dict[str, float]:
    """Against every fixed rate of :data:`FIXED_RATES` on a moving quota: throughput / the best one's,
    and the throttles beside those of the fixed rates that do as well; then the same ratio and the
    share throttled of a limit told the share the other client leaves (:class:`ToldShare`)."""
    ours = adaptive(MOVING, 100, seed, world, rate=10, concurrency=10)
    runs = [fixed(MOVING, 100, rate, seed, world) for rate in FIXED_RATES]
    best = max(run.total("successes") for run in runs)
    reaching = [run.total("throttles") for run in runs if run.total("successes") >= ours.total("successes")]
    figures = {
        "ratio_to_best": ours.total("successes") / best,
        "throttled_pct": 100 * ours.throttled_share(),
        "throttles": float(ours.total("throttles")),
        "fewest_throttles_as_good": float(min(reaching)) if reaching else math.inf,
    }
    for factor in TOLD_SHARE_FACTORS:  # what a limit told the share reaches, and at what cost
        told = told_share(MOVING, 100, seed, world, factor)
        figures[f"told_{factor}_ratio"] = told.total("successes") / best
        figures[f"told_{factor}_throttled_pct"] = 100 * told.throttled_share()
    return figures


SCENARIOS: dict[str, Callable[[int, str], dict[str, float]]] = {
    "ramp": ramp,
    "halved": halved,
    "capped": capped,
    "hindsight": hindsight,
}


def table(world: str, seeds: range) -> str:
    """Every scenario's figures, one line a seed, then the mean, min and max."""
    lines = []
    for name, scenario in SCENARIOS.items():
        rows = [scenario(seed, world) for seed in seeds]
        keys = list(rows[0])
        lines.append(f"{name} ({world})")
        width = {k: max(8, len(k)) for k in keys}
        lines.append("  seed " + " ".join(f"{k:>{width[k]}}" for k in keys))
        for seed, row in zip(seeds, rows, strict=True):
            lines.append(f"  {seed:>4} " + " ".join(f"{row[k]:>{width[k]}.2f}" for k in keys))
        for label, pick in (("mean", lambda v: sum(v) / len(v)), ("min", min), ("max", max)):
            lines.append(f"  {label:>4} " + " ".join(f"{pick([r[k] for r in rows]):>{width[k]}.2f}" for k in keys))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    parser.add_argument("--world", choices=WORLDS, action="append")
    args = parser.parse_args(argv)
    for world in args.world or WORLDS:
        print(table(world, range(args.seeds)))


if __name__ == "__main__":
    main()
