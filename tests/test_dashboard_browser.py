"""The dashboard in headless Chromium, against a real SQLite store with a running worker.

Clicks through every page and every action, checks the live stream changes the
page without a reload, that script payloads in args, error text and group names
are shown as text and never run, and that an action without its CSRF token is
refused. Saves a screenshot of each page: in a temporary directory, or under
``$CORRAL_SCREENSHOTS`` (``make screenshots`` refreshes docs/screenshots/), so a
test run leaves the tracked images alone.

Playwright drives Debian's Chromium (/usr/bin/chromium); ``make test``
installs it when missing (as root). Without it these tests skip, saying so;
in CI (``CI`` set) they fail instead.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from pathlib import Path

import pytest

from corral import App
from corral.core.breaker import BreakerState
from corral.core.model import TaskFilter
from corral.core.states import State
from corral.edges.dashboard import serve_background
from faults import AppWorker
from helpers import in_ci, missing, wait_for

CHROMIUM = os.environ.get("CORRAL_TEST_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(os.environ.get("CORRAL_SCREENSHOTS") or Path(tempfile.gettempdir()) / "corral-screenshots")
XSS = "<img src=x onerror=window.__xss=1><script>window.__xss=1</script>"

try:
    from playwright import sync_api
except ImportError:
    WHY_NOT: str | None = "playwright is not installed (pip install playwright)"
else:
    WHY_NOT = (
        None
        if os.access(CHROMIUM, os.X_OK)
        else f"{CHROMIUM} not found: install Debian's chromium (make test does, as root) to run the browser tests"
    )
if WHY_NOT is not None and not in_ci():
    pytest.skip(WHY_NOT, allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def _browser_present():
    """In CI a missing browser fails each test here (not the whole collection)."""
    if WHY_NOT is not None:
        missing(WHY_NOT)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    db = tmp_path_factory.mktemp("dash") / "dash.db"
    app = App(f"sqlite:///{db}")
    gate = threading.Event()
    app.limit("partner", concurrency=3)
    app.breaker("partner")

    @app.task(name="hold", limits=["partner"])
    def hold(ctx, n):
        ctx.progress(0.5, "half way")
        ctx.checkpoint("fetched", {"page": n})
        gate.wait(60)
        return n

    @app.task(name="ok")
    def ok(x):
        return x

    @app.task(name="boom", halt_group_on_failure=True)
    def boom(text):
        raise RuntimeError(text)

    ids = {}
    ids["xss_fail"] = app.submit("boom", [XSS], group=XSS, batch="b-partial", trace_id="trace-xss").id
    app.submit("boom", ["behind"], group=XSS)  # held behind the failed head
    for i in range(3):
        app.submit("ok", [i], batch="b-partial")
    ids["fail2"] = app.submit("boom", ["plain failure"], batch="b-partial").id
    ids["holding"] = app.submit("hold", [1], group="merchant-1", trace_id="trace-hold").id
    app.submit("hold", [2], group="merchant-1")
    app.start(workers=4)
    wait_for(lambda: app.batch_status("b-partial").counts.get("SUCCESS", 0) == 3, 30, message="batch ran")
    wait_for(lambda: app.get(ids["fail2"]).status is State.FAILED, 30, message="failure stored")
    wait_for(lambda: app.get(ids["holding"]).status is State.RUNNING, 30, message="hold runs")
    # parked work: a queue no worker serves, so its tasks stay PENDING for the actions
    ids["parked"] = app.submit("ok", ["parked"], queue="parked", key="key-parked").id
    dash = serve_background(app.store)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-background-networking"])
        context = browser.new_context(viewport={"width": 1200, "height": 760})
        page = context.new_page()
        page.set_default_timeout(15_000)
        try:
            yield app, dash, page, ids
        finally:
            context.close()
            browser.close()
            gate.set()
            dash.stop()
            app.close(timeout=30)


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def no_script_ran(page) -> None:
    assert page.evaluate("window.__xss === undefined"), "an injected script ran"


def test_click_through_every_page(env):
    app, dash, page, ids = env
    page.goto(dash.url + "/")
    assert page.locator("h1").inner_text() == "Overview"
    wait_for(lambda: page.get_attribute("body", "data-updates"), 15, message="first live update")
    page.wait_for_selector("svg[data-chart='running'] path", state="attached")
    shot(page, "overview")
    for link, heading, name in [
        ("Queues", "Queues", "queues"),
        ("Groups", "Groups", "groups"),
        ("Workers", "Workers", "workers"),
        ("Limits & breakers", "Limits and breakers", "limits"),
        ("Batches", "Batches", "batches"),
        ("Tasks", "Newest tasks", "tasks"),
        ("Dead letters", "Dead letters", "dead"),
        ("Schedules", "Schedules", "schedules"),
        ("Events", "Events", "events"),
        ("Over time", "Over time", "over-time"),
    ]:
        page.click(f"header nav >> text={link}")
        page.wait_for_url(f"**/{name if name != 'overview' else ''}*")
        assert page.locator("h1").inner_text().startswith(heading)
        shot(page, name)
    page.goto(dash.url + "/events?kind=failed")
    kinds = page.locator("#event-list tbody tr td:nth-child(3)").all_inner_texts()
    assert kinds and set(kinds) == {"failed"}
    page.goto(dash.url + "/queues")
    assert "parked" in page.locator("table").inner_text()
    page.goto(dash.url + "/groups")
    first_row = page.locator("table tbody tr").first
    assert "blocked" in first_row.inner_text()  # the failed, halting head comes first
    page.goto(dash.url + "/limits")
    assert "partner" in page.locator("table").first.inner_text()
    page.goto(dash.url + "/batches")
    page.click("text=b-partial")
    assert "PARTIAL_SUCCESS" in page.locator("h1").inner_text()
    assert page.locator(".bar .seg-success").count() == 1
    shot(page, "batch")
    page.goto(dash.url + f"/tasks/{ids['holding']}")
    assert "trace-hold" in page.inner_text("dl.facts")
    assert "fetched" in page.inner_text("main")  # checkpoint
    assert "half way" in page.inner_text("main")  # progress message
    shot(page, "task")
    # search: by trace id (the header box), by key, by batch, by group
    page.fill("header .search input", "trace-hold")
    page.press("header .search input", "Enter")
    page.wait_for_url("**/search?q=trace-hold*")
    assert page.locator("table.tasks tbody tr").count() == 1
    shot(page, "search")
    for q, by, expect in [("key-parked", "key", ids["parked"]), ("b-partial", "batch", ids["fail2"])]:
        page.goto(dash.url + f"/search?q={q}&by={by}")
        assert str(expect) in page.inner_text("table.tasks")
    page.goto(dash.url + "/search?q=merchant-1&by=group")
    assert page.locator("table.tasks tbody tr").count() == 2
    no_script_ran(page)


def test_the_tasks_filters_find_what_is_asked_with_ages(env):
    app, dash, page, ids = env
    page.goto(dash.url + "/tasks")
    page.select_option("#task-filters select[name=status]", "FAILED")
    page.click("#task-filters button")
    page.wait_for_url("**/tasks?status=FAILED*")
    rows = page.locator("table.tasks tbody tr")
    failed = {t.id for t in app.store.list_tasks(TaskFilter(status=State.FAILED, limit=100))}
    assert rows.count() == len(failed) == 2
    assert {int(t) for t in rows.locator("td:first-child").all_inner_texts()} == failed
    assert set(rows.locator("td:nth-child(3)").all_inner_texts()) == {"FAILED"}
    # each row says how long ago it ended and what it took; the submit's age with its time
    for text in rows.locator("td.age:nth-child(4)").all_inner_texts():
        assert re.fullmatch(r"ended \d+(s|m \d\ds) ago, took \d+(\.\d+)? ?(ms|s)", text), text
    assert re.fullmatch(r"\d+(s|m \d\ds) ago", rows.locator("td.age time").first.inner_text())
    shot(page, "tasks-filtered")
    # state and name together, kept in the form; a queue alone
    page.goto(dash.url + "/tasks?status=SUCCESS&name=ok")
    assert page.locator("#task-filters select[name=status]").input_value() == "SUCCESS"
    assert page.locator("#task-filters input[name=name]").input_value() == "ok"
    assert set(page.locator("table.tasks tbody tr td:nth-child(2)").all_inner_texts()) == {"ok"}
    assert page.locator("table.tasks tbody tr").count() == 3
    page.goto(dash.url + "/tasks?queue=parked")
    texts = page.locator("table.tasks tbody tr td:nth-child(6)").all_inner_texts()
    assert texts and set(texts) == {"parked"}
    assert page.locator("table.tasks tbody tr td:first-child").all_inner_texts()[-1] == str(ids["parked"])
    page.goto(dash.url + "/tasks?queue=parked&status=PENDING")
    waiting = page.locator("table.tasks tbody tr td.age:nth-child(4)").all_inner_texts()
    assert waiting and all(re.fullmatch(r"waiting \d+(s|m \d\ds)", t) for t in waiting), waiting
    page.click("text=clear")
    page.wait_for_url(dash.url + "/tasks")
    assert page.locator("h1").inner_text() == "Newest tasks"


def test_workers_page_shows_a_killed_worker_dead_with_what_it_held(env, tmp_path):
    app, dash, page, ids = env
    # the live in-process worker of the shared store, with the task it holds
    page.goto(dash.url + "/workers")
    live = page.locator("table.workers tbody tr.alive")
    assert live.count() == 1 and str(ids["holding"]) in live.first.inner_text()
    # a worker process on a store of its own, killed with kill -9 while it runs a task
    url = f"sqlite:///{tmp_path / 'killed.db'}"
    submitter = App(url)

    @submitter.task(name="slow", retries=3)
    def slow(first_run: float) -> int:  # body runs in the worker process
        raise AssertionError

    held = slow.submit(120, group="g-killed").id
    worker = AppWorker(url, tmp_path / "runs.jsonl", tmp_path / "w.log", concurrency=2, lease_seconds=3)
    other = serve_background(submitter.store)
    try:
        worker.wait_ready()
        wait_for(lambda: submitter.get(held).status is State.RUNNING, 30, message="the worker runs the task")
        # a task behind the held head says why it waits, and follows the kill live
        behind = slow.submit(0, group="g-killed").id
        page.goto(other.url + f"/tasks/{behind}")
        why = page.locator("[data-task=why]")
        assert f"behind its group's head, task {held} (slow), RUNNING on worker" in why.inner_text()
        assert worker.pid in why.inner_text() and "dead" not in why.inner_text()
        page.evaluate("window.__same_page = true")
        worker.kill()
        wait_for(lambda: "(dead: " in why.inner_text(), 30, message="the why of the task behind says dead, live")
        assert page.evaluate("window.__same_page === true")  # no reload happened
        assert "lease lost" in why.inner_text() and worker.pid in why.inner_text()
        shot(page, "task-why")
        page.goto(other.url + "/workers")

        def dead_row():
            page.reload()
            row = page.locator("table.workers tbody tr.dead")
            return row if row.count() == 1 else None

        row = wait_for(dead_row, 30, interval=0.5, message="the killed worker shown dead")
        assert worker.pid in row.inner_text() and "DEAD" in row.inner_text()
        link = row.locator("td.held a")
        assert link.inner_text() == str(held)
        assert link.evaluate("a => getComputedStyle(a).color") == "rgb(192, 57, 43)"  # in red
        assert "1 dead" in page.inner_text("#dead-count")
        shot(page, "workers-dead")
        # the group it held says so: not "RUNNING, held by" as if all were well
        page.goto(other.url + "/groups")
        line = page.locator("table tbody tr", has_text="g-killed")
        assert "dead" in line.locator("td:nth-child(5)").inner_text() and worker.pid in line.inner_text()
    finally:
        worker.close()
        other.stop()
        submitter.close()


def test_script_payloads_are_shown_as_text(env):
    app, dash, page, ids = env
    page.goto(dash.url + f"/tasks/{ids['xss_fail']}")
    assert XSS in page.inner_text("pre.args")  # args
    assert XSS in page.inner_text("pre.err")  # error text
    assert XSS in page.inner_text("dl.facts")  # group name
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    for path in ("/groups", "/dead", "/search?q=trace-xss", "/batches/b-partial", "/tasks"):
        page.goto(dash.url + path)
        assert page.locator("main img").count() == 0, path
        assert "<img src=x" in page.inner_text("main"), path
    page.goto(dash.url + "/")  # the error text arrives in live events too (textContent only)
    no_script_ran(page)


def test_live_updates_change_the_page_without_reload(env):
    app, dash, page, ids = env
    page.goto(dash.url + "/")
    page.evaluate("window.__same_page = true")
    before = int(page.inner_text("[data-live=depth]"))
    app.submit_many("ok", [{"args": [i], "queue": "parked"} for i in range(7)])
    wait_for(lambda: int(page.inner_text("[data-live=depth]")) >= before + 7, 15, message="depth shown live")
    assert page.evaluate("window.__same_page === true")  # no reload happened
    # pause stops the stream, resume starts it again
    page.click("#pause")
    assert page.inner_text("#live-state") == "paused" and page.inner_text("#pause") == "Resume"
    seen = int(page.get_attribute("body", "data-updates"))
    page.click("#pause")
    wait_for(lambda: int(page.get_attribute("body", "data-updates")) > seen, 15, message="updates resume")
    # a task's page follows its state live
    page.goto(dash.url + f"/tasks/{ids['holding']}")
    page.evaluate("document.querySelector('[data-task=progress]').textContent = 'stale'")
    wait_for(lambda: page.inner_text("[data-task=progress]") == "50%", 15, message="task state live")


def test_every_action(env):
    app, dash, page, ids = env
    parked = ids["parked"]
    # cancel, then retry, a task from its page
    page.goto(dash.url + f"/tasks/{parked}")
    page.click("div.actions >> text=Cancel")
    page.wait_for_selector("p.msg")
    assert app.get(parked).status is State.CANCELED
    shot(page, "action-cancel")
    page.click("div.actions >> text=Retry")
    page.wait_for_selector("p.msg")
    assert app.get(parked).status is State.PENDING
    # cancel a running task: its flag is set, the worker stops it at its next ctx call
    page.goto(dash.url + f"/tasks/{ids['holding']}")
    page.click("div.actions >> text=Cancel")
    page.wait_for_selector("p.msg")
    assert app.get(ids["holding"]).cancel_requested
    # retry one dead letter from the dead-letter page
    page.goto(dash.url + "/dead")
    row = page.locator("table.tasks tr", has_text="plain failure")
    row.locator("text=Retry").click()
    page.wait_for_selector("p.msg")
    wait_for(lambda: app.get(ids["fail2"]).attempt >= 1 and app.get(ids["fail2"]).status is State.FAILED, 30)
    # retry a batch's dead letters from the batch page
    page.goto(dash.url + "/batches/b-partial")
    page.click("text=Retry this batch's dead letters")
    page.wait_for_selector("p.msg")
    assert "queued again" in page.inner_text("p.msg")
    # open and close the breaker
    page.goto(dash.url + "/limits")
    page.locator("form[action='/actions/breaker']", has=page.locator("input[value=open]")).locator("button").click()
    page.wait_for_selector("p.msg")
    assert app.store.breakers()["partner"][1].state is BreakerState.OPEN
    shot(page, "action-breaker")
    page.locator("form[action='/actions/breaker']", has=page.locator("input[value=close]")).locator("button").click()
    page.wait_for_selector("p.msg")
    assert app.store.breakers()["partner"][1].state is BreakerState.CLOSED
    # set the level by hand, then hand it back
    page.goto(dash.url + "/")
    page.select_option("#level-form select", "DEGRADED")
    page.fill("#level-form input[name=reason]", "maintenance")
    page.click("#level-form button")
    page.wait_for_selector("p.msg")
    lv = app.store.fleet_level()
    assert lv.level == 2 and lv.manual and lv.reason == "maintenance"
    page.select_option("#level-form select", "auto")
    page.click("#level-form button")
    page.wait_for_selector("p.msg")
    assert not app.store.fleet_level().manual
    no_script_ran(page)


def test_an_action_without_its_csrf_token_is_refused(env):
    app, dash, page, ids = env
    page.goto(dash.url + "/")  # the browser holds the CSRF cookie, as a victim's would
    before = app.store.fleet_level()
    resp = page.request.post(dash.url + "/actions/level", form={"level": "EMERGENCY", "reason": "forged"})
    assert resp.status == 403
    resp = page.request.post(
        dash.url + "/actions/level", form={"level": "EMERGENCY", "reason": "forged", "csrf": "guessed"}
    )
    assert resp.status == 403
    assert app.store.fleet_level() == before


def test_a_listed_row_changes_live_and_a_filtered_set_is_retried_after_its_count(env):
    app, dash, page, ids = env
    mine = [app.submit("ok", [i], queue="parked", batch="b-bulk").id for i in range(3)]
    # a filter by worker and age, sorted oldest first, kept in the form
    held_by = app.get(ids["holding"]).worker_id
    page.goto(dash.url + "/tasks")
    page.fill("#task-filters input[name=worker]", held_by)
    page.fill("#task-filters input[name=older]", "0s")
    page.select_option("#task-filters select[name=sort]", "age")
    page.click("#task-filters button")
    page.wait_for_url("**/tasks?*worker=*")
    listed = {int(t) for t in page.locator("table.tasks tbody tr td:first-child").all_inner_texts()}
    assert ids["holding"] in listed and not listed & set(mine)
    assert page.locator("#task-filters select[name=sort]").input_value() == "age"
    # a row changes state: the list shows it without a reload
    page.goto(dash.url + "/tasks?batch=b-bulk")
    page.evaluate("window.__same_page = true")
    row = page.locator(f'tr[data-row="{mine[0]}"] td[data-col=status]')
    assert row.inner_text() == "PENDING"
    app.cancel(mine[0])
    wait_for(lambda: row.inner_text() == "CANCELED", 15, message="the row's new state shown live")
    assert page.evaluate("window.__same_page === true")
    for tid in mine[1:]:
        app.cancel(tid)
    # bulk retry: the count first, then the set as it stood
    page.goto(dash.url + "/tasks?batch=b-bulk&status=CANCELED")
    page.click("#bulk >> text=Retry all these")
    page.wait_for_selector("#bulk-count")
    assert "This will retry 3 tasks" in page.inner_text("#bulk-count")
    shot(page, "tasks-bulk-confirm")
    page.click("#bulk-confirm button")
    page.wait_for_selector("p.msg")
    assert "3 of 3 tasks queued again" in page.inner_text("p.msg")
    assert all(app.get(t).status is State.PENDING for t in mine)
    no_script_ran(page)


def test_an_adaptive_limit_is_drawn_against_what_happened_with_its_throttles(env, tmp_path):
    """A real run: workers call a partner that refuses past 20 calls a second;
    the leader's controller moves the rate, and the Limits page draws the
    effective rate against the calls that succeeded, with the throttles marked."""
    import collections
    import time

    import corral

    app = App(f"sqlite:///{tmp_path / 'adaptive.db'}")
    app.limit("partner_api", rate="auto", max_rate="200/s")
    lock, seen = threading.Lock(), collections.deque()

    @app.task(name="call", limits=["partner_api"])
    def call(n):
        with lock:
            now = time.monotonic()
            while seen and seen[0] < now - 1.0:
                seen.popleft()
            if len(seen) >= 20:
                raise corral.Retry(after=0.05)
            seen.append(now)
        return n

    for start in range(0, 1000, 500):
        app.submit_many("call", [{"args": [i]} for i in range(start, start + 500)])
    app.start(workers=4)
    dash = serve_background(app.store)
    try:

        def cut_after_throttles() -> bool:
            for e in app.store.events("limit_adapted", limit=50):
                if e.details.get("rate_rule", "").startswith("throttled"):
                    return True
            return False

        wait_for(cut_after_throttles, 60, message="the controller cut the rate after throttles")
        browser = env[2].context.browser  # the module's Chromium: one Playwright per thread
        context = browser.new_context(viewport={"width": 1200, "height": 900})
        try:
            page = context.new_page()
            page.set_default_timeout(15_000)
            page.goto(dash.url + "/limits")
            assert "(adaptive)" in page.locator("table").first.inner_text()
            section = page.locator("section[data-adaptive='partner_api']")
            line = section.locator(".adaptive-line").inner_text()
            assert re.search(r"rate \d+/s \(auto 1/s\.\.200/s\)", line), line
            assert "last cut at" in line
            chart = section.locator("figure[data-adaptive-chart='rate'] svg")
            for drawn in ("path.effective", "path.happened"):
                box = chart.locator(drawn).bounding_box()
                assert box is not None and box["width"] > 5, drawn  # a line over the seconds, drawn
            marks = chart.locator("line.throttle")
            assert marks.count() >= 1 and marks.first.bounding_box() is not None
            assert "throttled at" in (marks.first.locator("title").text_content() or "")
            section.scroll_into_view_if_needed()
            shot(page, "limits-adaptive")
        finally:
            context.close()
    finally:
        dash.stop()
        app.close(timeout=5)  # the work left is not the point: hand it back
