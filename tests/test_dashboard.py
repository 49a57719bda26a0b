"""The dashboard over plain HTTP: binding rules, the token, CSRF, read-only, /metrics, and its pure parts."""

from __future__ import annotations

import http.cookiejar
import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from corral.core.claims import ClaimRequest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from click.testing import CliRunner  # noqa: E402

from corral.cli import cli  # noqa: E402
from corral.core.clock import FakeClock  # noqa: E402
from corral.core.model import NewTask  # noqa: E402
from corral.core.series import Series  # noqa: E402
from corral.edges.dashboard import check_bind, is_loopback, serve_background  # noqa: E402
from corral.edges.dashboard.sampler import Sampler  # noqa: E402
from corral.errors import ConfigError  # noqa: E402
from corral.stores import open_store  # noqa: E402
from helpers import ARGS


class Client:
    """A cookie-keeping HTTP client that reports status codes instead of raising."""

    def __init__(self, base: str, headers: dict[str, str] | None = None):
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect())
        self.headers = headers or {}

    def request(self, path: str, data: dict[str, str] | None = None, accept: str = "text/html") -> tuple[int, str]:
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        req = urllib.request.Request(self.base + path, data=body, headers={"Accept": accept, **self.headers})
        try:
            with self.opener.open(req, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def csrf(self) -> str:
        return next(c.value for c in self.jar if c.name == "corral_csrf")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'd.db'}")
    s.migrate()
    yield s
    s.close()


def test_loopback_addresses():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.1.2.3")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.com")
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "long-enough-token")
    with pytest.raises(ConfigError, match="without --token"):
        check_bind("0.0.0.0", None)


def test_serve_background_refuses_a_public_address_without_token(store):
    with pytest.raises(ConfigError, match="without --token"):
        serve_background(store, host="0.0.0.0")


def test_cli_refuses_a_public_address_without_token(tmp_path):
    db = tmp_path / "never.db"
    result = CliRunner().invoke(
        cli, ["dashboard", "--store", f"sqlite:///{db}", "--host", "0.0.0.0", "--port", "0"], standalone_mode=True
    )
    assert result.exit_code != 0
    assert "without --token" in result.output
    assert not db.exists()  # nothing opened, nothing stored


def test_pages_and_csrf_over_http(store):
    (tid,) = [r.id for r in store.submit([NewTask(name="t", args=ARGS, queue="parked")])]
    dash = serve_background(store)
    try:
        c = Client(dash.url)
        for path in ("/", "/queues", "/groups", "/limits", "/batches", "/tasks", f"/tasks/{tid}", "/dead", "/search"):
            status, body = c.request(path)
            assert status == 200, path
        assert c.request("/tasks/999999")[0] == 404
        # no token in the form: refused, nothing changes
        status, body = c.request("/actions/cancel", {"task_id": str(tid)})
        assert status == 403 and "CSRF" in body
        assert store.get(tid).status.value == "PENDING"
        # the right token in the form but no cookie (another site's form): refused
        bare = Client(dash.url)
        assert bare.request("/actions/cancel", {"task_id": str(tid), "csrf": c.csrf()})[0] == 403
        assert store.get(tid).status.value == "PENDING"
        # form and cookie: done, and sent back where it came from, never to another site
        status, _ = c.request("/actions/cancel", {"task_id": str(tid), "csrf": c.csrf(), "next": "//evil.example/"})
        assert status == 303
        assert store.get(tid).status.value == "CANCELED"
    finally:
        dash.stop()


def test_token_guards_every_request(store):
    token = "s3cret-token-value"
    dash = serve_background(store, token=token)
    try:
        anon = Client(dash.url)
        status, _ = anon.request("/")
        assert status == 303  # to the login form
        assert anon.request("/metrics", accept="text/plain")[0] == 401
        assert anon.request("/stream", accept="text/event-stream")[0] == 401
        assert anon.request("/login")[0] == 200
        assert anon.request("/login", {"token": "wrong"})[0] == 401
        assert anon.request("/")[0] == 303
        assert anon.request("/login", {"token": token, "next": "/queues"})[0] == 303
        assert anon.request("/queues")[0] == 200  # the cookie now
        bearer = Client(dash.url, headers={"Authorization": f"Bearer {token}"})
        assert bearer.request("/metrics", accept="text/plain")[0] == 200
    finally:
        dash.stop()


def test_read_only_shows_no_actions_and_refuses_them(store):
    (tid,) = [r.id for r in store.submit([NewTask(name="t", args=ARGS)])]
    dash = serve_background(store, read_only=True)
    try:
        c = Client(dash.url)
        status, body = c.request(f"/tasks/{tid}")
        assert status == 200 and "/actions/" not in body and "read-only" in body
        assert c.request("/actions/cancel", {"task_id": str(tid), "csrf": c.csrf()})[0] == 403
        assert store.get(tid).status.value == "PENDING"
    finally:
        dash.stop()


def test_metrics_parse_as_prometheus_text(store):
    from prometheus_client.parser import text_string_to_metric_families

    store.submit([NewTask(name="t", args=ARGS), NewTask(name="t", args=ARGS, queue="q2")])
    dash = serve_background(store)
    try:
        status, body = Client(dash.url).request("/metrics", accept="text/plain")
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(body)}
        assert families["corral_queue_depth"].samples[0].value == 2
        assert {s.labels["state"] for s in families["corral_tasks"].samples} >= {"PENDING", "RUNNING"}
    finally:
        dash.stop()


def test_snapshot_json_and_store_events_stream(store):
    store.add_event("level", "fleet", json.dumps({"to": "WARNING"}))
    dash = serve_background(store)
    try:
        c = Client(dash.url)
        status, body = c.request("/api/snapshot", accept="application/json")
        snap = json.loads(body)
        assert status == 200 and snap["depth"] == 0 and len(snap["points"]) == 60 and len(snap["alerts"]) == 4
        req = urllib.request.Request(dash.url + "/stream", headers={"Accept": "text/event-stream"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            seen = []
            while "event: snapshot" not in seen:
                seen.append(resp.readline().decode().strip())
            store.add_event("level", "fleet", json.dumps({"to": "DEGRADED"}))
            line = ""
            while not line.startswith("data: ") or "DEGRADED" not in line:
                line = resp.readline().decode().strip()
            assert json.loads(line[6:])["kind"] == "level"
    finally:
        dash.stop()


# ---- pure parts ---------------------------------------------------------------------------


def test_series_rates_and_p99_by_minute():
    s = Series()
    t0 = 1_000_020.0
    s.finished([("SUCCESS", t0 - 1.0, t0)] * 19 + [("FAILED", t0 - 3.0, t0), ("CANCELED", None, t0)])
    assert s.success_rate(t0) == pytest.approx(0.95)
    assert s.p99(t0) == pytest.approx(3.0)
    pts = s.points(t0)
    assert len(pts) == 60 and pts[-1].success_rate == pytest.approx(0.95) and pts[0].running is None
    # an hour later it is all forgotten
    assert s.success_rate(t0 + 3700) is None and all(p.success_rate is None for p in s.points(t0 + 3700))


def test_series_sorts_durations_again_only_when_they_changed(monkeypatch):
    import corral.core.series as series

    sorts = []
    real = series.percentile
    monkeypatch.setattr(series, "percentile", lambda values, q: sorts.append(len(values)) or real(values, q))
    s = Series()
    t0 = 1_000_020.0
    s.finished([("SUCCESS", t0 - 1.0, t0)] * 50 + [("SUCCESS", t0 - 2000.0, t0 - 1980.0)] * 50)
    first = (s.points(t0), s.alerts(t0), s.p99(t0))
    n = len(sorts)
    assert (s.points(t0), s.alerts(t0), s.p99(t0)) == first and len(sorts) == n  # nothing new: nothing sorted
    s.finished([("SUCCESS", t0 - 9.0, t0)] * 5)  # new durations: the p99 moves
    assert s.p99(t0) == pytest.approx(9.0) and s.points(t0)[-1].p99 == pytest.approx(9.0)
    assert len(sorts) > n


def test_series_alerts_follow_the_rules():
    s = Series()
    t = 2_000_000.0
    names = lambda: {a.name for a in s.alerts(t) if a.firing}  # noqa: E731
    s.sample(t, running=5, depth=600, limits={"api": (5, 3)})
    assert names() == set()  # crossed, but not for long enough
    for _ in range(10):
        t += 60
        s.sample(t, running=5, depth=600, limits={"api": (5, 3)})
    assert names() == {"CorralQueueBacklog", "CorralRunningAboveLimit"}
    s.sample(t, running=0, depth=10, limits={"api": (1, 3)})
    assert names() == set()
    # usual P99 1 s for the earlier hour, 3 s over the last ten minutes; success 50%
    s.finished([("SUCCESS", t - 1801.0, t - 1800.0)] * 100)
    s.finished([("SUCCESS", t - 3.0, t), ("FAILED", t - 3.0, t)])
    assert names() == {"CorralP99DurationHigh", "CorralSuccessRateLow"}


def test_sampler_reads_new_finishes_once():
    clock = FakeClock()
    store = open_store("memory://", clock=clock)
    store.submit([NewTask(name="t", args=ARGS) for _ in range(3)])
    sampler = Sampler(store)
    assert sampler.tick()["depth"] == 3
    from corral.core.model import Outcome
    from corral.core.states import State

    for claim in store.claim("w", ClaimRequest(["default"], 3)):
        t = claim.tasks[0]
        store.complete([Outcome(t.id, t.lease_token, t.version, State.SUCCESS)])
    snap = sampler.tick()
    snap = sampler.tick()  # a second look at the same instant counts nothing twice
    assert snap["depth"] == 0 and snap["success_rate"] == 1.0
    assert sum(b.ok for b in sampler.series._buckets.values()) == 3


def _finish(store, n: int) -> None:
    from corral.core.model import Outcome
    from corral.core.states import State

    for claim in store.claim("w", ClaimRequest(["default"], n)):
        t = claim.tasks[0]
        store.complete([Outcome(t.id, t.lease_token, t.version, State.SUCCESS)])


def test_sampler_counts_finishes_in_the_store_once_a_minute_keeps_no_more_durations(tmp_path, monkeypatch):
    """Past a minute's durations the sampler reads counts, no rows: every
    finish counted once (ties at the last row read too), over minutes."""
    import corral.core.series as series

    monkeypatch.setattr(series, "MAX_DURATIONS", 3)
    clock = FakeClock(6_000_005.0)  # 5 s into a minute
    store = open_store(f"sqlite:///{tmp_path / 'c.db'}", clock=clock)
    store.migrate()
    rows_read = []
    recent = store.recent_finished
    monkeypatch.setattr(store, "recent_finished", lambda *a, **k: rows_read.append(len(r := recent(*a, **k))) or r)
    store.submit([NewTask(name="t", args=ARGS) for _ in range(12)])
    sampler = Sampler(store)
    sampler.tick()
    _finish(store, 4)  # four at one instant: the look's last rows tie
    sampler.tick()
    assert sum(rows_read) == 4
    clock.advance(2)
    _finish(store, 6)
    clock.advance(3)
    sampler.tick()
    sampler.tick()  # a second look at the same instant counts nothing twice
    ok = lambda: sum(b.ok for b in sampler.series._buckets.values())  # noqa: E731
    assert ok() == 10 and sum(rows_read) == 4  # the six counted in the store
    assert sum(len(b.durations) for b in sampler.series._buckets.values()) == 3
    clock.advance(60)  # the next minute keeps its durations again
    _finish(store, 2)
    clock.advance(2)
    sampler.tick()
    assert ok() == 12 and sum(rows_read) == 6
    store.close()


def test_finished_counts_are_the_finished_rows_by_minute_and_state(durable_url):
    store = open_store(durable_url)
    store.migrate()
    try:
        store.submit([NewTask(name="t", args=ARGS) for _ in range(5)])
        _finish(store, 5)
        now = store.now()
        rows = store.recent_finished(now - 600, 100)
        counts = store.finished_counts(now - 600, now + 1)
        assert sum(n for _, st, n in counts if st == "SUCCESS") == len(rows) == 5
        assert {m for m, _, _ in counts} == {r.finished_at // 60 * 60 for r in rows}
        assert store.finished_counts(now + 1, now + 2) == []
    finally:
        store.close()


def test_series_thresholds_are_those_of_the_alert_rules():
    """The overview's alerts and docs/alerts.yml must say the same numbers."""
    import re
    from pathlib import Path

    from corral.core import series

    rules = (Path(__file__).resolve().parents[1] / "docs" / "alerts.yml").read_text()
    assert f"max(corral_queue_depth) > {series.QUEUE_DEPTH_LIMIT}" in rules
    assert f"corral:task_success_ratio:10m < {series.SUCCESS_RATE_MIN}" in rules
    assert re.search(rf"> {series.P99_FACTOR:g} \* avg_over_time", rules)
    fors = re.findall(r"alert: (\w+)\n\s+expr:[^\n]*(?:\n(?!\s+for:)[^\n]*)*\n\s+for: (\d+)m", rules)
    minutes = dict(fors)
    assert int(minutes["CorralRunningAboveLimit"]) * 60 == series.RUNNING_OVER_LIMIT_FOR
    assert int(minutes["CorralQueueBacklog"]) * 60 == series.QUEUE_DEPTH_FOR


def test_cli_says_in_one_line_when_the_port_is_taken(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            cli, ["dashboard", "--store", f"sqlite:///{tmp_path / 'x.db'}", "--port", str(port)]
        )
    assert result.exit_code != 0
    assert "cannot listen on 127.0.0.1" in result.output


def test_without_token_only_loopback_host_names_are_answered(store):
    dash = serve_background(store)
    try:
        assert Client(dash.url, headers={"Host": "localhost:1234"}).request("/queues")[0] == 200
        status, body = Client(dash.url, headers={"Host": "attacker.example"}).request("/queues")
        assert status == 403 and "loopback" in body
    finally:
        dash.stop()


def test_the_page_after_set_level_shows_the_level_set_by_hand(store):
    """The sampler looks once a second; the page an action goes back to must
    not show its look from before the action (L0 automatic under a flash
    saying L2 by hand)."""
    dash = serve_background(store)
    try:
        c = Client(dash.url)
        assert "(automatic)" in c.request("/")[1]
        data = {"level": "DEGRADED", "reason": "partner outage", "csrf": c.csrf(), "next": "/"}
        status, _ = c.request("/actions/level", data)
        assert status == 303
        body = c.request("/?msg=x")[1]
        assert "L2 DEGRADED</b> (set by hand): partner outage" in body
    finally:
        dash.stop()


def test_the_tasks_page_filters_and_refuses_a_state_that_is_none(store):
    from corral.core.model import Outcome
    from corral.core.states import State

    ids = [r.id for r in store.submit([NewTask(name=n, args=ARGS) for n in ("a", "b", "a")])]
    (c,) = store.claim("w", ClaimRequest(["default"], 1))
    store.complete([Outcome(c.tasks[0].id, c.token, c.tasks[0].version, State.FAILED, error="boom")])
    dash = serve_background(store)
    try:
        c = Client(dash.url)
        status, body = c.request("/tasks?status=FAILED")
        assert status == 200 and f'href="/tasks/{ids[0]}"' in body
        assert f'href="/tasks/{ids[1]}"' not in body and f'href="/tasks/{ids[2]}"' not in body
        status, body = c.request("/tasks?name=a&status=pending")  # a state in any case
        assert status == 200 and f'href="/tasks/{ids[2]}"' in body and f'href="/tasks/{ids[1]}"' not in body
        status, body = c.request("/tasks?status=BROKEN")
        assert status == 400 and "unknown state" in body
        status, body = c.request("/api/workers", accept="application/json")
        assert status == 200 and json.loads(body)["workers"] == []
    finally:
        dash.stop()
