"""A worker feeds its tasks' outcomes to the breakers on their limits, and
every change a breaker goes through (open, half-open, close) is a WARNING in
the worker's log, with its reason, and a ``breaker`` event, on every store."""

from __future__ import annotations

import logging
import threading

import corral
from corral import State
from helpers import wait_for


def _breaker_changes(app: corral.App) -> list[tuple[str, str, str]]:
    events = [e for e in app.events(kinds="breaker") if e.kind == "breaker"]
    return [(e.details["from"], e.details["to"], e.details["reason"]) for e in events]


def test_failures_under_a_limit_open_its_breaker_and_every_change_is_logged_and_an_event(url, caplog):
    caplog.set_level(logging.WARNING, logger="corral.breaker")
    app = corral.App(url)
    app.limit("partner", concurrency=4)
    app.breaker("partner", failure_ratio=0.5, min_calls=4, window="60s", cooldown="1s", probes=1)
    down = threading.Event()
    down.set()

    @app.task(limits=["partner"], retries=0)
    def call(i):
        if down.is_set():
            raise ConnectionError("partner is down")
        return i

    failing = [call.submit(i) for i in range(4)]
    app.start(workers=2)
    try:
        wait_for(lambda: all(app.get(h.id).status is State.FAILED for h in failing), timeout=60)
        # the worker fed the four failures to the breaker: it opened
        opened = wait_for(lambda: [c for c in _breaker_changes(app) if c[1] == "OPEN"], timeout=30)
        assert opened[0][:2] == ("CLOSED", "OPEN") and "4 of 4 calls failed" in opened[0][2]
        down.clear()
        probe = call.submit(99)  # claimed once the cooldown has passed: the probe; it succeeds
        assert probe.result(timeout=60) == 99
        changes = wait_for(lambda: len(_breaker_changes(app)) >= 3 and _breaker_changes(app), timeout=30)
        assert [c[:2] for c in changes] == [("CLOSED", "OPEN"), ("OPEN", "HALF_OPEN"), ("HALF_OPEN", "CLOSED")]
    finally:
        app.close(10)
    lines = [r for r in caplog.records if r.name == "corral.breaker"]
    assert all(r.levelno == logging.WARNING and "\n" not in r.getMessage() for r in lines)
    said = [r.getMessage() for r in lines]
    assert len(said) == 3, said
    assert said[0].startswith("breaker 'partner' opened: 4 of 4 calls failed in 60s")
    assert said[1].startswith("breaker 'partner' is half-open (probing): cooldown passed")
    assert said[2].startswith("breaker 'partner' closed: 1 probes succeeded")


def test_a_failed_probe_is_logged_as_opening_again(caplog):
    from corral.core.breaker import BreakerState, Change
    from corral.core.gates import event

    caplog.set_level(logging.WARNING, logger="corral.breaker")
    change = Change(BreakerState.HALF_OPEN, BreakerState.OPEN, "a probe failed; cooling down 60s", 5, 3)
    ev = event(100.0, "partner", change)
    assert (ev.before, ev.after, ev.reason) == ("HALF_OPEN", "OPEN", "a probe failed; cooling down 60s")
    said = [r.getMessage() for r in caplog.records]
    assert said == ["breaker 'partner' opened again: a probe failed; cooling down 60s"]
