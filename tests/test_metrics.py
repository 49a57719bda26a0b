"""Prometheus metrics: a worker's counters, the store-wide gauges reported by
one process of the fleet, the text format, and the alert rules."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import corral
from corral.edges import metrics
from faults import CORRAL
from helpers import missing, wait_for

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "docs" / "alerts.yml"


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):  # the official parser accepts it
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_worker_counts_what_it_ran_and_the_store_gauges_come_from_one_process(tmp_path):
    app = corral.App(f"sqlite:///{tmp_path}/m.db")
    app.limit("api", concurrency=3)

    @app.task(name="ok", limits=["api"])
    def ok(x):
        return x

    @app.task(name="bad", retries=0)
    def bad():
        raise RuntimeError("boom")

    registry, watcher = metrics.worker_registry(app.store, "worker-a")
    other, _ = metrics.worker_registry(app.store, "worker-b")
    hs = ok.submit_many([(i,) for i in range(4)])
    hb = bad.submit()
    app.start(workers=2, extra_hooks=[watcher])
    try:
        for h in hs:
            h.result(timeout=20)
        app.wait(hb.id, timeout=20)
        wait_for(
            lambda: _samples(registry).get(("corral_tasks_finished_total", (("state", "FAILED"), ("task", "bad"))))
        )
        got = _samples(registry)
        assert got[("corral_tasks_finished_total", (("state", "SUCCESS"), ("task", "ok")))] == 4
        assert got[("corral_task_duration_seconds_count", (("task", "ok"),))] == 4
        assert got[("corral_claims_total", ())] >= 2
        # worker-a scraped first and holds the metrics lead: it reports the store's gauges
        assert got[("corral_limit_concurrency", (("limit", "api"),))] == 3
        assert ("corral_tasks", (("state", "PENDING"),)) in got
        # a second process of the same store does not report them again
        assert not any(name == "corral_tasks" for name, _ in _samples(other))
    finally:
        app.close(timeout=10)


def test_corral_worker_serves_metrics_over_http(tmp_path, processes):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"sqlite:///{tmp_path}/w.db"
    proc = processes.start(
        [*CORRAL, "worker", "tests.apps.crash_app:app", "--store", url, "--metrics-port", str(port)], cwd=ROOT
    )
    try:

        def scrape():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                return None

        text = wait_for(scrape, timeout=30, interval=0.1, message="the worker serves /metrics")
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"corral_claims", "corral_tasks", "corral_queue_depth"} <= names
    finally:
        proc.stop(30)


def test_the_alert_rules_name_only_metrics_corral_exports():
    text = ALERTS.read_text()
    exported = {
        "corral_tasks_finished",
        "corral_task_retries",
        "corral_task_timeouts",
        "corral_claims",
        "corral_leases_lost",
        "corral_task_duration_seconds_bucket",
        "corral_tasks",
        "corral_queue_depth",
        "corral_limit_running",
        "corral_limit_concurrency",
    }
    used = set(re.findall(r"\b(corral_[a-z_]+)\b", text))
    assert used and used <= exported, used - exported
    assert text.count("- alert:") == 4


def test_the_alert_rules_pass_promtool():
    if shutil.which("promtool") is None:
        missing("promtool (Debian package prometheus) not installed; make test installs it as root")
    out = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_store_gauges_show_rate_tokens_breaker_states_and_the_level(url):
    app = corral.App(url)
    app.limit("api", concurrency=4, rate="10/s", burst=5)
    app.breaker("api", failure_ratio=0.5, min_calls=5)
    try:
        registry = CollectorRegistry()
        registry.register(metrics.StoreCollector(app.store))
        got = _samples(registry)
        assert got[("corral_limit_tokens", (("limit", "api"),))] == pytest.approx(5.0, abs=0.5)  # a full bucket
        assert got[("corral_breaker_state", (("breaker", "api"), ("state", "CLOSED")))] == 1
        assert got[("corral_breaker_state", (("breaker", "api"), ("state", "OPEN")))] == 0
        assert got[("corral_degradation_level", ())] == 0
        app.breaker_force("api", "open", reason="test")
        app.set_level("DEGRADED", reason="test")
        got = _samples(registry)
        assert got[("corral_breaker_state", (("breaker", "api"), ("state", "OPEN")))] == 1
        assert got[("corral_degradation_level", ())] == 2
    finally:
        app.close(timeout=5)
