"""The Tasks page over HTTP: each filter (worker, age), each sort, keyset pages,
the live rows of a list, and a bulk retry or cancel confirmed by its count."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from corral.core.claims import ClaimRequest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from corral.core.clock import FakeClock  # noqa: E402
from corral.core.model import NewTask, Outcome  # noqa: E402
from corral.core.states import State  # noqa: E402
from corral.edges.dashboard import serve_background  # noqa: E402
from corral.stores import open_store  # noqa: E402
from test_dashboard import ARGS, Client  # noqa: E402


@pytest.fixture
def clock():
    return FakeClock(1_000_000.0)


@pytest.fixture
def store(tmp_path, clock):
    s = open_store(f"sqlite:///{tmp_path / 'd.db'}", clock=clock)
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def client(store):
    dash = serve_background(store)
    try:
        yield Client(dash.url), dash
    finally:
        dash.stop()


def shown_ids(body: str) -> list[int]:
    return [int(m) for m in re.findall(r'<tr data-row="(\d+)">', body)]


def submit(store, n: int, name: str = "t", **kw) -> list[int]:
    return [r.id for r in store.submit([NewTask(name=name, args=ARGS, **kw) for _ in range(n)])]


def fail(store, worker: str = "w", submit_first: bool = False) -> int:
    """Claim the oldest queued task and fail it (one is submitted first if asked)."""
    if submit_first:
        submit(store, 1)
    (c,) = store.claim(worker, ClaimRequest(["default"], 1))
    t = c.tasks[0]
    store.complete([Outcome(t.id, c.token, t.version, State.FAILED, error="boom")])
    return t.id


def test_a_worker_filter_shows_what_that_worker_holds(store, client):
    c, _ = client
    ids = submit(store, 4)
    store.claim("vm-1:100:a", ClaimRequest(["default"], 2))
    store.claim("vm-2:200:b", ClaimRequest(["default"], 1))
    status, body = c.request("/tasks?worker=vm-1:100:a")
    assert status == 200 and shown_ids(body) == [ids[1], ids[0]]
    assert shown_ids(c.request("/tasks?worker=vm-2:200:b")[1]) == [ids[2]]
    assert shown_ids(c.request("/tasks?worker=nobody")[1]) == []


def test_age_filters_keep_tasks_submitted_before_or_since(store, client, clock):
    c, _ = client
    old = submit(store, 2)
    clock.advance(3600)
    new = submit(store, 2)
    clock.advance(60)
    assert shown_ids(c.request("/tasks?older=30m")[1]) == old[::-1]
    assert shown_ids(c.request("/tasks?newer=5m")[1]) == new[::-1]
    assert shown_ids(c.request("/tasks?older=10s&newer=2m")[1]) == new[::-1]
    assert shown_ids(c.request("/tasks?older=2d")[1]) == []
    status, body = c.request("/tasks?older=soon")
    assert status == 400 and "not an age" in body


def test_sorts_and_keyset_pages(store, client):
    c, _ = client
    ids = submit(store, 120)
    failed = fail(store)  # ids[0]
    assert failed == ids[0]
    # newest first, page by page: 50, 50, 20, none twice
    seen, url = [], "/tasks"
    while url:
        body = c.request(url)[1]
        seen.append(shown_ids(body))
        m = re.search(r'<a href="([^"]+)">next →</a>', body)
        url = m.group(1).replace("&amp;", "&") if m else None
    assert [len(p) for p in seen] == [50, 50, 20] and sum(seen, []) == ids[::-1]
    # oldest first (age)
    assert shown_ids(c.request("/tasks?sort=age")[1])[:3] == ids[:3]
    # by state: the queued ones first, newest first among them; the failure after
    body = c.request("/tasks?sort=status")[1]
    assert shown_ids(body)[0] == ids[-1]
    m = re.search(r'href="(/tasks\?sort=status&amp;after=[^"]+)"', body)
    assert m and "PENDING" in m.group(1)
    third = c.request("/tasks?sort=status&after=PENDING%3A" + str(ids[2]))[1]
    assert shown_ids(third) == [ids[1], failed]
    status, body = c.request("/tasks?sort=sideways")
    assert status == 400 and "unknown sort" in body


def test_a_bulk_retry_shows_its_count_then_retries_the_set_as_it_stood(store, client):
    c, dash = client
    failed = [fail(store, submit_first=True) for _ in range(3)]
    submit(store, 1)  # pending: not retryable
    c.request("/tasks")  # the CSRF cookie
    status, body = c.request("/tasks/bulk?status=FAILED&action=retry")
    assert status == 200 and 'This will retry <b data-count="3">3</b> tasks' in body
    ticket = re.search(r'name="ticket" value="([^"]+)"', body).group(1)
    # a failure after the count is not part of what was confirmed
    late = fail(store)  # the pending one
    # no CSRF token: refused, nothing changes
    assert c.request("/actions/bulk", {"ticket": ticket})[0] == 403
    assert all(store.get(t).status is State.FAILED for t in failed)
    status, _ = c.request("/actions/bulk", {"ticket": ticket, "csrf": c.csrf(), "next": "/tasks?status=FAILED"})
    assert status == 303
    assert all(store.get(t).status is State.PENDING for t in failed)
    assert store.get(late).status is State.FAILED
    # a ticket confirms once
    status, _ = c.request("/actions/bulk", {"ticket": ticket, "csrf": c.csrf()})
    assert status == 303 and store.get(late).status is State.FAILED


def test_a_bulk_cancel_takes_only_active_tasks_of_the_filter(store, client):
    c, _ = client
    mine = submit(store, 3, batch="b1")
    other = submit(store, 2, batch="b2")
    c.request("/tasks")
    body = c.request("/tasks/bulk?batch=b1&action=cancel")[1]
    assert 'data-count="3"' in body
    ticket = re.search(r'name="ticket" value="([^"]+)"', body).group(1)
    store.cancel(mine[0])  # changed state meanwhile: skipped, and said so
    status, _ = c.request("/actions/bulk", {"ticket": ticket, "csrf": c.csrf(), "next": "/tasks?batch=b1"})
    assert status == 303
    assert all(store.get(t).status is State.CANCELED for t in mine)
    assert all(store.get(t).status is State.PENDING for t in other)
    # without a filter a bulk action is refused
    status, body = c.request("/tasks/bulk?action=cancel")
    assert status == 400 and "needs a filter" in body


def test_the_stream_sends_a_listed_row_when_it_changes(store, client):
    c, dash = client
    ids = submit(store, 2)
    body = c.request("/tasks")[1]
    assert f'data-stream="/stream?rows={ids[1]},{ids[0]}"' in body
    req = urllib.request.Request(dash.url + f"/stream?rows={ids[1]},{ids[0]}", headers={"Accept": "text/event-stream"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        rows, snapshots = [], 0

        def read_event() -> None:
            nonlocal snapshots
            line = resp.readline().decode().strip()
            if line == "event: snapshot":
                snapshots += 1
            elif line == "event: row":
                row = json.loads(resp.readline().decode().strip()[6:])
                rows.append((row["id"], row["status"]))

        while snapshots < 2:  # the first look is taken (and sent: a change since the page drew would show)
            read_event()
        assert sorted(rows) == [(ids[0], "PENDING"), (ids[1], "PENDING")]
        store.cancel(ids[0])
        while rows[-1][1] != "CANCELED":
            read_event()
        assert rows[2:] == [(ids[0], "CANCELED")]  # only the row that changed


def test_the_schedules_page_shows_last_and_next_ticks_and_runs(store, client, clock):
    from corral.core.cron import Schedule

    c, _ = client
    sched = Schedule(name="refresh", task="refresh_prices", expr="*/5 * * * *", timezone="UTC")
    store.save_schedules([sched])
    tick = sched.next_after(store.now() - 600)
    result = store.fire_tick(sched, tick)
    status, body = c.request("/schedules")
    assert status == 200 and 'data-schedule="refresh"' in body and "*/5 * * * *" in body
    assert f'href="/tasks/{result.task_id}"' in body  # its run, with its state
    assert "no tick yet" not in body and "(in " in body  # the next tick


def test_the_events_page_filters_by_kind_and_subject_and_shows_level_history(store, client):
    c, _ = client
    ids = submit(store, 2)
    store.cancel(ids[0])
    store.add_event("level", "fleet", json.dumps({"to": "DEGRADED", "reason": "partner outage"}))
    status, body = c.request("/events?kind=canceled")
    assert status == 200
    rows = re.findall(r'<tr data-event="\d+">.*?</tr>', body, re.S)
    assert rows and all("canceled" in r for r in rows)
    body = c.request(f"/events?subject={ids[1]}")[1]
    rows = re.findall(r'<tr data-event="\d+">.*?</tr>', body, re.S)
    assert rows and all(f">task:{ids[1]}<" in r for r in rows) and not any(f">task:{ids[0]}<" in r for r in rows)
    # a task's page lists its events in its timeline
    assert "<b>canceled</b>" in c.request(f"/tasks/{ids[0]}")[1].split('class="timeline"')[1]
    assert "partner outage" in body.split('id="level-history"')[1]
    status, body = c.request("/events?kind=nonsense")  # a kind no store writes: nothing, no error
    assert status == 200 and not re.findall(r'<tr data-event="\d+">', body)


def test_the_over_time_page_draws_the_recorded_minutes(store, client, clock):
    from corral.maintenance.minute_recorder import MinuteRecorder

    c, _ = client
    status, body = c.request("/over-time")
    assert status == 200 and "Nothing recorded yet" in body
    submit(store, 3, name="sync")
    for _ in range(2):
        (u,) = store.claim("w", ClaimRequest(["default"], 1))
        clock.advance(1.5)
        store.complete([Outcome(u.tasks[0].id, u.token, u.tasks[0].version, State.SUCCESS)])
    fail(store)
    clock.advance(60)
    assert MinuteRecorder(store).tick() >= 1
    status, body = c.request("/over-time")
    assert status == 200 and "Nothing recorded yet" not in body
    assert body.count('<figure class="chart"') == 5
    done_chart = body.split('data-over-time="done"')[1].split("</figure>")[0]
    assert '<path class="line"' in done_chart and "max 3" in done_chart
    names = body.split('class="over-time-names"')[1]
    assert "<td>sync</td>" not in names and ">sync</a></td><td>3</td><td>1</td>" in names
    status, body = c.request("/over-time?window=day&queue=default&name=sync")
    assert status == 200 and "the last day, queue default, sync" in body
    assert c.request("/over-time?window=week")[0] == 400


def test_a_waiting_task_says_why_on_its_page_and_in_a_list_of_waiting_tasks(client, store, clock):
    from corral.core.model import LimitSpec, WorkerInfo

    c, _ = client
    store.report_worker(WorkerInfo("w1", "vm", 1, ("default",), 4, 0, "1.0", 5.0))
    store.set_limit(LimitSpec("partner", concurrency=1))
    head, behind = submit(store, 2, group="acct-1")
    (free,) = submit(store, 1, limits=("partner",))
    (held,) = submit(store, 1, limits=("partner",))
    (later,) = submit(store, 1, run_at=store.now() + 600)
    store.claim("w1", ClaimRequest(["default"], 2))  # the group's head and the limit's one place
    status, body = c.request(f"/tasks/{behind}")
    assert status == 200
    assert f"behind its group&#39;s head, task {head} (t), RUNNING on worker w1 (alive, lease expires in" in body
    status, body = c.request("/tasks?status=PENDING")
    cells = dict(re.findall(r'<tr data-row="(\d+)">.*?<td class="why" data-col="why">([^<]*)</td>', body, re.S))
    assert cells[str(held)] == "limit &#39;partner&#39; full: 1 of 1 running"
    assert cells[str(later)] == "scheduled for later: runs in 10 min"
    assert cells[str(behind)].startswith("behind its group")
    assert str(free) not in cells  # claimed: not PENDING any more
    _, body = c.request("/tasks")  # not filtered to a waiting state: no column
    assert 'data-col="why"' not in body


def _next_link(body: str) -> str | None:
    m = re.search(r'<a href="([^"]+)">next →</a>', body)
    return m.group(1).replace("&amp;", "&") if m else None


def test_dead_letters_page_by_keyset_through_the_next_link(store, client):
    c, _ = client
    ids = submit(store, 130, batch="b")
    claims = store.claim("w", ClaimRequest(["default"], 130))
    store.complete([Outcome(t.id, cl.token, t.version, State.FAILED, error="boom") for cl in claims for t in cl.tasks])
    assert [t.id for t in store.dead_letters(limit=200)] == ids
    # oldest first, page by page through the next link: 50, 50, 30, none twice
    seen, url = [], "/dead"
    while url and len(seen) < 10:
        body = c.request(url)[1]
        seen.append(shown_ids(body))
        assert ("first page</a>" in body) == (url != "/dead")
        url = _next_link(body)
        assert url is None or "after=" in url and "offset" not in url
    assert [len(p) for p in seen] == [50, 50, 30] and sum(seen, []) == ids
    # a dead letter of the first page retried before the next is read: none skipped, none twice
    body = c.request("/dead")[1]
    second = _next_link(body)
    assert second is not None
    assert store.retry(ids[0])
    assert shown_ids(c.request(second)[1]) == ids[50:100]
    # one batch's pages keep the batch in the link; the batch page's "more" goes by keyset too
    body = c.request("/dead?batch=b")[1]
    assert shown_ids(body) == ids[1:51]
    link = _next_link(body)
    assert link == f"/dead?batch=b&after={ids[50]}"
    assert shown_ids(c.request(link)[1]) == ids[51:101]
    more = re.search(r'<a href="(/dead\?batch=b&amp;after=\d+)">more →</a>', c.request("/batches/b")[1])
    assert more and shown_ids(c.request(more.group(1).replace("&amp;", "&"))[1]) == ids[51:101]
