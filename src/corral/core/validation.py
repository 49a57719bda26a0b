"""Bounds on every value corral accepts, checked once before anything is stored.

The stores differ in what they hold (PostgreSQL refuses NUL characters,
integers past 32 bits and index entries past about 2.7 kB; SQLite takes
almost anything), so the API layer refuses here, with the same one-line
error on every store, whatever one of them could not hold or show. Each
check raises the error class its caller passes: ``BadArguments`` at submit
(nothing was stored), ``ConfigError`` for declarations and worker options.

The bounds are documented in docs/reliability.md ("Limits on sizes and values").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from corral.errors import MAX_PAUSE, ConfigError, CorralError

#: Default cap on a task's encoded arguments and on its encoded result, in bytes of JSON (UTF-8).
DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576
#: What ``App(max_payload_bytes=...)`` may be set to.
PAYLOAD_BYTES_RANGE = (1_024, 268_435_456)
#: Longest task name, queue, group, batch, key, trace id, limit name or rate, in characters.
#: 255 characters are at most 1 020 bytes of UTF-8: they fit a PostgreSQL index entry.
MAX_TEXT_CHARS = 255
#: A task's retries (attempts after the first).
RETRIES_RANGE = (0, 10_000)
#: Priority: a 32-bit signed integer, what both databases hold.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
#: A limit's concurrency.
LIMIT_CONCURRENCY_RANGE = (1, 2**31 - 1)
#: Task ids named in ``depends_on``.
TASK_ID_RANGE = (1, 2**63 - 1)
#: Longest timeout, delay or lease: ten years, in seconds.
MAX_DURATION = MAX_PAUSE
#: Worker slots in one process: each is a thread.
CONCURRENCY_RANGE = (1, 1_000)
#: Tasks of one group a worker takes in one chunk.
CHUNK_SIZE_RANGE = (1, 10_000)
#: Shortest lease: renewals every third of it must not spin.
MIN_LEASE_SECONDS = 1.0
#: Shortest pause of a worker's polling loops.
MIN_INTERVAL = 0.01
#: The share of a claim's units that retries may take while fresh work waits.
DEFAULT_RETRY_SHARE = 0.25

_SHOWN = 40


def shown(value: Any) -> str:
    """A value as an error message may quote it: short, on one line."""
    if isinstance(value, str) and len(value) > _SHOWN:
        return f"a {len(value)}-character string"
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def integer(value: Any, option: str, bounds: tuple[int, int], err: type[CorralError] = ConfigError) -> int:
    """An int within ``bounds``; floats, bools and strings are refused, never truncated."""
    lo, hi = bounds
    if isinstance(value, bool) or not isinstance(value, int):
        raise err(f"{option} must be an integer from {lo} to {hi}, not {shown(value)}")
    if not lo <= value <= hi:
        raise err(f"{option} must be an integer from {lo} to {hi}, not {value}")
    return int(value)


def seconds(
    value: Any,
    option: str,
    err: type[CorralError] = ConfigError,
    *,
    minimum: float = 0.0,
    zero_ok: bool = False,
    maximum: float = MAX_DURATION,
) -> float:
    """A finite number of seconds: above ``minimum`` (or equal to it with
    ``zero_ok``), at most ``maximum``. NaN and infinity never pass."""
    most = f"{maximum:.0f} (ten years)" if maximum == MAX_DURATION else f"{maximum:g}"
    rule = f"{'>=' if zero_ok else '>'} {minimum:g} and at most {most}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise err(f"{option} must be a number of seconds {rule}, not {shown(value)}")
    v = float(value)
    if not math.isfinite(v) or v < minimum or (v == minimum and not zero_ok) or v > maximum:
        raise err(f"{option} must be a finite number of seconds {rule}, not {value!r}")
    return v


def text(value: Any, option: str, err: type[CorralError] = ConfigError) -> str:
    """A non-empty string of at most :data:`MAX_TEXT_CHARS` characters, no
    NUL, valid Unicode: what every store can hold and index."""
    if not isinstance(value, str):
        raise err(f"{option} must be a string, not {shown(value)}")
    n = len(value)
    if n == 0 or n > MAX_TEXT_CHARS:
        raise err(f"{option} must be 1 to {MAX_TEXT_CHARS} characters, not {n}")
    if "\x00" in value:
        raise err(f"{option} must not contain a NUL character")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise err(f"{option} must be valid Unicode (it holds a lone surrogate)") from None
    return value


def payload_problem(encoded: str, max_bytes: int, what: str) -> str | None:
    """Why JSON text cannot be stored (too big, or not valid Unicode), or None.

    Measured in bytes of UTF-8, what the stores hold; ``what`` names the
    payload in the message ("arguments of send", "result")."""
    if encoded.isascii():
        size = len(encoded)
    else:
        try:
            size = len(encoded.encode("utf-8"))
        except UnicodeEncodeError:
            return f"{what}: a string is not valid Unicode (it holds a lone surrogate)"
    if size > max_bytes:
        return f"{what}: {size} bytes as JSON, over the limit of {max_bytes} bytes (App(max_payload_bytes=...) sets it)"
    return None


def retry_share(value: Any, option: str = "retry_share") -> float | None:
    """A share of a claim in (0, 1], or None (retries queue with fresh work).

    A share of 0 would starve retries, so it is refused rather than read as "none"."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{option} must be a number greater than 0 and at most 1, not {shown(value)}")
    v = float(value)
    if not math.isfinite(v) or not 0.0 < v <= 1.0:
        raise ConfigError(f"{option} must be a number greater than 0 and at most 1, not {value!r}")
    return v


def retry_cap(max_units: int, share: float | None, cap: int | None = None) -> int | None:
    """The most units of a claim of ``max_units`` that retries take while
    fresh work waits: ``cap`` when the caller gives it (a worker bounding the
    retries it holds; 0 allowed), else ``ceil(max_units * share)``, at least
    1 so retries are never starved (None: no share, claim order alone decides)."""
    if share is None:
        return None
    if cap is not None:
        return max(0, min(int(cap), max_units))
    return max(1, math.ceil(max_units * share - 1e-9))


def retry_bounds(
    max_units: int, share: float | None, cap: int | None = None, most: int | None = None
) -> tuple[int | None, int]:
    """A claim's bounds on retries: (the most they take while fresh work
    waits, as :func:`retry_cap`; the most they take even when fresh work runs
    short, ``most`` if the caller gives one). No share: (None, max_units)."""
    share_cap = retry_cap(max_units, share, cap)
    if share_cap is None:
        return None, max_units
    top = max_units if most is None else max(0, min(most, max_units))
    return min(share_cap, top), top


def held_retry_cap(slots: int, share: float | None, retries_held: int) -> int | None:
    """How many more retry units a worker with ``slots`` may claim while fresh
    work waits, holding ``retries_held`` already: its share of the slots,
    ``ceil(slots * share)`` (at least 1, so retries always move), less those.
    A share of each *claim* would not do: a busy worker claims one unit at a
    time as slots free, and one unit's share is the whole unit."""
    if share is None:
        return None
    return max(0, max(1, math.ceil(slots * share - 1e-9)) - retries_held)


def max_payload_bytes(value: Any) -> int:
    """The ``App(max_payload_bytes=...)`` option."""
    return integer(value, "max_payload_bytes", PAYLOAD_BYTES_RANGE)


def names(value: Any, option: str, err: type[CorralError] = ConfigError) -> tuple[str, ...]:
    """A list of names (e.g. ``limits``); a bare string is refused, not split into letters."""
    if isinstance(value, str) or isinstance(value, Mapping) or not hasattr(value, "__iter__"):
        raise err(f"{option} must be a list of names, not {shown(value)}")
    return tuple(text(v, f"each of {option}", err) for v in value)


def exception_types(value: Any, option: str) -> tuple[type[BaseException], ...]:
    """A list of exception classes (``retry_on``, ``permanent_on``)."""
    items = (value,) if isinstance(value, type) else value
    if not hasattr(items, "__iter__") or isinstance(items, str):
        raise ConfigError(f"{option} must be a list of exception classes, not {shown(value)}")
    out = tuple(items)
    for t in out:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise ConfigError(f"{option} must list exception classes, not {shown(t)}")
    return out


def worker_options(
    *,
    concurrency: Any,
    chunk_size: Any,
    lease_seconds: Any,
    heartbeat_interval: Any,
    poll_interval: Any,
    cancel_poll_interval: Any,
    completer_window: Any,
    sweep_interval: Any,
) -> None:
    """Refuse worker options that would spin a core, start thousands of
    threads, or let a lease expire between its renewals."""
    integer(concurrency, "concurrency", CONCURRENCY_RANGE)
    integer(chunk_size, "chunk_size", CHUNK_SIZE_RANGE)
    lease = seconds(lease_seconds, "lease_seconds", minimum=MIN_LEASE_SECONDS, zero_ok=True)
    if heartbeat_interval is not None:
        beat = seconds(heartbeat_interval, "heartbeat_interval", minimum=MIN_INTERVAL, zero_ok=True)
        if beat >= lease:
            raise ConfigError(
                f"heartbeat_interval must be shorter than lease_seconds ({lease:g}), not {beat:g}: "
                "leases would expire between renewals"
            )
    seconds(poll_interval, "poll_interval", minimum=MIN_INTERVAL, zero_ok=True)
    seconds(cancel_poll_interval, "cancel_poll_interval", minimum=MIN_INTERVAL, zero_ok=True)
    seconds(completer_window, "completer_window", zero_ok=True, maximum=1.0)
    if sweep_interval is not None:
        seconds(sweep_interval, "sweep_interval", minimum=MIN_INTERVAL, zero_ok=True)
