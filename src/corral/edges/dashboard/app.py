"""The dashboard's web application (Starlette): pages, the live stream, actions, /metrics.

Security rules, all enforced here:

- Without a token it answers only requests addressed to a loopback name
  (the Host header), so another site cannot reach it by DNS rebinding.
- With a token, every request but the login form and the static files must
  carry it (``Authorization: Bearer T`` or the cookie the login form sets).
- Actions are POSTs carrying a CSRF token (a per-process secret) both in a
  form field and in a cookie (double submit); anything else is refused with
  403 and changes nothing. ``read_only`` hides the forms and refuses every POST.
- Templates autoescape every value; the script writes with ``textContent``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import anyio
from jinja2 import Environment, FileSystemLoader
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from corral.core.breaker import BreakerState
from corral.core.events import task_subject
from corral.core.levels import Level
from corral.core.model import TaskFilter, TaskRecord, loads
from corral.core.pauses import KINDS, Pause, check_target
from corral.core.planning import format_age
from corral.core.states import ACTIVE, FINAL, State
from corral.edges.dashboard.hosts import is_loopback
from corral.edges.dashboard.sampler import Sampler, fmt_seconds
from corral.edges.task_lists import TaskQuery
from corral.edges.why import explain, explain_one
from corral.errors import CorralError
from corral.stores.base import DEAD, Store, batch_status

HERE = Path(__file__).parent
PAGE = 50
BATCH_PAGE = 20
#: Characters of args, results and checkpoints shown on a task's page.
SHOWN = 2000
TOKEN_COOKIE = "corral_token"
CSRF_COOKIE = "corral_csrf"
#: No inline script may run (an escaped value can never become one anyway); no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
FINAL_STATES = (State.FAILED.value, State.TIMEOUT.value, State.CANCELED.value)


def truncate(text: str | None, n: int = SHOWN) -> str:
    if text is None:
        return ""
    return text if len(text) <= n else text[:n] + f"… ({len(text) - n} more characters)"


def when(ts: float | None) -> str:
    import datetime as dt

    if ts is None:
        return "–"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(seconds: float | None) -> str:
    """How long ago or how long for, shortly: ``4s``, ``3m 20s``, ``2h 05m``, ``3d 04h``."""
    return "–" if seconds is None else format_age(seconds)


def iso(ts: float | None) -> str:
    import datetime as dt

    return "" if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds")


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def _safe_next(target: str | None, default: str = "/") -> str:
    """Only a path of this site (never //host or a scheme), so a form cannot redirect away."""
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return default


class Dashboard:
    """The state one dashboard process holds: its store, sampler, secrets and templates."""

    def __init__(self, store: Store, *, token: str | None = None, read_only: bool = False, interval: float = 1.0):
        self.store = store
        self.token = token
        self.read_only = read_only
        self.csrf = secrets.token_urlsafe(32)
        self.sampler = Sampler(store, interval)
        self.interval = interval
        self.stopping = False
        self.env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True)
        self.env.filters["when"] = when
        self.env.filters["seconds"] = fmt_seconds
        self.env.filters["truncate_text"] = truncate
        self.env.filters["age"] = age
        self.env.filters["iso"] = iso
        self.env.globals["urlq"] = lambda v: quote(str(v), safe="")
        self._registry: Any = None
        #: bulk actions shown with their count, waiting to be confirmed: ticket -> (action, ids, until)
        self._bulk: dict[str, tuple[str, list[int], float]] = {}

    def remember_bulk(self, action: str, ids: list[int]) -> str:
        """Keep the ids a shown count is about; the ticket confirms them once, within BULK_TTL."""
        import time

        now = time.monotonic()
        self._bulk = {k: v for k, v in self._bulk.items() if v[2] > now}
        while len(self._bulk) >= BULK_PENDING:
            self._bulk.pop(next(iter(self._bulk)))
        ticket = secrets.token_urlsafe(16)
        self._bulk[ticket] = (action, ids, now + BULK_TTL)
        return ticket

    def take_bulk(self, ticket: str) -> tuple[str, list[int]] | None:
        import time

        got = self._bulk.pop(ticket, None)
        if got is None or got[2] <= time.monotonic():
            return None
        return got[0], got[1]

    # ---- rendering --------------------------------------------------------------------
    def page(self, request: Request, template: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.update(
            request=request,
            read_only=self.read_only,
            csrf=self.csrf,
            here=request.url.path + (("?" + request.url.query) if request.url.query else ""),
            msg=request.query_params.get("msg", ""),
            snap=self.sampler.snapshot(),
        )
        ctx.setdefault("now", self.store.now())  # ages in lists are counted from the store's clock
        html = self.env.get_template(template).render(**ctx)
        resp = HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
        self._set_csrf_cookie(resp)
        return resp

    def _set_csrf_cookie(self, resp: Response) -> None:
        resp.set_cookie(CSRF_COOKIE, self.csrf, httponly=True, samesite="strict")

    # ---- authentication -----------------------------------------------------------------
    def authorized(self, request: Request) -> bool:
        if self.token is None:
            return True
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer ") and _same(header[7:].strip(), self.token):
            return True
        return _same(request.cookies.get(TOKEN_COOKIE), self.token)

    async def check_csrf(self, request: Request) -> dict[str, str] | None:
        """The form when the POST carries the right CSRF token in its form and its cookie; else None."""
        form = await request.form()
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        if _same(fields.get("csrf"), self.csrf) and _same(request.cookies.get(CSRF_COOKIE), self.csrf):
            return fields
        return None

    # ---- metrics -------------------------------------------------------------------------
    def metrics_text(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest

        from corral.edges.metrics import StoreCollector

        if self._registry is None:
            self._registry = CollectorRegistry()
            self._registry.register(StoreCollector(self.store))
        return generate_latest(self._registry)


def _loopback_host(header: str) -> bool:
    host = header.strip()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return is_loopback(host)


class AuthMiddleware(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: Callable) -> Response:
        dash: Dashboard = request.app.state.dash
        path = request.url.path
        if dash.token is None and not _loopback_host(request.headers.get("host", "")):
            # without a token only this machine may talk to it: a page elsewhere whose
            # name was pointed at 127.0.0.1 (DNS rebinding) sends its own Host name
            return PlainTextResponse("refused: this dashboard answers loopback addresses only", status_code=403)
        if path in ("/login", "/healthz") or path.startswith("/static/") or dash.authorized(request):
            return await call_next(request)
        if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
            return RedirectResponse("/login?" + urlencode({"next": _safe_next(path)}), status_code=303)
        return PlainTextResponse("refused: this dashboard needs its token", status_code=401)


# ---- pages ---------------------------------------------------------------------------------
def _dash(request: Request) -> Dashboard:
    return request.app.state.dash


def _int(value: str | None, default: int | None = None) -> int | None:
    try:
        return int(value) if value else default
    except ValueError:
        return default


def overview(request: Request) -> Response:
    d = _dash(request)
    try:
        events = d.store.events(limit=20)
    except NotImplementedError:
        events = []
    return d.page(request, "overview.html", title="Overview", events=events, levels=list(Level))


def _paused(store: Store) -> dict[str, dict[str, Pause]]:
    """The pauses by hand, by kind then name (none from a store that keeps none)."""
    try:
        pauses = store.pauses()
    except NotImplementedError:
        pauses = []
    out: dict[str, dict[str, Pause]] = {}
    for p in pauses:
        out.setdefault(p.kind, {})[p.name] = p
    return out


def queues(request: Request) -> Response:
    d = _dash(request)
    counts = d.store.queue_counts()
    paused = _paused(d.store)
    rows = []
    for q in sorted(set(counts) | set(paused.get("queue", {}))):  # a queue paused before work arrived too
        c = counts.get(q, {})
        rows.append({"queue": q, **{s.value: c.get(s.value, 0) for s in ACTIVE}})
    return d.page(request, "queues.html", title="Queues", rows=rows, paused=paused)


def groups(request: Request) -> Response:
    d = _dash(request)
    offset = max(0, _int(request.query_params.get("offset"), 0) or 0)
    lines = d.store.group_lines(limit=PAGE + 1, offset=offset)
    more = len(lines) > PAGE
    from corral.edges.workers import read_workers

    _, seen = read_workers(d.store)
    dead = {v.id: v.dead for v in seen if not v.alive}
    return d.page(
        request,
        "groups.html",
        title="Groups",
        lines=lines[:PAGE],
        dead=dead,
        paused=_paused(d.store),
        offset=offset,
        next_offset=offset + PAGE if more else None,
        prev_offset=max(0, offset - PAGE) if offset else None,
    )


def limits(request: Request) -> Response:
    """What ``corral limit show`` says (edges/limit_view.py), a form to change
    a limit while running, and the breakers."""
    from corral.core.adaptive import MAX_KEY_EVENTS
    from corral.edges.limit_view import adaptive_history, limits_report

    d = _dash(request)
    rows = limits_report(d.store)
    now = d.store.now()
    history = adaptive_history(d.store, [r["name"] for r in rows if r["adaptive"]])
    adaptive = [_adaptive_chart(r, history[r["name"]], now) for r in rows if r["adaptive"]]
    breakers = sorted(d.store.breakers().items())
    events = d.store.breaker_events(limit=20)
    return d.page(
        request,
        "limits.html",
        title="Limits and breakers",
        rows=rows,
        adaptive=adaptive,
        breakers=breakers,
        events=events,
        now=now,
        paused=_paused(d.store),
        key_events=MAX_KEY_EVENTS,
    )


#: The adaptive charts' size (the SVG's viewBox) and inner margin.
CHART_W, CHART_H, CHART_PAD = 600.0, 100.0, 4.0


def _adaptive_chart(row: dict[str, Any], points: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """An adaptive limit's last minutes as SVG paths: for each adaptive knob,
    the effective value the controller set (a step line) against what
    happened (the calls that succeeded a second, for the rate), with a mark at
    each interval that saw throttles."""
    from corral.edges.limit_view import HISTORY_SECONDS

    # the window: the last HISTORY_SECONDS, or from the first change (at least 20 s) when newer
    first = points[0]["at"] if points else now
    start = max(now - HISTORY_SECONDS, min(first, now - 20.0))
    span = max(1.0, now - start)
    a = row["adaptive"]

    def x(at: float) -> float:
        return max(0.0, min(CHART_W, (at - start) / span * CHART_W))

    def y(v: float, top: float) -> float:
        return CHART_H - CHART_PAD - (v / top) * (CHART_H - 2 * CHART_PAD)

    def steps(values: list[tuple[float, float]], top: float, now_value: float | None) -> str:
        d: list[str] = []
        last: float | None = None
        for at, v in values:
            if last is not None:
                d.append(f"L{x(at):.1f} {y(last, top):.1f}")
            d.append(f"{'L' if d else 'M'}{x(at):.1f} {y(v, top):.1f}")
            last = v
        if last is not None:
            d.append(f"L{CHART_W:.1f} {y(now_value if now_value is not None else last, top):.1f}")
        return " ".join(d)

    def line(values: list[tuple[float, float]], top: float) -> str:
        return " ".join(f"{'L' if i else 'M'}{x(at):.1f} {y(v, top):.1f}" for i, (at, v) in enumerate(values))

    charts = []
    if "rate_bounds" in a:
        effective = [(p["at"], float(p["rate"])) for p in points if p["rate"] is not None]
        succeeded = [(p["at"], p["successes"] / p["seconds"]) for p in points]
        now_rate = _rate_per_second(a["rate"])
        top = max([v for _, v in effective + succeeded] + [now_rate or 0.0, 1.0]) * 1.1
        charts.append(
            {
                "knob": "rate",
                "title": f"rate: effective (now {a['rate']}) against calls that succeeded a second",
                "top": top,
                "effective": steps(effective, top, now_rate),
                "happened": line(succeeded, top),
                "throttles": [
                    {"x": round(x(p["at"]), 1), "n": p["throttles"], "at": p["at"]} for p in points if p["throttles"]
                ],
            }
        )
    if "concurrency_bounds" in a:
        effective = [(p["at"], float(p["concurrency"])) for p in points if p["concurrency"] is not None]
        now_conc = float(a["concurrency"]) if a["concurrency"] is not None else None
        top = max([v for _, v in effective] + [now_conc or 0.0, 1.0]) * 1.1
        charts.append(
            {
                "knob": "concurrency",
                "title": f"concurrency: effective (now {a['concurrency']})",
                "top": top,
                "effective": steps(effective, top, now_conc),
                "happened": "",
                "throttles": [
                    {"x": round(x(p["at"]), 1), "n": p["throttles"], "at": p["at"]} for p in points if p["throttles"]
                ],
            }
        )
    return {
        "name": row["name"],
        "since": start,
        "charts": charts,
        "decisions": len(points),
        "throttled": sum(p["throttles"] for p in points),
    }


def _rate_per_second(rate: str | None) -> float | None:
    from corral.core.rates import parse_rate

    try:
        return parse_rate(rate).per_second if rate else None
    except ValueError:
        return None


def workers(request: Request) -> Response:
    from corral.edges.workers import read_workers

    d = _dash(request)
    now, rows = read_workers(d.store)
    return d.page(request, "workers.html", title="Workers", rows=rows, now=now, dead=sum(not v.alive for v in rows))


#: Events a page shows, and how many of a kind a subject filter looks through.
EVENTS_SHOWN = 200
EVENTS_SCANNED = 2000
#: Ticks shown per schedule.
TICKS_SHOWN = 8


def schedules(request: Request) -> Response:
    """Periodic schedules with their last and next ticks, last outcome and recent runs."""
    from corral.cli.periodic import _at, outcome, schedule_dict

    d = _dash(request)
    now = d.store.now()
    rows = []
    try:
        stored = d.store.schedules()
    except NotImplementedError:
        stored = []
    for st in stored:
        row = schedule_dict(st, now)
        row["outcome"] = outcome(st)
        row["last_tick_local"] = _at(st.last_tick, st.timezone)
        row["next_tick_local"] = _at(row["next_tick"], st.timezone)
        runs = []
        for tick in d.store.schedule_ticks(st.name, limit=TICKS_SHOWN):
            rec = d.store.get(tick.task_id) if tick.task_id is not None else None
            runs.append(
                {
                    "task_id": tick.task_id,
                    "status": rec.status.value if rec is not None else "deleted",
                    "outcome": tick.outcome,
                    "tick_local": _at(tick.tick, st.timezone),
                }
            )
        row["runs"] = runs
        rows.append(row)
    return d.page(request, "schedules.html", title="Schedules", rows=rows, now=now)


def events_page(request: Request) -> Response:
    """The event stream, newest first, filtered by kind and subject; the level's and breakers' history."""
    from corral.core.events import KNOWN_KINDS, LEVEL

    d = _dash(request)
    kind = (request.query_params.get("kind") or "").strip()
    subject = (request.query_params.get("subject") or "").strip()
    if subject.isdigit():  # a task's id: its events' subject
        subject = task_subject(int(subject))
    kind = kind[:100]  # kinds beyond the stores' own may be added (add_event): any is asked as given
    try:
        if subject:
            events = [e for e in d.store.events(kind or None, limit=EVENTS_SCANNED) if e.subject == subject]
        else:
            events = d.store.events(kind or None, limit=EVENTS_SHOWN)
        levels = d.store.events(LEVEL, limit=20)
    except NotImplementedError:
        events, levels = [], []
    what = ", ".join(f"{k} {v}" for k, v in (("kind", kind), ("subject", subject)) if v)
    return d.page(
        request,
        "events.html",
        title="Events",
        heading=f"Events: {what}" if what else "Events",
        events=events[:EVENTS_SHOWN],
        kinds=sorted(KNOWN_KINDS | ({kind} if kind else set())),
        kind=kind,
        subject=subject,
        levels=levels,
        breakers=d.store.breaker_events(limit=50),
        now=d.store.now(),
    )


#: The Over time page's windows: name -> (seconds, seconds per point).
WINDOWS = {"hour": (3600, 60), "day": (86_400, 900)}
#: Its charts: bucket field(s) -> title.
OVER_TIME_CHARTS = [
    (("done",), "finished per point"),
    (("failed",), "failed (FAILED, TIMEOUT) per point"),
    (("depth",), "queue depth (queued, at the point's end)"),
    (("dur_p50", "dur_p99"), "duration p50 / p99 (s)"),
    (("wait_p50", "wait_p99"), "wait from due to start p50 / p99 (s)"),
]


def _svg_path(values: list[float | None], top: float, w: float = 300.0, h: float = 80.0, pad: float = 4.0) -> str:
    step = w / (len(values) - 1) if len(values) > 1 else w
    d, pen = [], False
    for i, v in enumerate(values):
        if v is None:
            pen = False
            continue
        y = h - pad - (v / top) * (h - 2 * pad) if top else h - pad
        d.append(f"{'L' if pen else 'M'}{i * step:.1f} {y:.1f}")
        pen = True
    return " ".join(d)


def over_time(request: Request) -> Response:
    """Throughput, failures, queue depth and p50/p99 of duration and wait, for the last
    hour or day, for every queue or one (and one task name), from the minutes the
    sweeper's leader records."""
    from corral.core.minutes import OTHER, QUEUE_ROW, buckets, minute_of

    d = _dash(request)
    q = request.query_params
    window = q.get("window") or "hour"
    if window not in WINDOWS:
        return d.page(request, "error.html", status_code=400, title="Bad window", error="window must be hour or day")
    span, width = WINDOWS[window]
    queue = (q.get("queue") or "").strip()
    name = (q.get("name") or "").strip()
    now = d.store.now()
    end = minute_of(now)
    start = end - span
    try:
        rows = d.store.minute_stats(start)
    except NotImplementedError:
        rows = []
    queues = sorted({r.queue for r in rows})
    names = sorted({r.name for r in rows if r.name != QUEUE_ROW and (not queue or r.queue == queue)})
    chosen = [
        r
        for r in rows
        if (not queue or r.queue == queue)
        and (r.name == name if name else r.name == QUEUE_ROW)
        and (not name or not queue or r.queue == queue)
    ]
    points = buckets(chosen, start - start % width, end, width)
    charts = []
    for fields, title in OVER_TIME_CHARTS:
        series = [[getattr(b, f) for b in points] for f in fields]
        top = max([v for vals in series for v in vals if v is not None] + [0]) or 1
        charts.append(
            {"title": title, "key": fields[-1], "top": top, "paths": [_svg_path(vals, top) for vals in series]}
        )
    per_name: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if r.name == QUEUE_ROW or (queue and r.queue != queue):
            continue
        t = per_name.setdefault((r.queue, r.name), {"done": 0, "failed": 0, "p50s": [], "p99": None})
        t["done"] += r.done
        t["failed"] += r.failed
        if r.dur_p50 is not None:
            t["p50s"].append(r.dur_p50)
        if r.dur_p99 is not None:
            t["p99"] = max(t["p99"] or 0.0, r.dur_p99)
    table = sorted(
        (
            {
                "queue": k[0],
                "name": k[1],
                "done": v["done"],
                "failed": v["failed"],
                "p50": sorted(v["p50s"])[len(v["p50s"]) // 2] if v["p50s"] else None,
                "p99": v["p99"],
            }
            for k, v in per_name.items()
        ),
        key=lambda t: (-t["done"], t["queue"], t["name"]),
    )
    return d.page(
        request,
        "over_time.html",
        title="Over time",
        window=window,
        windows=list(WINDOWS),
        queue=queue,
        name=name,
        queues=queues,
        names=names,
        other=OTHER,
        charts=charts,
        table=table[:100],
        width=width,
        recorded=len(rows),
        now=now,
    )


def workers_json(request: Request) -> Response:
    """What ``corral workers --json`` prints."""
    from corral.edges.workers import read_workers

    now, rows = read_workers(_dash(request).store)
    return JSONResponse({"at": now, "workers": [v.as_dict(now) for v in rows]})


def _batch_row(name: str, counts: dict[str, int]) -> dict[str, Any]:
    total = sum(counts.values()) or 1
    parts = [
        (s, counts.get(s, 0), 100.0 * counts.get(s, 0) / total)
        for s in ("SUCCESS", "FAILED", "TIMEOUT", "CANCELED", "RUNNING", "RESERVED", "RETRYING")
    ]
    final = sum(counts.get(s.value, 0) for s in (State.SUCCESS, State.FAILED, State.TIMEOUT, State.CANCELED))
    return {
        "name": name,
        "counts": counts,
        "total": sum(counts.values()),
        "status": batch_status(counts),
        "done_pct": 100.0 * final / total,
        "parts": [(status, n, pct) for status, n, pct in parts if n],
    }


def batches(request: Request) -> Response:
    d = _dash(request)
    after = request.query_params.get("after")
    rows = d.store.batch_list(after=after, limit=BATCH_PAGE + 1)
    more = len(rows) > BATCH_PAGE
    rows = rows[:BATCH_PAGE]
    return d.page(
        request,
        "batches.html",
        title="Batches",
        rows=[_batch_row(b, c) for b, c in rows],
        next_after=_last_batch_name(rows) if more else None,
        first=after is not None,
    )


def _last_batch_name(rows: list[tuple[str, dict[str, int]]]) -> str | None:
    """Where the next page of ``batch_list`` starts: after this page's last batch."""
    if not rows:
        return None
    name, _ = rows[-1]
    return name


def batch_detail(request: Request) -> Response:
    d = _dash(request)
    name = request.path_params["name"]
    summary = d.store.batch_summary(name)
    if summary.total == 0:
        return d.page(request, "error.html", status_code=404, title="Not found", error=f"no batch named {name!r}")
    dead = d.store.dead_letters(batch=name, limit=PAGE)
    return d.page(
        request,
        "batch.html",
        title=f"Batch {name}",
        s=summary,
        row=_batch_row(name, summary.counts),
        dead=dead,
    )


def _checkpoints(rec: TaskRecord) -> list[tuple[str, str]]:
    if not rec.checkpoint:
        return []
    try:
        data = loads(rec.checkpoint)
    except ValueError:
        return [("(unreadable)", truncate(rec.checkpoint))]
    if not isinstance(data, dict):
        return [("(checkpoint)", truncate(rec.checkpoint))]
    return [(str(k), truncate(json.dumps(v, ensure_ascii=False))) for k, v in data.items()]


def task_detail(request: Request) -> Response:
    d = _dash(request)
    tid = _int(request.path_params["task_id"])
    rec = d.store.get(tid) if tid is not None else None
    if rec is None:
        return d.page(request, "error.html", status_code=404, title="Not found", error=f"no task {tid}")
    timeline = [("submitted", rec.created_at, "")]
    if rec.run_at and rec.run_at > rec.created_at + 0.001:
        timeline.append(("due", rec.run_at, "may run from here" if rec.status.value != "RETRYING" else "retry due"))
    if rec.expires_at is not None:
        timeline.append(("deadline", rec.expires_at, "its first start must come before this (expires=)"))
    if rec.started_at:
        timeline.append(("started", rec.started_at, f"attempt {rec.attempt}"))
    if rec.finished_at:
        timeline.append(("finished", rec.finished_at, rec.status.value))
    try:
        for ev in d.store.events(limit=200):
            if ev.subject in (str(rec.id), task_subject(rec.id)):
                timeline.append((ev.kind, ev.at, truncate(ev.data, 300)))
    except NotImplementedError:
        pass
    timeline.sort(key=lambda entry: entry[1])  # (what, at, detail): by when
    duration = rec.finished_at - rec.started_at if rec.finished_at and rec.started_at else None
    reasons = explain_one(d.store, rec) if rec.status not in FINAL else []
    return d.page(
        request,
        "task.html",
        title=f"Task {rec.id}",
        live_task=rec.id,
        t=rec,
        status=rec.status.value,
        checkpoints=_checkpoints(rec),
        timeline=timeline,
        duration=duration,
        cancellable=rec.status in ACTIVE,
        retryable=rec.status.value in FINAL_STATES,
        why=reasons,
    )


def _task_list_page(request: Request, template: str, title: str, rows: list[TaskRecord], **ctx: Any) -> Response:
    d = _dash(request)
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    params = {k: v for k, v in request.query_params.items() if k not in ("after", "msg")}
    next_url = None
    if more and rows:
        next_url = request.url.path + "?" + urlencode({**params, "after": rows[-1].id})
    return d.page(request, template, title=title, rows=rows, next_url=next_url, **ctx)


#: The Tasks page's filters: query parameter -> TaskQuery field.
TASK_FILTERS = {
    "name": "name",
    "queue": "queue",
    "group": "group",
    "batch": "batch",
    "trace": "trace_id",
    "key": "key",
    "worker": "worker",
}
#: Age filters: query parameter -> TaskQuery field (``5m``, ``2h``, ``1d``).
AGE_FILTERS = {"older": "min_age", "newer": "max_age"}
STATE_NAMES = [s.value for s in (State.WAITING, State.PENDING, State.RETRYING, State.RESERVED, State.RUNNING)] + [
    s.value for s in (State.SUCCESS, State.FAILED, State.TIMEOUT, State.CANCELED)
]
#: States a task waits in: the Tasks page filtered to one of them has a "why" column.
WAITING_STATES = frozenset(s.value for s in (State.WAITING, State.PENDING, State.RETRYING, State.RESERVED))
#: Tasks one bulk retry or cancel may take (the newest of a larger set).
BULK_MAX = 10_000
#: How long a shown count may be confirmed, and how many may wait at once.
BULK_TTL = 600.0
BULK_PENDING = 32
#: The states each bulk action applies to.
BULK_STATES = {"retry": FINAL_STATES, "cancel": tuple(s.value for s in ACTIVE) + (State.RESERVED.value,)}


class BadFilter(ValueError):
    pass


def _task_query(request: Request) -> tuple[TaskQuery, dict[str, str]]:
    """The Tasks page's query from its URL, and the values shown in its form."""
    from corral.edges.task_lists import SORTS, TaskQuery, parse_age

    q = request.query_params
    shown = {
        "status": (q.get("status") or "").strip().upper(),
        **{p: (q.get(p) or "").strip() for p in (*TASK_FILTERS, *AGE_FILTERS)},
    }
    if shown["status"] and shown["status"] not in STATE_NAMES:
        raise BadFilter(f"unknown state {shown['status']!r}; one of {', '.join(STATE_NAMES)}")
    sort = (q.get("sort") or "submitted").strip()
    if sort not in SORTS:
        raise BadFilter(f"unknown sort {sort!r}; one of {', '.join(SORTS)}")
    query = TaskQuery(status=shown["status"] or None, sort=sort, after=q.get("after") or None, limit=PAGE)
    for param, attr in TASK_FILTERS.items():
        if shown[param]:
            setattr(query, attr, shown[param])
    for param, attr in AGE_FILTERS.items():
        if shown[param]:
            try:
                setattr(query, attr, parse_age(shown[param]))
            except ValueError as exc:
                raise BadFilter(str(exc)) from None
    return query, shown


def _list_params(request: Request) -> dict[str, str]:
    """The list's own parameters (its filters and sort), without the page or a message."""
    return {k: v for k, v in request.query_params.items() if k not in ("after", "msg", "action") and v}


def tasks(request: Request) -> Response:
    """Tasks filtered by state, name, queue, group, batch, trace id, key, worker and age
    (all that are given), sorted by submit time, age or state, paged by keyset."""
    from corral.edges.task_lists import SORTS, find_tasks

    d = _dash(request)
    try:
        query, shown = _task_query(request)
    except BadFilter as exc:
        return d.page(request, "error.html", status_code=400, title="Bad filter", error=str(exc))
    now = d.store.now()
    page = find_tasks(d.store, query, now)
    # the Tasks page filtered to a waiting state says why each row waits (one snapshot for the page)
    why = {k: v[0].text for k, v in explain(d.store, page.rows).items()} if query.status in WAITING_STATES else None
    filtered = any(shown.values())
    what = [f"{k} {v}" for k, v in shown.items() if v]
    heading = ("Tasks: " + ", ".join(what)) if filtered else "Newest tasks"
    params = _list_params(request)
    next_url = request.url.path + "?" + urlencode({**params, "after": page.next}) if page.next else None
    return d.page(
        request,
        "tasks.html",
        title="Tasks",
        rows=page.rows,
        now=now,
        next_url=next_url,
        heading=heading,
        f=shown,
        sort=query.sort,
        sorts=SORTS,
        states=STATE_NAMES,
        filtered=filtered,
        first_url=request.url.path + ("?" + urlencode(params) if params else ""),
        bulk_url="/tasks/bulk?" + urlencode(params),
        live_rows=",".join(str(r.id) for r in page.rows),
        why=why,
    )


def tasks_bulk(request: Request) -> Response:
    """The count a bulk retry or cancel of a filtered list would apply to, to confirm first.

    The ids that match now (at most ``BULK_MAX``, newest first) are kept under a
    one-time ticket for ``BULK_TTL`` seconds; confirming applies the action to
    those tasks only, each write guarded on its state as it is then."""
    from dataclasses import replace

    from corral.edges.task_lists import matching_ids

    d = _dash(request)
    if d.read_only:
        return PlainTextResponse("refused: this dashboard is read-only", status_code=403)
    act = request.query_params.get("action") or ""
    if act not in BULK_STATES:
        error = "action must be retry or cancel"
        return d.page(request, "error.html", status_code=400, title="Bad action", error=error)
    try:
        query, shown = _task_query(request)
    except BadFilter as exc:
        return d.page(request, "error.html", status_code=400, title="Bad filter", error=str(exc))
    if not any(shown.values()):
        error = "a bulk action needs a filter (a state, name, queue, group, batch, trace id, key, worker or age)"
        return d.page(request, "error.html", status_code=400, title="Bad filter", error=error)
    now = d.store.now()
    states = [s for s in BULK_STATES[act] if query.status in (None, s)]
    ids: list[int] = []
    for st in states:
        ids += matching_ids(d.store, replace(query, status=st, sort="submitted"), BULK_MAX + 1 - len(ids), now)
        if len(ids) > BULK_MAX:
            break
    ids = sorted(set(ids), reverse=True)
    capped = len(ids) > BULK_MAX
    ids = ids[:BULK_MAX]
    ticket = d.remember_bulk(act, ids)
    params = _list_params(request)
    what = ", ".join(f"{k} {v}" for k, v in shown.items() if v)
    return d.page(
        request,
        "bulk.html",
        title="Confirm",
        action=act,
        what=what,
        count=len(ids),
        count_text=f"{len(ids):,}".replace(",", " "),
        capped=capped,
        ticket=ticket,
        ttl_text=f"{int(BULK_TTL // 60)} minutes",
        back="/tasks?" + urlencode(params),
    )


def dead(request: Request) -> Response:
    """Dead letters (of one batch, if given), oldest first, paged by keyset as
    the Tasks page is: ``after`` is the last id of the page before."""
    d = _dash(request)
    batch = request.query_params.get("batch") or None
    after = _int(request.query_params.get("after"))
    rows = d.store.dead_letters(batch=batch, limit=PAGE + 1, after_id=after)
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    params = {k: v for k, v in request.query_params.items() if k in ("batch",) and v}
    next_url = request.url.path + "?" + urlencode({**params, "after": rows[-1].id}) if more else None
    return d.page(
        request,
        "dead.html",
        title="Dead letters",
        rows=rows,
        batch=batch,
        next_url=next_url,
        first_url=request.url.path + ("?" + urlencode(params) if params else ""),
    )


SEARCH_BY = ("any", "id", "trace", "key", "batch", "group")


def search(request: Request) -> Response:
    d = _dash(request)
    q = (request.query_params.get("q") or "").strip()
    by = request.query_params.get("by") or "any"
    if by not in SEARCH_BY:
        by = "any"
    after = _int(request.query_params.get("after"))
    rows: list[TaskRecord] = []
    if q:
        found: dict[int, TaskRecord] = {}
        if by in ("any", "id") and q.isdigit():
            rec = d.store.get(int(q))
            if rec is not None and (after is None or rec.id < after):
                found[rec.id] = rec
        fields = {"trace": "trace_id", "key": "key", "batch": "batch", "group": "group"}
        for name, attr in fields.items():
            if by in ("any", name):
                flt = TaskFilter(limit=PAGE + 1, after_id=after)
                setattr(flt, attr, q)
                for rec in d.store.list_tasks(flt):
                    found[rec.id] = rec
        rows = sorted(found.values(), key=lambda r: r.id, reverse=True)
    return _task_list_page(request, "search.html", "Search", rows, q=q, by=by, choices=SEARCH_BY)


# ---- actions --------------------------------------------------------------------------------
async def action(request: Request) -> Response:
    d = _dash(request)
    if d.read_only:
        return PlainTextResponse("refused: this dashboard is read-only", status_code=403)
    form = await d.check_csrf(request)
    if form is None:
        return PlainTextResponse("refused: missing or wrong CSRF token", status_code=403)
    what = request.path_params["what"]
    back = _safe_next(form.get("next"))
    try:
        msg: str | None
        if what == "bulk":
            msg = await anyio.to_thread.run_sync(_do_bulk, d, form)
        else:
            msg = await anyio.to_thread.run_sync(_do_action, d.store, what, form)
    except (CorralError, ValueError) as exc:
        msg = f"{what} refused: {exc}"
    if msg is None:
        return PlainTextResponse("unknown action", status_code=404)
    # the page it goes back to shows what the action did, not the look before it
    await anyio.to_thread.run_sync(d.sampler.tick)
    sep = "&" if "?" in back else "?"
    return RedirectResponse(back + sep + urlencode({"msg": msg}), status_code=303)


def _do_bulk(d: Dashboard, form: dict[str, str]) -> str:
    taken = d.take_bulk(form.get("ticket", ""))
    if taken is None:
        return "bulk action refused: its count was not confirmed in time or was used already; ask again"
    act, ids = taken
    done = 0
    for tid in ids:
        if act == "retry":
            done += bool(d.store.retry(tid))
        else:
            rec = d.store.get(tid)
            if rec is not None and rec.status.value in BULK_STATES["cancel"]:
                done += d.store.cancel(tid) is not None
    left = len(ids) - done
    verb = "queued again" if act == "retry" else "canceled (running ones stop at their worker)"
    n = f"{done:,}".replace(",", " ")
    return f"{n} of {len(ids)} tasks {verb}" + (f"; {left} had changed state and were left" if left else "")


def _do_action(store: Store, what: str, form: dict[str, str]) -> str | None:
    if what == "cancel":
        tid = int(form.get("task_id", ""))
        rec = store.cancel(tid)
        if rec is None:
            return f"no task {tid}"
        if rec.status in (State.RUNNING, State.RESERVED):
            return f"task {tid}: cancel asked; its worker stops it"
        return f"task {tid} is {rec.status.value}"
    if what == "retry":
        tid = int(form.get("task_id", ""))
        return f"task {tid} queued again" if store.retry(tid) else f"task {tid} cannot be retried in its state"
    if what == "retry-dead":
        batch = form.get("batch") or None
        ids = store.retry_dead(batch=batch)
        where = f" of batch {batch}" if batch is not None else ""
        return f"{len(ids)} dead letters{where} queued again"
    if what == "breaker":
        name, state = form.get("name", ""), form.get("state", "")
        target = {"open": BreakerState.OPEN, "close": BreakerState.CLOSED}.get(state)
        if target is None:
            raise ValueError("state must be open or close")
        store.force_breaker(name, target, form.get("reason") or f"{state}ed from the dashboard")
        return f"breaker {name} {'opened' if target is BreakerState.OPEN else 'closed'}"
    if what == "limit":
        from corral.core.limits import describe_settings, parse_changes

        name = form.get("name", "")
        if form.get("reset"):
            spec = store.change_limit(name, {}, by="dashboard", reset=True)
            return f"limit {name}: {describe_settings(spec.settings())}, as declared"
        changes = parse_changes(form.get("concurrency"), form.get("rate"), form.get("burst"))
        if not changes:
            raise ValueError("name a concurrency, a rate or a burst to change ('none' clears one)")
        spec = store.change_limit(name, changes, by="dashboard")
        return f"limit {name}: {describe_settings(spec.settings())}, set from the dashboard"
    if what == "level":
        from corral.engine.level_follower import set_level

        lv = set_level(store, form.get("level", ""), reason=form.get("reason") or "set from the dashboard")
        if (form.get("level") or "").strip().lower() == "auto":
            return "level handed back to the automatic rules"
        return f"level set to L{lv.value} {lv.name} by hand"
    if what == "pause":
        state = form.get("state", "")
        if state not in ("pause", "resume"):
            raise ValueError("state must be pause or resume")
        kind = form.get("kind", "")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        kind, name = check_target(**{kind: form.get("name", "")})
        if state == "pause":
            done = store.pause(kind, name, "dashboard")
            return f"{kind} {name} paused" if done else f"{kind} {name} was already paused"
        done = store.resume(kind, name, "dashboard")
        return f"{kind} {name} resumed" if done else f"{kind} {name} is not paused: nothing to resume"
    return None


# ---- live stream, JSON, metrics, login ----------------------------------------------------------
def _task_live(store: Store, tid: int) -> dict[str, Any] | None:
    rec = store.get(tid)
    if rec is None:
        return None
    return {
        "id": rec.id,
        "status": rec.status.value,
        "attempt": str(rec.attempt),
        "progress": "–" if rec.progress is None else f"{rec.progress:.0%}",
        "progress_value": rec.progress,
        "progress_message": rec.progress_message or "",
        "error": rec.error or "",
        "why": explain_one(store, rec)[0].text if rec.status not in FINAL else "",
    }


def _row_ids(text: str | None) -> list[int]:
    """The ids of a list's rows to follow (``?rows=3,2,1``), at most a page's."""
    out = []
    for part in (text or "").split(",")[:PAGE]:
        if part.strip().isdigit():
            out.append(int(part))
    return out


def _rows_live(store: Store, ids: list[int]) -> list[dict[str, Any]]:
    """The changing cells of a list's rows: one read of their id range when
    it is dense (a page of newest tasks), else one read per row (a page at most)."""
    lo, hi = min(ids), max(ids)
    if hi - lo < 4 * len(ids) + 50:
        wanted = set(ids)
        recs = [r for r in store.list_tasks(TaskFilter(min_id=lo, max_id=hi, limit=hi - lo + 1)) if r.id in wanted]
    else:
        recs = [r for r in map(store.get, ids) if r is not None]
    out = []
    for rec in recs:
        out.append(
            {
                "id": rec.id,
                "status": rec.status.value,
                "attempt": f"{rec.attempt}/{rec.max_retries + 1}",
                "error": truncate(rec.error or "", 120),
            }
        )
    return out


async def stream(request: Request) -> Response:
    """Server-sent events: ``snapshot`` every second, ``event`` for each new store event,
    ``task`` with the watched task's state (``?task=ID``), ``row`` when a row of a
    list changes (``?rows=ID,ID,...``, the ids a page shows)."""
    d = _dash(request)
    tid = _int(request.query_params.get("task"))
    watched = _row_ids(request.query_params.get("rows"))
    rows_seen: dict[int, dict[str, Any]] = {}

    async def gen() -> AsyncIterator[str]:
        last_event = None
        try:
            evs = await anyio.to_thread.run_sync(lambda: d.store.events(limit=1))
            last_event = evs[0].id if evs else 0
        except NotImplementedError:
            pass
        yield "retry: 2000\n\n"
        while not d.stopping:
            snap = d.sampler.snapshot()
            yield f"event: snapshot\ndata: {json.dumps(snap)}\n\n"
            if last_event is not None:
                evs = await anyio.to_thread.run_sync(lambda: d.store.events(limit=50))
                for ev in sorted((e for e in evs if e.id > last_event), key=lambda e: e.id):
                    last_event = ev.id
                    item = {"id": ev.id, "at": when(ev.at), "kind": ev.kind, "subject": ev.subject, "data": ev.data}
                    yield f"event: event\ndata: {json.dumps(item)}\n\n"
            if tid is not None:
                live = await anyio.to_thread.run_sync(_task_live, d.store, tid)
                if live is not None:
                    yield f"event: task\ndata: {json.dumps(live)}\n\n"
            if watched:
                for row in await anyio.to_thread.run_sync(_rows_live, d.store, watched):
                    if rows_seen.get(row["id"]) != row:  # the first look too: a change since the page drew
                        yield f"event: row\ndata: {json.dumps(row)}\n\n"
                        rows_seen[row["id"]] = row
            for _ in range(10):
                if d.stopping or await request.is_disconnected():
                    return
                await asyncio.sleep(d.interval / 10)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(gen(), media_type="text/event-stream", headers=headers)


def snapshot_json(request: Request) -> Response:
    return JSONResponse(_dash(request).sampler.snapshot())


def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(_dash(request).metrics_text(), media_type=CONTENT_TYPE_LATEST)


def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def login(request: Request) -> Response:
    d = _dash(request)
    nxt = _safe_next(request.query_params.get("next"))
    if request.method == "POST":
        form = await request.form()
        given = form.get("token")
        nxt = _safe_next(str(form.get("next") or "/"))
        if d.token is not None and isinstance(given, str) and _same(given, d.token):
            resp = RedirectResponse(nxt, status_code=303)
            resp.set_cookie(TOKEN_COOKIE, d.token, httponly=True, samesite="strict")
            return resp
        html = d.env.get_template("login.html").render(next=nxt, failed=True, title="Log in")
        return HTMLResponse(html, status_code=401)
    html = d.env.get_template("login.html").render(next=nxt, failed=False, title="Log in")
    return HTMLResponse(html)


def create_app(store: Store, *, token: str | None = None, read_only: bool = False, interval: float = 1.0) -> Starlette:
    """The dashboard as an ASGI app over ``store`` (the sampler starts with the app's lifespan)."""
    dash = Dashboard(store, token=token, read_only=read_only, interval=interval)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        dash.stopping = False
        dash.sampler.start()
        try:
            yield
        finally:
            dash.stopping = True
            dash.sampler.stop()

    routes = [
        Route("/", overview),
        Route("/queues", queues),
        Route("/groups", groups),
        Route("/workers", workers),
        Route("/api/workers", workers_json),
        Route("/limits", limits),
        Route("/schedules", schedules),
        Route("/events", events_page),
        Route("/over-time", over_time),
        Route("/batches", batches),
        Route("/batches/{name:path}", batch_detail),
        Route("/tasks", tasks),
        Route("/tasks/bulk", tasks_bulk),
        Route("/tasks/{task_id}", task_detail),
        Route("/dead", dead),
        Route("/search", search),
        Route("/stream", stream),
        Route("/api/snapshot", snapshot_json),
        Route("/metrics", metrics),
        Route("/healthz", healthz),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/actions/{what}", action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(AuthMiddleware)], lifespan=lifespan)
    app.state.dash = dash
    return app


__all__ = ["create_app", "Dashboard", "DEAD"]
