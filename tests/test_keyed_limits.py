"""Keyed limits through an app: the key taken from a task's argument (or a
submit's ``limit_key=``), one-line refusals of bad keys, the bounded views
(CLI, metrics), and per-key concurrency held across worker processes."""

from __future__ import annotations

import json

import pytest

import corral
from corral.core.gates import keyed_name
from corral.core.states import State
from corral.errors import BadArguments, ConfigError
from corral.testing import History
from faults import AppWorker
from helpers import wait_for


@pytest.fixture
def app():
    a = corral.App("memory://")
    a.limit("merchant", concurrency=2, per_key=True)
    a.limit("partner", concurrency=10)
    yield a
    a.close(5)


def limits_of(app, h) -> tuple[str, ...]:
    return app.get(h.id).limits


def test_the_key_is_the_named_argument_or_the_submit_option(app):
    @app.task(limits=["merchant", "partner"], limit_key="merchant")
    def push(ctx, merchant, sku, region="cn"):
        pass

    @app.task(limits=["merchant"], limit_key="region")
    def by_region(sku, region="cn"):
        pass

    assert limits_of(app, push.submit("m-1", "A1")) == (keyed_name("merchant", "m-1"), "partner")
    assert limits_of(app, push.submit(sku="A1", merchant="m-2"))[0] == keyed_name("merchant", "m-2")
    assert limits_of(app, push.submit("m-1", "A1", limit_key="other"))[0] == keyed_name("merchant", "other")
    assert limits_of(app, by_region.submit("A1")) == (keyed_name("merchant", "cn"),)
    assert limits_of(app, push.submit(1001, "A1"))[0] == keyed_name("merchant", "1001")


def test_bad_keys_are_refused_in_one_line(app):
    with pytest.raises(ConfigError, match="limit_key 'shop' is not an argument"):
        app.task(limits=["merchant"], limit_key="shop")(lambda ctx, merchant: None)

    @app.task(name="nokey", limits=["merchant"])
    def nokey(merchant):
        pass

    @app.task(name="push", limits=["merchant"], limit_key="merchant")
    def push(merchant):
        pass

    @app.task(name="plain", limits=["partner"])
    def plain(x):
        pass

    with pytest.raises(BadArguments, match="names the keyed limit 'merchant' but no key"):
        nokey.submit("m-1")
    for bad, why in (("m\x001", "NUL"), ("m" * 300, "1 to 255"), ("", "1 to 255"), (1.5, "must be a string")):
        with pytest.raises(BadArguments, match=why) as err:
            push.submit(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(BadArguments, match="names no keyed limit"):
        plain.submit(1, limit_key="k")
    with pytest.raises(ConfigError, match="per_key must be True or False"):
        app.limit("x", concurrency=1, per_key="yes")
    assert app.counts().get("PENDING", 0) == 0


def test_views_show_limits_and_their_busiest_keys_not_a_line_per_key(app):
    from corral.edges.metrics import StoreCollector

    @app.task(limits=["merchant"], limit_key="merchant")
    def push(merchant):
        pass

    for key, n in (("hot", 5), ("a", 1), ("b", 1)):
        for _ in range(n):
            push.submit(key)
    from corral.core.claims import ClaimRequest

    assert len(app.store.claim("w", ClaimRequest(("default",), 20))) == 4
    assert set(app.store.limits()) == {"merchant", "partner"}
    assert app.store.limit_usage() == {"merchant": 4}
    assert app.store.busiest_keys(1) == {"merchant": [("hot", 2)]}
    families = {f.name: f for f in StoreCollector(app.store).collect()}
    assert [s.value for s in families["corral_limit_keys_active"].samples] == [3]
    assert [s.value for s in families["corral_limit_busiest_key_running"].samples] == [2]
    assert all("hot" not in str(s.labels) for f in families.values() for s in f.samples)


def test_cli_status_shows_the_busiest_keys(tmp_path):
    from click.testing import CliRunner

    from corral.cli import cli
    from corral.core.claims import ClaimRequest

    url = f"sqlite:///{tmp_path / 'c.db'}"
    a = corral.App(url)
    a.limit("merchant", concurrency=2, per_key=True)
    push = a.task(name="push", limits=["merchant"], limit_key="merchant")(lambda merchant: None)
    for key in ("hot", "hot", "hot", "cold"):
        push.submit(key)
    assert len(a.store.claim("w", ClaimRequest(("default",), 10))) == 3
    a.close(5)
    out = CliRunner().invoke(cli, ["status", "--store", url, "--json"])
    assert out.exit_code == 0, out.output
    merchant = json.loads(out.output)["limits"]["merchant"]
    assert merchant["in_use"] == 3
    assert merchant["busiest_keys"] == [{"key": "hot", "in_use": 2}, {"key": "cold", "in_use": 1}]
    out = CliRunner().invoke(cli, ["status", "--store", url])
    assert "busiest keys" in out.output and "hot" in out.output


@pytest.mark.slow
def test_no_key_passes_its_concurrency_across_worker_processes_and_a_hot_key_starves_none(durable_url, tmp_path):
    app = corral.App(durable_url)
    app.limit("merchant", concurrency=2, per_key=True)
    push = app.task(name="push", limits=["merchant"], limit_key="merchant")(lambda ctx, merchant, dur: 0)
    runs = tmp_path / "runs.jsonl"
    # six slots in all, eight places under the keys: no process can take every place
    workers = [
        AppWorker(durable_url, runs, tmp_path / f"w{i}.log", concurrency=2, poll_interval=0.05) for i in range(3)
    ]
    try:
        for w in workers:
            w.wait_ready()
        calls = [{"args": ["hot", 0.05]} for _ in range(30)]  # queued first: a hot merchant
        calls += [{"args": [k, 0.02]} for k in ("c1", "c2", "c3") for _ in range(4)]
        ids = [h.id for h in push.submit_many(calls)]
        hot = ids[:30]
        cold = {k: ids[30 + 4 * i : 34 + 4 * i] for i, k in enumerate(("c1", "c2", "c3"))}
        total = len(hot) + sum(map(len, cold.values()))
        wait_for(
            lambda: app.counts().get(State.SUCCESS.value, 0) == total,
            timeout=90,
            interval=0.1,
            message="every task SUCCESS",
        )
    finally:
        for w in workers:
            w.close()
        app.close(5)
    history = History.load(runs)
    history.assert_ok()
    assert history.most_at_once(hot) == 2  # the hot key used its budget, never more
    for ids in cold.values():
        assert history.most_at_once(ids) <= 2
    hot_ends = sorted(r.until() for r in history.runs if r.task_id in hot)
    for key, ids in cold.items():  # each cold key finished while the hot key still had most of its work
        assert max(r.until() for r in history.runs if r.task_id in ids) < hot_ends[len(hot) // 2], key
    assert len({r.worker for r in history.runs}) >= 2, "several processes ran tasks"
