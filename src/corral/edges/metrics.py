"""Prometheus metrics: what a worker did, and what the store holds.

Two kinds, kept apart so that several worker processes never double-count:

- **Per process** (counters and a histogram), fed by the worker's hooks:
  tasks finished by state, retries, timeouts, leases lost, claims, and task
  durations by task name. Prometheus adds them up across processes.
- **Store-wide** (gauges: tasks by state, limit usage and capacity): one
  value for the whole fleet. A collector reads them from the store at
  scrape time (partial indexes: the cost follows live work, not history),
  and a worker exports them only while it holds the store's "metrics" lead
  (``Store.try_lead``, renewed at each scrape), so exactly one process of
  the fleet reports them; if it dies, another takes over within a minute.
  The dashboard always reports them.

Labels are bounded: state, task name, limit. Every name starts with ``corral_``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from corral.core.breaker import BreakerState
from corral.core.model import Claim, Outcome
from corral.core.states import ACTIVE, State
from corral.engine.hooks import Hooks
from corral.stores.base import Store

#: Seconds: from 5 ms to 20 minutes, for tasks from no-ops to long exports.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1200)


class WorkerMetrics(Hooks):
    """Counters and durations of one process, fed by the worker's hooks."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.finished = Counter(
            "corral_tasks_finished", "Task attempts that ended, by state", ["state", "task"], registry=registry
        )
        self.retries = Counter("corral_task_retries", "Attempts that will be retried", ["task"], registry=registry)
        self.timeouts = Counter("corral_task_timeouts", "Attempts that timed out", ["task"], registry=registry)
        self.claims = Counter("corral_claims", "Units claimed by this process", registry=registry)
        self.leases_lost = Counter(
            "corral_leases_lost", "Leases this process learned it no longer holds", registry=registry
        )
        self.duration = Histogram(
            "corral_task_duration_seconds",
            "Run time of finished attempts, by task name",
            ["task"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        # task id -> name, from the claims: an outcome carries the id only
        self._names: dict[int, str] = {}
        self._lock = threading.Lock()

    def on_claims(self, worker_id: str, claims: Sequence[Claim]) -> None:
        self.claims.inc(len(claims))
        with self._lock:
            for c in claims:
                for t in c.tasks:
                    self._names[t.id] = t.name

    def on_outcomes(self, outcomes: Sequence[Outcome], applied: Sequence[bool]) -> None:
        now = time.time()
        for o, ok in zip(outcomes, applied):
            with self._lock:
                name = self._names.pop(o.task_id, "unknown")
            if not ok or o.status is State.PENDING:  # stale, or handed back unrun
                continue
            if o.status is State.RETRYING:
                self.retries.labels(name).inc()
                if o.error and o.error.startswith("timed out"):
                    self.timeouts.labels(name).inc()
                continue
            self.finished.labels(o.status.value, name).inc()
            if o.status is State.TIMEOUT:
                self.timeouts.labels(name).inc()
            if o.started_at is not None:
                self.duration.labels(name).observe(max(0.0, (o.finished_at or now) - o.started_at))

    def on_leases_lost(self, worker_id: str, tokens: Collection[str]) -> None:
        self.leases_lost.inc(len(tokens))


#: The leadership role whose holder exports the store-wide gauges.
ROLE = "metrics"
#: How long it is held without a scrape renewing it.
LEAD_TTL = 60.0


class StoreCollector(Collector):
    """Store-wide gauges, read at scrape time.

    With ``holder`` set (a worker), only while it holds the fleet's metrics
    lead; without (the dashboard), always."""

    def __init__(self, store: Store, holder: str | None = None):
        self.store = store
        self.holder = holder

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.holder is not None and not self.store.try_lead(ROLE, self.holder, LEAD_TTL):
            return
        tasks = GaugeMetricFamily("corral_tasks", "Unfinished tasks in the store, by state", labels=["state"])
        counts = self.store.active_counts()
        for s in ACTIVE:
            tasks.add_metric([s.value], counts.get(s.value, 0))
        yield tasks
        depth = GaugeMetricFamily("corral_queue_depth", "Tasks waiting to run (PENDING and RETRYING)")
        depth.add_metric([], counts.get(State.PENDING.value, 0) + counts.get(State.RETRYING.value, 0))
        yield depth
        usage = self.store.limit_usage()
        running = GaugeMetricFamily("corral_limit_running", "Claims running under a named limit", labels=["limit"])
        capacity = GaugeMetricFamily("corral_limit_concurrency", "A named limit's concurrency", labels=["limit"])
        for name, spec in sorted(self.store.limits().items()):
            running.add_metric([name], usage.get(name, 0))
            if spec.concurrency is not None:
                capacity.add_metric([name], spec.concurrency)
        yield running
        yield capacity
        # keyed limits: two figures per limit, never a label per key
        active = GaugeMetricFamily(
            "corral_limit_keys_active", "Keys of a keyed limit with claims running", labels=["limit"]
        )
        busiest = GaugeMetricFamily(
            "corral_limit_busiest_key_running", "Claims running under a keyed limit's busiest key", labels=["limit"]
        )
        for name, keys in sorted(self.store.busiest_keys(top=10**9).items()):
            active.add_metric([name], len(keys))
            busiest.add_metric([name], keys[0][1])
        yield active
        yield busiest
        tokens = GaugeMetricFamily(
            "corral_limit_tokens",
            "Starts a rate limit allows now (tokens in its bucket, room in its window)",
            labels=["limit"],
        )
        for name, left in sorted(self.store.limit_tokens().items()):
            tokens.add_metric([name], left)
        yield tokens
        breaker = GaugeMetricFamily(
            "corral_breaker_state", "A circuit breaker's state (1 for the state it is in)", labels=["breaker", "state"]
        )
        for name, (_config, state) in sorted(self.store.breakers().items()):
            for bs in BreakerState:
                breaker.add_metric([name, bs.value], 1.0 if state.state is bs else 0.0)
        yield breaker
        level = self.store.fleet_level()
        gauge = GaugeMetricFamily("corral_degradation_level", "The fleet's degradation level: 0 NORMAL ... 4 EMERGENCY")
        gauge.add_metric([], level.level)
        yield gauge


def worker_registry(store: Store, holder: str) -> tuple[CollectorRegistry, WorkerMetrics]:
    """A registry with this process's counters and, while ``holder`` leads, the store's gauges."""
    registry = CollectorRegistry()
    hooks = WorkerMetrics(registry)
    registry.register(StoreCollector(store, holder))
    return registry, hooks


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the server."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
