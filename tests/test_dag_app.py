"""DAGs through the public API, on every store: graph submit by ref, cycles,
the upstream-failure policy, and ctx.upstream fan-in, with a real worker."""

from __future__ import annotations

import pytest

import corral
from corral import Node, State
from corral.errors import BadArguments, ConfigError


@pytest.fixture
def app(url):
    a = corral.App(url)
    yield a
    a.close(timeout=10)


def _tasks(app):
    seen = {}

    @app.task
    def fetch(n):
        return {"pages": n}

    @app.task
    def parse(ctx, part):
        return ctx.upstream(by="ref")["fetch"]["pages"] * part

    @app.task
    def report(ctx):
        seen["by_id"] = ctx.upstream()
        seen["by_ref"] = ctx.upstream(by="ref")
        return sum(ctx.upstream().values())

    @app.task
    def boom():
        raise corral.PermanentError("no")

    @app.task(on_upstream_failure="run")
    def cleanup(ctx):
        seen["cleanup"] = ctx.upstream(by="ref")
        return "cleaned"

    return seen, fetch, parse, report, boom, cleanup


def test_graph_submit_by_ref_runs_with_fan_in(app):
    seen, fetch, parse, report, *_ = _tasks(app)
    handles = app.submit_many(
        [
            Node(report, ref="report", depends_on=["p1", "p2"]),  # listed before its upstream
            parse.node(1, ref="p1", depends_on=["fetch"]),
            parse.node(part=10, ref="p2", depends_on=["fetch"]),
            Node("fetch", 3, ref="fetch"),
        ]
    )
    assert [h.ref for h in handles] == ["report", "p1", "p2", "fetch"]
    h_report, h_p1, h_p2, h_fetch = handles
    assert h_fetch.id < h_p1.id < h_report.id and h_p2.id < h_report.id
    assert app.get(h_report.id).depends_on == (h_p1.id, h_p2.id)
    app.start(workers=4)
    assert h_report.result(timeout=30) == 33
    assert seen["by_id"] == {h_p1.id: 3, h_p2.id: 30}
    assert seen["by_ref"] == {"p1": 3, "p2": 30}


def test_graph_items_as_mappings_and_one_task_form(app):
    _, fetch, parse, *_ = _tasks(app)
    (a, b) = app.submit_many(
        [{"task": "fetch", "args": [2], "ref": "fetch"}, {"task": parse, "args": [5], "depends_on": ["fetch"]}]
    )
    # the one-task form takes refs too
    (c, d) = app.submit_many(fetch, [{"args": [1], "ref": "x"}, {"args": [4], "depends_on": ["x", a]}])
    assert app.get(d.id).depends_on == (a.id, c.id) or app.get(d.id).depends_on == (c.id, a.id)
    app.start(workers=2)
    assert b.result(timeout=30) == 10
    assert d.result(timeout=30) == {"pages": 4}


def test_cycle_is_rejected_with_one_line_and_nothing_stored(app):
    _, fetch, parse, report, *_ = _tasks(app)
    with pytest.raises(BadArguments) as exc:
        app.submit_many(
            [
                fetch.node(1, ref="a"),
                parse.node(1, ref="b", depends_on=["a", "d"]),
                parse.node(1, ref="c", depends_on=["b"]),
                report.node(ref="d", depends_on=["c"]),
            ]
        )
    msg = str(exc.value)
    assert "\n" not in msg and "cycle" in msg
    assert "b -> c -> d -> b" in msg or "c -> d -> b -> c" in msg or "d -> b -> c -> d" in msg
    assert app.counts() == {}


def test_unknown_and_repeated_refs_store_nothing(app):
    _, fetch, *_ = _tasks(app)
    with pytest.raises(BadArguments, match="'nope'"):
        app.submit_many([fetch.node(1, ref="a"), fetch.node(2, depends_on=["nope"])])
    with pytest.raises(BadArguments, match="'a' names two tasks"):
        app.submit_many([fetch.node(1, ref="a"), fetch.node(2, ref="a", depends_on=["a"])])
    with pytest.raises(BadArguments):
        fetch.submit(1, depends_on=["a"])  # a ref outside a graph names nothing
    assert app.counts() == {}


def test_upstream_failure_cancels_down_the_graph_and_cleanup_runs_anyway(app):
    seen, fetch, parse, report, boom, cleanup = _tasks(app)
    h_boom, h_parse, h_report, h_clean = app.submit_many(
        [
            boom.node(ref="boom"),
            parse.node(1, ref="parse", depends_on=["boom"]),
            report.node(ref="report", depends_on=["parse"]),
            cleanup.node(ref="cleanup", depends_on=["boom", "report"]),
        ]
    )
    app.start(workers=2)
    assert h_clean.result(timeout=30) == "cleaned"
    assert seen["cleanup"] == {"boom": None, "report": None}
    assert h_boom.status() is State.FAILED
    parse_rec, report_rec = app.get(h_parse.id), app.get(h_report.id)
    assert parse_rec.status is State.CANCELED and parse_rec.error == f"upstream {h_boom.id} ended FAILED"
    assert report_rec.status is State.CANCELED and report_rec.error == f"upstream {h_parse.id} ended CANCELED"
    # only the real failure is a dead letter
    assert [t.id for t in app.dead()] == [h_boom.id]
    with pytest.raises(corral.TaskFailed, match="upstream"):
        h_report.result(timeout=1)


def test_on_upstream_failure_is_validated(app):
    with pytest.raises(ConfigError, match="on_upstream_failure must be 'cancel' or 'run'"):

        @app.task(on_upstream_failure="skip")
        def t():
            return None


def test_ctx_upstream_rejects_an_unknown_key(app):
    @app.task
    def bad_key(ctx):
        return ctx.upstream(by="colour")

    h = bad_key.submit()
    app.start(workers=1)
    with pytest.raises(corral.TaskFailed, match="by="):
        h.result(timeout=30)


def test_ctx_upstream_in_a_child_process(app):
    @app.task
    def up(n):
        return n * 2

    @app.task(isolation="process")
    def down(ctx):
        return ctx.upstream(by="ref")

    a, b = app.submit_many([up.node(21, ref="up"), down.node(ref="down", depends_on=["up"])])
    app.start(workers=2)
    assert b.result(timeout=30) == {"up": 42}


def test_drain_waits_for_a_whole_chain(app):
    # an outcome written after the drain's last empty claim promotes the next
    # task of the chain: the drain must look again, not stop there
    @app.task
    def link(i):
        return i

    handles = app.submit_many([link.node(i, ref=f"l{i}", depends_on=[f"l{i - 1}"] if i else []) for i in range(30)])
    app.start(workers=2)
    assert app.drain(timeout=60)
    assert [h.status() for h in handles] == [State.SUCCESS] * 30
