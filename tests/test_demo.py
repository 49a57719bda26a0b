"""``corral demo``'s main scenario, scaled down: detail -> images -> ordered
merchant notifications against the flaky, rate-capped partner, end to end on
a real SQLite store; and the pure checks its report rests on."""

from __future__ import annotations

import io
import sys
import types

import pytest
from click.testing import CliRunner
from rich.console import Console

from corral.cli import cli
from corral.edges.demo_sync import order_problems, rate_per_s, run_main_demo


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, highlight=False, force_terminal=False), out


def test_order_problems_names_each_way_a_merchant_can_be_let_down():
    expected = {"m1": [1, 2, 3], "m2": [1, 2], "m3": [1, 3]}
    assert order_problems({"m1": [1, 2, 3], "m2": [1, 2], "m3": [1, 3]}, expected) == {}
    got = order_problems({"m1": [1, 3, 2], "m2": [1, 2, 2], "m3": [1]}, expected)
    assert got["m1"] == "out of order: #3 arrived where #2 should have"
    assert got["m2"] == "a notification arrived twice"
    assert got["m3"].startswith("missing [3]")
    assert order_problems({"m4": [1]}, {}) == {"m4": "missing [] extra [1]"}, "an unexpected delivery is a problem"


def test_rate_per_s_reads_the_last_window_of_a_running_total():
    assert rate_per_s([]) == 0.0 and rate_per_s([(0.0, 5)]) == 0.0
    samples = [(0.0, 0), (1.0, 10), (6.0, 60), (11.0, 160)]
    assert rate_per_s(samples, window=5.0) == pytest.approx(20.0)
    assert rate_per_s(samples, window=100.0) == pytest.approx(160 / 11)


def test_main_scenario_in_process_holds_the_rate_and_the_order(tmp_path):
    con, out = _console()
    rep = run_main_demo(
        f"sqlite:///{tmp_path}/demo.db",
        skus=60,
        merchants=4,
        processes=0,
        slots=24,
        latency=0.02,
        qps=100.0,
        flaky=0.1,
        seed=11,
        timeout=300,
        console=con,
    )
    text = out.getvalue()
    assert rep.finished and rep.tasks == 180
    # one SKU carries bad data: its detail fails for good (a dead letter); its
    # images and notification are canceled after it, and are no dead letters
    assert rep.synced == 59
    assert {ph: f.dead for ph, f in rep.phases.items()} == {"detail": 1, "images": 0, "notify": 0}
    assert {ph: f.counts.get("CANCELED", 0) for ph, f in rep.phases.items()} == {"detail": 0, "images": 1, "notify": 1}
    assert "negative price" in (rep.phases["detail"].first_dead_error or "")
    assert rep.dead_letters == 1
    # the partner's own counts: never over its cap, and its flaky answers were retried
    assert rep.over_cap_429 == 0 and rep.busiest_second <= rep.cap and rep.rate_held
    assert rep.flaky and rep.retries == sum(rep.flaky.values()), "each flaky answer cost one retry, nothing more"
    assert rep.peak_in_flight <= rep.advice.concurrency
    # every merchant got exactly its delivered notifications, in order; the recorded runs agree
    assert rep.notified == 59 and rep.order_problems == {} and rep.history_violations == 0
    assert rep.ordering_verified
    assert rep.breaker == "CLOSED" and rep.level == "NORMAL"
    assert "ordering" in text and "yes: 4 of 4 merchants" in text and "0 429s for the cap" in text
    assert "one in-process worker, 24 slots" in text


def test_main_scenario_cli_in_two_worker_processes(tmp_path, monkeypatch):
    monkeypatch.delenv("CORRAL_STORE", raising=False)
    url = f"sqlite:///{tmp_path}/demo.db"
    args = ["demo", "--store", url, "--skus", "40", "--merchants", "3", "--processes", "2", "--workers", "8"]
    result = CliRunner().invoke(cli, [*args, "--latency-ms", "20", "--seed", "5"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "2 worker processes x 8 slots" in out
    assert "39 of 40 SKUs synced; 120 tasks; all tasks final" in out
    assert "yes: 3 of 3 merchants got their 39 notifications in order" in out
    assert "rate held" in out and "0 429s for the cap" in out
    assert f"  corral status --store {url}\n" in out


def test_main_scenario_writes_a_fresh_store_under_dot_corral_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CORRAL_STORE", raising=False)
    args = ["demo", "--skus", "6", "--merchants", "2", "--processes", "0", "--latency-ms", "5", "--flaky", "0"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [db] = (tmp_path / ".corral").glob("demo-*.db")
    assert f"--store sqlite:///.corral/{db.name}" in result.stdout
    assert not (tmp_path / "corral.db").exists(), "the default store is left alone"


def test_worker_processes_cannot_share_a_memory_store():
    result = CliRunner().invoke(cli, ["demo", "--store", "memory://", "--skus", "5"])
    assert result.exit_code != 0
    assert "memory://" in result.output and "--processes 0" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_dashboard_is_served_for_the_run_when_installed(tmp_path, monkeypatch):
    served = []

    class Server:
        url = "http://127.0.0.1:5999/"

        def stop(self) -> None:
            served.append("stopped")

    def serve_background(store, *, host="127.0.0.1", port=0, token=None, read_only=False):
        served.append((host, port, store.counts is not None))
        return Server()

    fake = types.ModuleType("corral.edges.dashboard")
    fake.serve_background = serve_background  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "corral.edges.dashboard", fake)
    con, out = _console()
    rep = run_main_demo(
        f"sqlite:///{tmp_path}/demo.db",
        skus=4,
        merchants=2,
        processes=0,
        slots=4,
        latency=0.005,
        flaky=0.0,
        console=con,
    )
    assert served == [("127.0.0.1", 0, True), "stopped"], "up on loopback for the run, stopped after it"
    assert rep.dashboard_url == Server.url and "dashboard: http://127.0.0.1:5999/" in out.getvalue()
