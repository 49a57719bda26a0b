"""A simulated partner API on loopback, for the demo and ``corral bench limits``.

It behaves like the downstream the rate limits exist for:

- each call takes about ``latency`` seconds;
- more than ``cap`` calls in any sliding second are refused with 429 and a
  ``Retry-After`` header (and counted as over the cap);
- during an outage window every call fails with 503;
- optionally, a share of the calls it takes fails anyway (``flaky``): half
  with 503, half with 429 without ``Retry-After`` (a busy backend, not the
  cap), decided by a seeded random generator;
- SKUs named in ``bad_skus`` come back with a negative price (bad data a
  task must refuse, not retry);
- ``POST /notify?merchant=M&seq=N`` takes a merchant notification
  (``flaky`` applies too) and keeps, per merchant, the order they arrived in.

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
import random
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

    def __init__(
        self,
        cap: int,
        latency: float,
        *,
        flaky: float = 0.0,
        bad_skus: frozenset[str] = frozenset(),
        seed: int | None = None,
    ):
        if not 0.0 <= flaky < 1.0:
            raise ValueError(f"flaky must be a share in [0, 1), not {flaky!r}")
        self.cap = cap
        self.latency = latency
        self.flaky = flaky
        self.bad_skus = frozenset(bad_skus)
        self.rng = random.Random(seed)
        #: how long a notification takes to be taken
        self.notify_latency = 0.0
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
        #: flaky answers given, by status code
        self.flaky_answers: dict[int, int] = {}
        #: calls being served now (admitted, answer not sent), and the most at once
        self.in_flight = 0
        self.peak_in_flight = 0
        #: notifications taken, per merchant, in arrival order (their ``seq``)
        self.notified: dict[str, list[int]] = {}
        self.notify_calls = 0

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
        """Decide a call: 200, 429 (over the cap, or flaky) or 503 (outage, or flaky); log it."""
        return self.take(sku, worker, claimed, traceparent, trace_id)[0]

    def take(
        self, sku: str = "", worker: str = "", claimed: float | None = None, traceparent: str = "", trace_id: str = ""
    ) -> tuple[int, bool]:
        """Decide and log a call; also whether it was refused for the cap (then
        it is answered at once, with ``Retry-After``). Any other call is in
        flight until :meth:`served`."""
        with self.lock:
            if self.armed_outage is not None:
                self._start_outage(self.armed_outage)
            now = time.monotonic()
            over = self.over_cap
            code = self._decide(now)
            self.log.append(Call(time.time(), code, sku, worker, claimed, traceparent, trace_id))
            over_cap = self.over_cap > over
            if not over_cap:
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            return code, over_cap

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
        t = now - self.started
        self.accepted_at.append(t)
        self.per_second[int(t)] = self.per_second.get(int(t), 0) + 1
        code = self._flaky_code()
        if code is None:
            self.ok += 1
            return 200
        return code

    def _flaky_code(self) -> int | None:
        """503 or 429 for a ``flaky`` share of the calls, else None."""
        if not self.flaky:
            return None
        roll = self.rng.random()
        if roll >= self.flaky:
            return None
        code = 503 if roll < self.flaky / 2 else 429
        self.flaky_answers[code] = self.flaky_answers.get(code, 0) + 1
        return code

    def served(self) -> None:
        """A call :meth:`take` did not refuse for the cap has had its answer."""
        with self.lock:
            self.in_flight -= 1

    def notify(self, merchant: str, seq: int) -> int:
        """Take one merchant notification: 200 (kept, in arrival order) or a flaky 503."""
        with self.lock:
            self.notify_calls += 1
            if self.flaky and self.rng.random() < self.flaky / 2:
                self.flaky_answers[503] = self.flaky_answers.get(503, 0) + 1
                return 503
            self.notified.setdefault(merchant, []).append(seq)
            return 200

    def notifications(self) -> dict[str, list[int]]:
        """A copy of the notifications taken, per merchant, in arrival order."""
        with self.lock:
            return {m: list(seqs) for m, seqs in self.notified.items()}

    def busiest_second(self) -> int:
        """The most calls taken (within the cap) in any sliding second so far."""
        with self.lock:
            times = list(self.accepted_at)
        return max_in_window(times, 1.0)

    def last_second(self) -> int:
        """Calls taken (within the cap) in the last second."""
        with self.lock:
            now = time.monotonic()
            while self.recent and self.recent[0] <= now - 1.0:
                self.recent.popleft()
            return len(self.recent)

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
                "flaky": {str(k): v for k, v in sorted(self.flaky_answers.items())},
                "peak_in_flight": self.peak_in_flight,
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
            sku = q.get("sku", [""])[0]
            code, over_cap = state.take(
                sku,
                q.get("worker", [""])[0],
                _seconds(q.get("claimed", [""])[0]),
                self.headers.get("traceparent", ""),
                self.headers.get(CORRAL_HEADER, ""),
            )
            if over_cap:
                self._send(429, {"error": "too many requests"}, {"Retry-After": "1"})
                return
            try:
                time.sleep(state.latency)
            finally:
                state.served()
            if code == 503:
                self._send(503, {"error": "partner unavailable"})
            elif code == 429:
                self._send(429, {"error": "rate limited upstream"})
            elif url.path == "/images":
                self._send(200, {"sku": sku, "images": [f"{sku}-{i}.jpg" for i in range(3)]})
            else:
                self._send(200, {"sku": sku, "price": -12.5 if sku in state.bad_skus else 9.99})

        def do_POST(self) -> None:  # noqa: N802
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            q = parse_qs(url.query)
            if url.path == "/outage":
                seconds = float(q.get("seconds", ["0"])[0])
                state.start_outage(seconds)
                self._send(200, {"outage_s": seconds})
                return
            if url.path == "/notify":
                merchant = q.get("merchant", [""])[0]
                try:
                    seq = int(q.get("seq", [""])[0])
                except ValueError:
                    self._send(400, {"error": "seq must be a whole number"})
                    return
                time.sleep(state.notify_latency)
                if state.notify(merchant, seq) == 503:
                    self._send(503, {"error": "push gateway busy"})
                else:
                    self._send(200, {"merchant": merchant, "seq": seq})
                return
            self._send(404, {"error": "no such endpoint"})

    return Handler


class _Server(ThreadingHTTPServer):
    # a fleet opens dozens of connections at once: a short listen backlog drops some
    request_queue_size = 256


class PartnerServer:
    """Run the partner in a thread on 127.0.0.1 (a free port unless given)."""

    def __init__(
        self,
        cap: int = 100,
        latency: float = 0.2,
        port: int = 0,
        *,
        flaky: float = 0.0,
        bad_skus: frozenset[str] = frozenset(),
        notify_latency: float = 0.0,
        seed: int | None = None,
    ):
        self.state = PartnerState(cap, latency, flaky=flaky, bad_skus=bad_skus, seed=seed)
        self.state.notify_latency = notify_latency
        self.httpd = _Server(("127.0.0.1", port), _handler(self.state))
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
    path: str = "/product",
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One call to the partner, as a task would make it (stdlib only):
    ``path`` ``/product`` (a price) or ``/images``. ``worker`` and
    ``claimed`` (when the task was claimed) go to the partner's log;
    ``headers`` (``ctx.trace_headers()``) are sent with the request."""
    query = {"sku": sku}
    if worker is not None:
        query["worker"] = worker
    if claimed is not None:
        query["claimed"] = repr(claimed)
    try:
        request = urllib.request.Request(f"{base_url}{path}?{urlencode(query)}", headers=headers or {})
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise PartnerHTTPError(exc.code, dict(exc.headers.items())) from None


def notify(base_url: str, merchant: str, seq: int, timeout: float = 10.0) -> None:
    """Push one merchant notification (number ``seq`` of that merchant)."""
    url = f"{base_url}/notify?{urlencode({'merchant': merchant, 'seq': seq})}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=timeout) as r:
            r.read()
    except urllib.error.HTTPError as exc:
        raise PartnerHTTPError(exc.code, dict(exc.headers.items())) from None
