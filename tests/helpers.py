"""Small helpers shared by the test suite.

Tests never sleep to synchronise: they poll a condition with ``wait_for``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: A task's empty arguments, as a store holds them (``NewTask(name, ARGS)``).
ARGS = '{"args":[],"kwargs":{}}'

__all__ = ["ARGS", "wait_for", "run_concurrently", "Downstream", "HandOverLog", "in_ci", "missing"]


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set, as ``.ci/run`` and CI services do)."""
    import os

    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def missing(reason: str, *, allow_module_level: bool = False) -> None:
    """A tool or server a test needs is not there: skip it locally, but fail
    it in CI, where a skip would hide a test that never ran."""
    import pytest

    if in_ci():
        pytest.fail(f"{reason} (CI must not skip this test)", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.005,
    message: str = "",
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that value.

    Raises AssertionError (mentioning ``message``) if ``timeout`` seconds pass
    first. The predicate is always evaluated at least once, and once more at
    the deadline, so a condition that became true just in time still passes.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(interval, remaining))
    value = predicate()
    if value:
        return value
    what = message or getattr(predicate, "__name__", repr(predicate))
    raise AssertionError(f"timed out after {timeout:g}s waiting for: {what} (last value: {value!r})")


def run_concurrently(n: int, fn: Callable[[int], T], timeout: float = 90.0) -> list[T]:
    """Run ``fn(0) .. fn(n-1)`` in ``n`` threads released together by a
    barrier (so they really race); return their results, re-raise the first error."""
    import threading

    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


class Downstream:
    """A downstream call as a limited task makes it: notes how many calls are
    in flight at their peak, and each group's calls in the order they came."""

    def __init__(self, seconds: float = 0.002) -> None:
        self.seconds = seconds
        self.running = 0
        self.peak = 0
        self.seen: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def __call__(self, group: str, i: int) -> None:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.seen.setdefault(group, []).append(i)
        threading.Event().wait(self.seconds)  # the call itself
        with self._lock:
            self.running -= 1


class HandOverLog:
    """Wraps a store's complete_and_claim: the successors it claimed for
    units that ended, and those it claimed for relays (units still running)."""

    def __init__(self, store) -> None:
        self.successors = 0
        self.relayed = 0
        self._inner = store.complete_and_claim
        store.complete_and_claim = self

    def __call__(self, *args, relays=(), **kwargs):
        applied, claims = self._inner(*args, relays=relays, **kwargs)
        tokens = {token for token, _ in relays}
        relayed = sum(1 for c in claims if c.token in tokens)
        self.relayed += relayed
        self.successors += len(claims) - relayed
        return applied, claims


def order_violations_past_a_crash(history, killed: str) -> list:
    """What ``history.check()`` finds, less the replays a kill -9 may cause.

    One in flight per group over every execution (the killed worker's included),
    in submit order. Known gap, tolerated: the killed worker may have run a later
    chunk member before its head's re-run (the head's outcome was still in the
    completer's batch), so only such lost runs may break the order."""
    return [
        v
        for v in history.check()
        if not (
            v.rule == "group-order"
            and v.second.worker == killed
            and history.runs_of(v.second.task_id)[-1] is not v.second
        )
    ]
