"""What the SQLite and PostgreSQL stores share; the dialects differ only in
their ``sql/<dialect>.sql`` files and how they hold connections.

Shared here: the mapping of a task row to a :class:`TaskRecord` by column
name (both schemas name the columns alike), and the reads that are plain
named queries on both (batch summary, limits), run through one hook,
:meth:`SqlStore._read_all`, which each dialect implements on its own
connections and which translates driver errors into
:class:`~corral.errors.StoreError` at the boundary.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from corral.core.adaptive import AdaptiveRow, AdaptiveSpec, ControllerState
from corral.core.gates import KEY_SEP, Gates, LimitState, busiest_keys, fold_keys, split_key
from corral.core.model import LimitSpec, TaskRecord
from corral.core.planning import HISTORY_SCAN, HistoryRow
from corral.core.states import State, shown, shown_counts
from corral.core.stats import percentile
from corral.stores.base import BatchSummary, Store, batch_status
from corral.stores.gates import breaker_row, limit_state

#: A named query and its (named) parameters.
Read = tuple[str, Mapping[str, Any]]


_STATES = {s.value: s for s in State}


def adaptive_row(row: Sequence[Any]) -> AdaptiveRow:
    """An ``adaptive_limits`` row (both dialects): name, spec, effective concurrency and rate, state."""
    import json

    name, spec, concurrency, rate, state = row[:5]
    st = None if state is None else ControllerState.from_dict(json.loads(state))
    return AdaptiveRow(name, AdaptiveSpec.from_json(spec), concurrency, rate, st)


def unknown_status_error(raw: object) -> str:
    """The error shown on a row whose stored status names no state."""
    return f"unknown status {raw!r} stored for this task; shown as FAILED, `corral retry` queues it again"


def task_record(row: Mapping[str, Any], limits: Sequence[str], depends_on: Sequence[int]) -> TaskRecord:
    """A task row, read by column name; ``limits`` and ``depends_on`` are
    stored differently by each dialect, so the caller decodes them.

    A status that names no state (a row written before the schema checked
    it, or by another program) reads as FAILED with an error saying what was
    stored: listing tasks never fails on one bad row, and nothing claims it."""
    if not isinstance(row, dict):
        # sqlite3.Row finds a column by name with a case-blind scan of all
        # forty: read whole into a dict once (a claim's records took a third
        # of its time)
        row = dict(zip(row.keys(), row))
    status = _STATES.get(row["status"])
    error = row["error"]
    # columns a hot read (a claim) may leave out of its row read as None
    get = row.get
    crashes, ref, on_upstream_failure = get("crashes"), get("ref"), get("on_upstream_failure")
    traceback, expires_at, debounce_key = get("traceback"), get("expires_at"), get("debounce_key")
    if status is None:
        status, error = State.FAILED, unknown_status_error(row["status"])
    return TaskRecord(
        id=row["id"],
        name=row["name"],
        args=row["args"],
        status=status,
        queue=row["queue"],
        priority=row["priority"],
        attempt=row["attempt"],
        max_retries=row["max_retries"],
        timeout=row["timeout"],
        group=row["group_key"],
        batch=row["batch"],
        key=row["idem_key"],
        trace_id=row["trace_id"],
        limits=tuple(limits),
        depends_on=tuple(depends_on),
        halt_group_on_failure=bool(row["halt_group_on_failure"]),
        created_at=row["created_at"],
        run_at=row["run_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        result=row["result"],
        error=error,
        version=row["version"],
        lease_token=row["lease_token"],
        lease_expires_at=row["lease_expires_at"],
        worker_id=row["worker_id"],
        progress=row["progress"],
        progress_message=row["progress_message"],
        checkpoint=row["checkpoint"],
        cancel_requested=bool(row["cancel_requested"]),
        snoozes=row["snoozes"] or 0,
        crashes=crashes or 0,
        ref=ref,
        on_upstream_failure=on_upstream_failure or "cancel",
        traceback=traceback,
        expires_at=expires_at,
        debounce_key=debounce_key,
    )


def shown_record(rec: TaskRecord) -> TaskRecord:
    """``rec`` as a reader sees it: RESERVED while held but not started."""
    rec.status = shown(rec.status, rec.started_at)
    return rec


def status_filter(status: State) -> str:
    """The condition (no parameter) that matches the rows shown in ``status``."""
    if status is State.RESERVED:
        return "(status = 'RUNNING' AND started_at IS NULL)"
    if status is State.RUNNING:
        return "(status = 'RUNNING' AND started_at IS NOT NULL)"
    return f"status = '{status.value}'"


def first_line(exc: BaseException) -> str:
    """A driver error as one line for a :class:`~corral.errors.StoreError`.

    Drivers put detail on later lines and nest causes with "failed:"
    (psycopg: 'connection failed: connection to server at "h", port 1
    failed: Connection refused'); the user needs the innermost cause."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    if "failed:" in line:
        line = line.rsplit("failed:", 1)[1].strip()
    return line[:1].lower() + line[1:] if line else line


def summary_from_rows(
    batch: str, counts_rows: Sequence[Sequence[Any]], durations_rows: Sequence[Sequence[Any]]
) -> BatchSummary:
    """A batch summary from the rows of the ``batch_counts`` and
    ``batch_durations`` queries (the same in both dialects)."""
    counts = shown_counts({status: n for status, n, _, _ in counts_rows})
    created = [c for _, _, c, _ in counts_rows if c is not None]
    finished = [f for _, _, _, f in counts_rows if f is not None]
    durations = [d for (d,) in durations_rows]
    return BatchSummary(
        batch=batch,
        counts=counts,
        status=batch_status(counts),
        total=sum(counts.values()),
        avg_duration=sum(durations) / len(durations) if durations else None,
        p99_duration=percentile(durations, 0.99),
        first_created_at=min(created, default=None),
        last_finished_at=max(finished, default=None),
    )


class SqlStore(Store):
    """A store on SQL: the parts written once for every dialect."""

    @abc.abstractmethod
    def _read_all(self, reads: Sequence[Read]) -> list[list[Sequence[Any]]]:
        """Run named read queries in one snapshot; the rows of each, in order."""

    def batch_summary(self, batch: str) -> BatchSummary:
        counts_rows, durations_rows = self._read_all(
            [("batch_counts", {"batch": batch}), ("batch_durations", {"batch": batch})]
        )
        return summary_from_rows(batch, counts_rows, durations_rows)

    def finished_history(
        self, *, name: str | None = None, batch: str | None = None, limit: int = 10_000
    ) -> list[HistoryRow]:
        if batch is not None:
            read: Read = ("history_of_batch", {"batch": batch, "name": name, "limit": max(0, limit)})
        else:
            # among the newest tasks of every name, so a rare name's read stays bounded too
            read = ("history_of_name", {"name": name, "limit": max(0, limit), "scan": max(0, limit) * HISTORY_SCAN})
        (rows,) = self._read_all([read])
        return [
            HistoryRow(status, started_at, finished_at, attempt) for status, started_at, finished_at, attempt in rows
        ]

    def limits(self) -> dict[str, LimitSpec]:
        (rows,) = self._read_all([("limits", {})])
        specs = (limit_state(r).spec for r in rows)
        return {spec.name: spec for spec in specs if KEY_SEP not in spec.name}

    def _limit_states(self) -> tuple[list[LimitState], float]:
        (rows,) = self._read_all([("limits", {})])
        states = (limit_state(r) for r in rows)
        return [lim for lim in states if KEY_SEP not in lim.spec.name], self.now()

    def limit_tokens(self) -> dict[str, float]:
        return self._per_limit(LimitState.tokens_now)

    def limit_frees_at(self) -> dict[str, float]:
        return self._per_limit(LimitState.frees_at)

    def _per_limit(self, read: Callable[[LimitState, float], float | None]) -> dict[str, float]:
        """``read`` of each limit at the store's time, for the limits it says something of."""
        states, now = self._limit_states()
        return {lim.spec.name: v for lim in states if (v := read(lim, now)) is not None}

    def adaptive_limits(self) -> dict[str, AdaptiveRow]:
        (rows,) = self._read_all([("adaptive_limits", {})])
        return {r[0]: adaptive_row(r) for r in rows}

    @abc.abstractmethod
    def _names_param(self, names: Sequence[str]) -> Any:
        """A list of names as the dialect's queries take one (``limits_named``)."""

    def gate_rows(self, names: Collection[str]) -> Gates:
        wanted = sorted({n for name in names for n in (name, split_key(name)[0])})
        now = self.now()
        limit_rows, usage_rows, breaker_rows = self._read_all(
            [("limits_named", {"names": self._names_param(wanted)}), ("limit_usage", {}), ("breakers", {})]
        )
        limits = {(lim := limit_state(r)).spec.name: lim for r in limit_rows}
        breakers = {(b := breaker_row(r)).name: b for r in breaker_rows}
        return Gates(now, limits, {name: used for name, used in usage_rows}, breakers)

    def limit_usage(self) -> dict[str, int]:
        (rows,) = self._read_all([("limit_usage", {})])
        return fold_keys((name, used) for name, used in rows)

    def busiest_keys(self, top: int = 5) -> dict[str, list[tuple[str, int]]]:
        (rows,) = self._read_all([("limit_usage", {})])
        return busiest_keys(((name, used) for name, used in rows), top)
