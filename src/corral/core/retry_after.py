"""Reading a downstream's "come back later" from an exception. Pure.

A partner API that answers 429 or 503 often says when to come back, in a
``Retry-After`` header: seconds, or an HTTP date. Exceptions of ``requests``
and ``httpx`` carry the response (``exc.response.headers``); so may any
exception with a ``.response.headers`` mapping, or a ``headers`` mapping of
its own. corral reads it to re-queue the task (and pause its limit) for
exactly that long, without counting a failure.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping
from typing import Any

#: A downstream asking for more than this is capped: a task must not sleep for days.
MAX_RETRY_AFTER = 3600.0


def _headers(exc: BaseException) -> Mapping[str, Any] | None:
    for holder in (getattr(exc, "response", None), exc):
        headers = getattr(holder, "headers", None)
        if headers is not None and hasattr(headers, "get"):
            return headers
    return None


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds from ``now`` that a ``Retry-After`` value asks for; None if unreadable."""
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return min(MAX_RETRY_AFTER, max(0.0, seconds))


def retry_after(exc: BaseException, now: float) -> float | None:
    """The ``Retry-After`` an exception carries, in seconds from ``now``; None if none."""
    headers = _headers(exc)
    if headers is None:
        return None
    value = headers.get("Retry-After")
    if value is None:
        value = headers.get("retry-after")
    return parse_retry_after(value, now)
