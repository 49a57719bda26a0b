"""The dashboard's pause and resume buttons over HTTP: a queue, a group and a
limit where each is listed, CSRF-protected like every action, none when
read-only; what they do is the store's pause (every worker obeys)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from corral.core.claims import ClaimRequest  # noqa: E402
from corral.core.model import LimitSpec, NewTask  # noqa: E402
from corral.edges.dashboard import serve_background  # noqa: E402
from corral.stores import open_store  # noqa: E402
from helpers import ARGS
from test_dashboard import Client


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'd.db'}")
    s.migrate()
    yield s
    s.close()


def _paused(store) -> list[tuple[str, str]]:
    return [(p.kind, p.name) for p in store.pauses()]


def test_pause_and_resume_buttons_with_csrf(store):
    store.set_limit(LimitSpec("partner_api", concurrency=2))
    store.submit([NewTask(name="t", args=ARGS, queue="emails", group="g1")])
    dash = serve_background(store)
    try:
        c = Client(dash.url)
        for page, kind, name in (
            ("/queues", "queue", "emails"),
            ("/groups", "group", "g1"),
            ("/limits", "limit", "partner_api"),
        ):
            body = c.request(page)[1]
            assert re.search(rf'name="kind" value="{kind}"><input type="hidden" name="name" value="{name}">', body), (
                page
            )
            form = {"kind": kind, "name": name, "state": "pause", "next": page}
            # no token, or a token without its cookie (another site's form): refused, nothing paused
            assert c.request("/actions/pause", form)[0] == 403
            assert Client(dash.url).request("/actions/pause", {**form, "csrf": c.csrf()})[0] == 403
            assert _paused(store) == []
            status, _ = c.request("/actions/pause", {**form, "csrf": c.csrf()})
            assert status == 303 and _paused(store) == [(kind, name)]
            body = c.request(page)[1]
            assert ">paused</span>" in body and "<button>Resume</button>" in body
            status, _ = c.request("/actions/pause", {**form, "state": "resume", "csrf": c.csrf()})
            assert status == 303 and _paused(store) == []
        # a queue paused before work arrives, by name; the claim obeys it
        status, _ = c.request("/actions/pause", {"kind": "queue", "name": "later", "state": "pause", "csrf": c.csrf()})
        assert status == 303 and "later" in c.request("/queues")[1]
        store.submit([NewTask(name="t", args=ARGS, queue="later")])
        assert store.claim("w", ClaimRequest(("later",), 5)) == []
        # bad input: said on the page it goes back to, nothing stored
        status, _ = c.request("/actions/pause", {"kind": "worker", "name": "x", "state": "pause", "csrf": c.csrf()})
        assert status == 303 and _paused(store) == [("queue", "later")]
    finally:
        dash.stop()


def test_read_only_shows_no_pause_buttons(store):
    store.pause("queue", "emails", "ops")
    dash = serve_background(store, read_only=True)
    try:
        body = Client(dash.url).request("/queues")[1]
        assert ">paused</span>" in body and "/actions/pause" not in body
    finally:
        dash.stop()
