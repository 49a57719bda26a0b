"""A simulated partner API on loopback, for the demo and ``corral bench limits``.

It behaves like the downstream the rate limits exist for:

- each call takes about ``latency`` seconds;
- more than ``cap`` calls in any sliding second are refused with 429 and a
  ``Retry-After`` header (and counted as over the cap);
- during an outage window every call fails with 503.

Several worker processes share it over HTTP, so what it counts (calls,
refusals, calls per second) is what the fleet really did. ``GET /stats``
returns the counts as JSON; ``POST /outage?seconds=S`` starts an outage.

Every call is also written to a log (:class:`Call`: its wall-clock time, the
answer, what the caller said about itself in the query string, and the trace
headers it sent: ``traceparent`` and ``X-Corral-Trace-Id``, as
``ctx.trace_headers()`` gives them), so a benchmark can line the partner's view
up with the store's own records, and a test can see a trace reach it.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from corral.core.tracing import CORRAL_HEADER


@dataclass(frozen=True, slots=True)
class Call:
    """One call as the partner saw it: ``at`` is wall-clock time (the clock
    the stores write), ``status`` the answer; ``sku``, ``worker`` and
    ``claimed`` (when the store handed the task out) come from the query
    string; ``traceparent`` and ``trace_id`` from the trace headers."""

    at: float
    status: int
    sku: str = ""
    worker: str = ""
    claimed: float | None = None
    traceparent: str = ""
    trace_id: str = ""


class PartnerState:
    """The partner's counters; thread-safe, on the monotonic clock (the
    call log on wall-clock time)."""

    def __init__(self, cap: int, latency: float):
        self.cap = cap
        self.latency = latency
        self.lock = threading.Lock()
        self.recent: deque[float] = deque()
        self.started = time.monotonic()
        self.calls = 0
        self.ok = 0
        self.over_cap = 0
        self.failed_outage = 0
        self.outage_until = 0.0
        #: an outage of this many seconds starts at the next call (see arm_outage)
        self.armed_outage: float | None = None
        #: wall-clock start and end of the last outage
        self.outage_window: tuple[float, float] | None = None
        #: every call, in arrival order
        self.log: list[Call] = []
        #: accepted calls per whole second since start
        self.per_second: dict[int, int] = {}
        #: start times of every accepted call (seconds since start)
        self.accepted_at: list[float] = []

    def start_outage(self, seconds: float) -> None:
        """Fail every call with 503 for ``seconds`` from now."""
        with self.lock:
            self._start_outage(seconds)

    def arm_outage(self, seconds: float) -> None:
        """Fail every call with 503 for ``seconds`` from the next call on: the
        outage starts when the fleet does, however long it takes to boot."""
        with self.lock:
            self.armed_outage = seconds

    def _start_outage(self, seconds: float) -> None:
        self.outage_until = time.monotonic() + seconds
        wall = time.time()
        self.outage_window = (wall, wall + seconds)
        self.armed_outage = None

    def admit(
        self, sku: str = "", worker: str = "", claimed: float | None = None, traceparent: str = "", trace_id: str = ""
    ) -> int:
        """Decide a call: 200, 429 (over the cap) or 503 (outage); log it."""
        with self.lock:
            if self.armed_outage is not None:
                self._start_outage(self.armed_outage)
            now = time.monotonic()
            code = self._decide(now)
            self.log.append(Call(time.time(), code, sku, worker, claimed, traceparent, trace_id))
            return code

    def _decide(self, now: float) -> int:
        self.calls += 1
        if now < self.outage_until:
            self.failed_outage += 1
            return 503
        while self.recent and self.recent[0] <= now - 1.0:
            self.recent.popleft()
        if len(self.recent) >= self.cap:
            self.over_cap += 1
            return 429
        self.recent.append(now)
        self.ok += 1
        t = now - self.started
        self.accepted_at.append(t)
        self.per_second[int(t)] = self.per_second.get(int(t), 0) + 1
        return 200

    def calls_log(self) -> list[Call]:
        """A copy of the call log."""
        with self.lock:
            return list(self.log)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "cap": self.cap,
                "calls": self.calls,
                "ok": self.ok,
                "over_cap": self.over_cap,
                "failed_outage": self.failed_outage,
                "per_second": {str(k): v for k, v in sorted(self.per_second.items())},
                "max_in_any_second": max_in_window(self.accepted_at, 1.0),
            }


def max_in_window(times: list[float], window: float) -> int:
    """Most events in any window of ``window`` seconds (times sorted)."""
    best = 0
    j = 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


def _seconds(text: str) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _handler(state: PartnerState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            url = urlsplit(self.path)
            if url.path == "/stats":
                self._send(200, state.stats())
                return
            q = parse_qs(url.query)
            code = state.admit(
                q.get("sku", [""])[0],
                q.get("worker", [""])[0],
                _seconds(q.get("claimed", [""])[0]),
                self.headers.get("traceparent", ""),
                self.headers.get(CORRAL_HEADER, ""),
            )
            if code == 429:
                self._send(429, {"error": "too many requests"}, {"Retry-After": "1"})
                return
            time.sleep(state.latency)
            if code == 503:
                self._send(503, {"error": "partner outage"})
                return
            self._send(200, {"sku": q.get("sku", [""])[0], "price": 9.99})

        def do_POST(self) -> None:  # noqa: N802
            url = urlsplit(self.path)
            if url.path == "/outage":
                seconds = float(parse_qs(url.query).get("seconds", ["0"])[0])
                state.start_outage(seconds)
                self._send(200, {"outage_s": seconds})
                return
            self._send(404, {"error": "no such endpoint"})

    return Handler


class PartnerServer:
    """Run the partner in a thread on 127.0.0.1 (a free port unless given)."""

    def __init__(self, cap: int = 100, latency: float = 0.2, port: int = 0):
        self.state = PartnerState(cap, latency)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self.state))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="corral-partner", daemon=True)

    def __enter__(self) -> PartnerServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class PartnerHTTPError(Exception):
    """A partner answer other than 200; ``status_code`` and ``response.headers``
    are where corral looks for "retry" and "Retry-After"."""

    def __init__(self, status_code: int, headers: dict[str, str]):
        super().__init__(f"partner API answered {status_code}")
        self.status_code = status_code
        self.response = type("Response", (), {"headers": headers, "status_code": status_code})()


def call(
    base_url: str,
    sku: str,
    timeout: float = 10.0,
    *,
    worker: str | None = None,
    claimed: float | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One call to the partner, as a task would make it (stdlib only).
    ``worker`` and ``claimed`` (when the task was claimed) go to the partner's
    log; ``headers`` (``ctx.trace_headers()``) are sent with the request."""
    query = {"sku": sku}
    if worker is not None:
        query["worker"] = worker
    if claimed is not None:
        query["claimed"] = repr(claimed)
    try:
        request = urllib.request.Request(f"{base_url}/product?{urlencode(query)}", headers=headers or {})
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise PartnerHTTPError(exc.code, dict(exc.headers.items())) from None
