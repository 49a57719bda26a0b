"""``sqlite:///path``: the default store, one file shared by worker processes.

URL forms: ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db``;
options go in the query string: ``?synchronous=FULL`` (default ``NORMAL``),
``?busy_timeout=<ms>`` (default 5000) and ``?mode=0640`` (default ``0600``).

A new database file is created with ``mode`` (owner only by default: task
arguments may be private); SQLite gives its ``-wal`` and ``-shm`` files the
same mode. An existing file keeps the mode it has.

Errors: locked or busy beyond ``busy_timeout`` raises
:class:`~corral.errors.StoreError` (try again); a file that is not a
database or is damaged, a schema that is missing or newer than this corral
knows, or a file this process may not write raises
:class:`~corral.errors.StoreCorrupt` (retrying cannot help).

How it is made safe and fast for several processes on one file:

* The database runs in WAL mode: readers never block the writer and the
  writer never blocks readers. Every write is one short ``BEGIN IMMEDIATE``
  transaction (the write lock is taken up front, so two writers never deadlock
  upgrading a read lock). Threads of one process queue for it on a Python
  lock; a process that finds it held by another retries every fraction of a
  millisecond, up to ``busy_timeout`` ms (SQLite's own busy handler would
  sleep in steps of up to 100 ms).
* WAL checkpoints run on a background thread of each store instance (every
  ``CHECKPOINT_INTERVAL`` s after a write; ``PASSIVE``: they never block a
  writer), not inside whichever commit crosses SQLite's page threshold: there
  a claim would stall for the checkpoint's copy and fsync, which cost an
  I/O-bound worker about 6 % of its throughput. The last connection to close
  checkpoints what is left, as SQLite always does.
* ``synchronous=NORMAL`` (the default here): in WAL mode a commit is not
  fsynced, the WAL is at checkpoints. A power loss or OS crash may therefore
  lose the last transactions committed before it, but never corrupts the
  database; a crash of a process alone loses nothing. ``?synchronous=FULL``
  fsyncs every commit instead, for durability over throughput.
* One connection per thread (``threading.local``), opened with
  ``isolation_level=None``: this module begins and ends every transaction
  itself. A process forked from one that used the store opens fresh
  connections (SQLite connections must not cross a fork).
* Claims, completions and submits are batched: one transaction claims up to
  ``max_units`` claims, applies a whole list of outcomes, or inserts a whole
  submit (``executemany``). The SQL text is constant (``sql/sqlite.sql``), so
  sqlite3 keeps every statement prepared.
* Claim cost does not grow with finished tasks: candidates come from a
  partial index holding only queued rows, the head rule from one holding only
  the tasks that still occupy a group, leases from ones holding only RUNNING
  rows.
* While only plain work (no group, no limit) is queued, a claim is one
  ``UPDATE ... RETURNING`` (``claim_plain``); a full claim re-checks every
  200 ms, and a submit of grouped or limited work in this process ends the
  fast path at once. It can only ever take plain tasks, so group order and
  limits never depend on it.
* While no group's head is queued, a claim of ungrouped work under limits
  of a concurrency only (plain or keyed) is one read of its first
  candidates and their gates (``claim_keyed``) and one write: a pure
  function (:mod:`corral.core.keyed_claims`) shows the planner's answer
  from the places held and each candidate's place under each gate, or
  says it cannot (a rate, a breaker not closed, a gate that binds over
  work it does not order, too few keys read), and the full claim decides.
  The places are counted in the claim's write transaction, so no cap is
  ever passed, fleet-wide; the hint is looked at again every 200 ms (two
  indexed reads), and grouped work submitted here ends it at once.
* :meth:`SQLiteStore.wait_for_work` polls ``PRAGMA data_version`` (which
  changes when another connection, in any process, commits) about every
  millisecond, so an idle worker starts a new task within a few ms. A
  worker's wait ends only on a commit after which something in its queues is
  due (one indexed read, no lock): completions and claims elsewhere do not
  send it to the write lock for a claim that finds nothing.

Claim order (rule 4 of :mod:`corral.stores.base`) sorts by an *eligible* time
that for a group head is ``max(run_at, group.last_claimed_at)``, which no index
can hold. Candidates are read in index order ``(run_at - priority * 60, id)``
(the ageing rank of :mod:`corral.core.priorities`); since the eligible time is
never before ``run_at``, a candidate read so far
may be taken as soon as its key is not after the index key of the row just
read (a small heap), so only as many rows are read as the claim needs.
"""

from __future__ import annotations

import functools
import heapq
import json
import logging
import math
import os
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import astuple, replace
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

from corral.core import adaptive as adp
from corral.core import breaker as brk
from corral.core import dag, texts
from corral.core import keyed_claims as fast
from corral.core import limits as limit_rules
from corral.core.batches import FINAL_STATUSES as FINAL_BATCH
from corral.core.batches import callback_task
from corral.core.claims import NO_LIMITS, Candidate, ClaimPlanner, ClaimRequest, Relay
from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.core.cron import (
    EARLY,
    ENQUEUED,
    SKIPPED,
    TAKEN,
    Schedule,
    ScheduleState,
    TickRecord,
    TickResult,
    first_stamp,
    too_early,
)
from corral.core.events import LIMIT as LIMIT_EVENT
from corral.core.events import LIMIT_ADAPTED, LIMIT_KEY_ADAPTED, limit_key_subject
from corral.core.gates import (
    KEY_SEP,
    BreakerRow,
    Gates,
    LazyUsage,
    LimitState,
    key_at_rest,
    keyed_name,
    record_outcomes,
)
from corral.core.minutes import FinishedRun, MinuteStat
from corral.core.model import (
    BreakerEvent,
    Claim,
    LimitSpec,
    NewTask,
    Outcome,
    Start,
    SubmitResult,
    TaskFilter,
    TaskRecord,
    WorkerInfo,
    dumps,
    loads,
)
from corral.core.pauses import Pause, Paused, pause_order
from corral.core.pauses import event_of as pause_event
from corral.core.priorities import claim_rank
from corral.core.states import FINAL, State, check_transition, shown_counts
from corral.errors import ConfigError, StoreCorrupt, StoreError, StoreUnavailable, SubmitError
from corral.stores.base import (
    STILL_GOING,
    TICKS_KEPT_SECONDS,
    Event,
    FinishedTask,
    FleetLevel,
    GroupLine,
    HeartbeatReply,
    Rescue,
    SweepRow,
    check_bound,
    prune_params,
    schedule_params,
    schedule_state,
)
from corral.stores.filewatch import FileWatch, open_watch
from corral.stores.gates import breaker_row, limit_params, limit_state
from corral.stores.sql import load
from corral.stores.sqlbase import (
    Read,
    SqlStore,
    adaptive_row,
    first_line,
    shown_record,
    status_filter,
    summary_from_rows,
    task_record,
)

#: 1: the first schema; 2: index tasks_waiting; 3: triggers refuse a status that names no state;
#: 4: flow control (a limit's bucket and pause, snoozes, breakers);
#: 5: the dead-letter index, the fleet_control row and the events log;
#: 6: the retry path's index (tasks waiting to be retried, in claim order);
#: 7: periodic schedules and their ticks;
#: 13: batch settings (callbacks) and the index of a batch's unfinished tasks;
#: 14: the dashboard's indexes;
#: 16: the event stream's triggers (task states and progress, breakers);
#: 18: the claim-order indexes hold the ageing rank (core/priorities.py);
#: 19: ready_at, a group head's place in the round robin, and an index of
#: ready heads in that order (a claim no longer reads every queued head);
#: 20: graph columns (ref, on_upstream_failure);
#: 21: a claim behind a full limit looks read-only first (gated_signature), and a
#: group's running task is found from its own index;
#: 22: a search by group reads its line's index and an index of the tasks that
#: left the line (no index of every grouped task);
#: 24: a task's crash count (tasks.crashes);
#: 25: a failed attempt's traceback (tasks.traceback);
#: 30: a limit's log of recent starts (named_limits.starts, a sliding window's);
#: 34: worker processes' rows (workers);
#: 35: an index of held rows by worker (dropped again: a write per claim);
#: 36: each minute's figures (minute_stats);
#: 37: debounce and supersede keys (tasks.debounce_key, tasks.supersede_key);
#: 38: a deadline for a task's first start (tasks.expires_at, its partial index
#: tasks_expires) and why a running task was asked to stop (tasks.cancel_reason);
#: 39: pauses by hand (pauses: a queue, a group or a limit);
#: 40: an index of the declared limits apart from keyed limits' keys (named_limits_declared).
#: 41: limits changed while running (named_limits.per_key, set_by, declared,
#: changed_at, and the index of changes a claim behind a full limit reads).
#: 43: adaptive limits (named_limits.adaptive, .controller) and the workers' reports (limit_reports).
#: 44: the places held under each limit (held_places, kept by triggers).
#: Other numbers were skipped (only the highest is compared).
#: The schema script is idempotent: an older file reruns it whole, and
#: columns added since are added where missing.
SCHEMA_VERSION = 44
#: How long a claim behind a full limit may answer "nothing changed" without
#: looking (work that became due with no commit waits at most this long).
GATED_LOOK_EVERY = 0.05
#: At most this many expired tasks a claim met are ended in its transaction
#: (the sweeper's leader ends the rest).
EXPIRE_IN_CLAIM = 100
#: How long a claimer trusts "only plain work is queued" (no group, no limit)
#: before it looks again; a submit of grouped or limited work here ends it at once.
PLAIN_HINT_TTL = 0.2
#: How many candidates the fast path of ungrouped work reads: n x its reach
#: (+ 4), the reach doubled after a read that held too few keys' first turns
#: (up to KEYED_REACH_MOST), and back towards KEYED_REACH after each claim it made.
#: Each candidate costs the read about 5 us.
KEYED_REACH = 1.0
KEYED_REACH_MOST = 16.0
KEYED_WINDOW_MOST = 512
#: How often a follower of the event stream looks for new events.
EVENTS_POLL = 0.02
#: How often a waiting thread looks at the database's data_version: without
#: a watch on its files, every millisecond; with one, when they are written,
#: and at least this often (wake_waiters() is seen within one slice).
POLL_SLICE = 0.001
WATCH_SLICE = 0.02
#: After a watch wakes a waiting thread and data_version shows no change, it
#: looks again every SETTLE_STEP for SETTLE seconds before sleeping on the
#: watch again: the WAL write that woke it can come before the commit shows
#: (see wait_for_work).
SETTLE = 0.002
SETTLE_STEP = 0.0002
#: A group's tasks, as the two indexes that hold them say: in its line, or
#: out of it (their conditions word for word, so a search by group reads
#: them both).
_GROUP_PARTS = (
    "(status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING') OR (status = 'FAILED' AND halt_group_on_failure = 1))",
    "(status IN ('SUCCESS', 'TIMEOUT', 'CANCELED') OR (status = 'FAILED' AND halt_group_on_failure = 0))",
)
#: States whose rows a list reads from a partial index of its own, and the
#: term (the index's condition) that lets SQLite use it: few rows (the running
#: ones, bounded by the workers' slots; retries; dead letters), where a walk of
#: the primary key would pass every finished task first.
_STATE_INDEX = {
    State.RUNNING: ("tasks_running_expiry", None),
    State.RESERVED: ("tasks_running_expiry", None),
    State.RETRYING: ("tasks_queued_run_at", "status IN ('PENDING', 'RETRYING')"),
    State.FAILED: ("tasks_dead", "status IN ('FAILED', 'TIMEOUT')"),
    State.TIMEOUT: ("tasks_dead", "status IN ('FAILED', 'TIMEOUT')"),
}
#: The same when every match is wanted: a page walks the newest queued tasks
#: by id and stops at 50, but a bulk action's ids would walk past them to
#: the first task (with a million finished ones 200 ms), where the index of
#: queued tasks holds them all.
_WHOLE_STATE_INDEX = {
    **_STATE_INDEX,
    State.PENDING: ("tasks_queued_run_at", "status IN ('PENDING', 'RETRYING')"),
    State.WAITING: ("tasks_waiting", None),
}
#: How often the background checkpointer copies the WAL into the database
#: (only after this store instance wrote something).
CHECKPOINT_INTERVAL = 0.2
#: A WAL file past this size is reset (a ``TRUNCATE`` checkpoint): under
#: steady reads and writes from several processes a ``PASSIVE`` checkpoint
#: copies pages back but the WAL never restarts from its beginning, and it
#: grows without bound (over 100 MB in a two-minute run of the demo).
WAL_RESET_BYTES = 32 * 1024 * 1024
#: How long (ms) that reset may wait for readers; it holds writers off meanwhile.
WAL_RESET_WAIT_MS = 50

Q = load("sqlite")

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
#: Claimable states; State is a str enum, so a status column compares equal without conversion.
_QUEUED = (State.PENDING, State.RETRYING)
_UNAVAILABLE_HINTS = ("unable to open", "disk i/o", "no such file")
#: SQLite result codes no retry can cure: damaged or foreign file, no write access.
_PERMANENT_CODES = {"SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH"}
_PERMANENT_HINTS = ("not a database", "malformed", "readonly", "read-only", "no such table", "no such column")
#: Mode of a database file corral creates (``?mode=`` overrides).
DEFAULT_FILE_MODE = 0o600


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///rel.db`` -> ``("rel.db", {})``; ``sqlite:////abs.db?x=y`` -> ``("/abs.db", {"x": "y"})``."""
    prefix = "sqlite://"
    if not url.lower().startswith(prefix):
        raise ConfigError(f"not a SQLite store URL: {url!r} (expected sqlite:///path)")
    rest = url[len(prefix) :]
    rest, _, query = rest.partition("?")
    if not rest.startswith("/"):
        raise ConfigError(f"cannot parse SQLite URL {url!r}: expected sqlite:///relative or sqlite:////absolute path")
    path = rest[1:]
    if not path:
        raise ConfigError(f"SQLite URL {url!r} names no file")
    if path == ":memory:":
        raise ConfigError("sqlite:///:memory: is not shared between connections; use memory:// instead")
    options = dict(parse_qsl(query, keep_blank_values=True))
    for name in options:
        if name not in ("synchronous", "busy_timeout", "mode"):
            raise ConfigError(f"unknown SQLite URL option {name!r} (known: synchronous, busy_timeout, mode)")
    return os.path.expanduser(path), options


def _must_exist(url: str, path: str) -> None:
    """Raise unless ``path`` is a SQLite file holding a corral store."""
    shown = os.path.abspath(path)
    if not os.path.exists(path):
        raise StoreUnavailable(
            f"no corral store at {url}: {shown} does not exist (a command that only reads never creates one;"
            " give --store or set CORRAL_STORE)"
        )
    try:
        con = sqlite3.connect(path)
        try:
            found = con.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'corral_schema'"
            ).fetchone()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"no corral store at {url}: {shown} cannot be read as SQLite ({exc})") from None
    if found is None:
        raise StoreUnavailable(f"no corral store at {url}: {shown} holds no corral tables")


def _permanent(exc: sqlite3.Error) -> bool:
    """True for an error no retry cures (see :data:`_PERMANENT_CODES`)."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    if "_".join(name.split("_")[:2]) in _PERMANENT_CODES:  # SQLITE_READONLY_DBMOVED -> SQLITE_READONLY
        return True
    return any(h in str(exc).lower() for h in _PERMANENT_HINTS)


def _translate(exc: sqlite3.Error, path: str) -> StoreError:
    text = first_line(exc)
    if _permanent(exc):
        return StoreCorrupt(f"cannot use SQLite database {path!r}: {text}")
    if isinstance(exc, sqlite3.OperationalError | sqlite3.DatabaseError) and any(
        h in text.lower() for h in _UNAVAILABLE_HINTS
    ):
        return StoreUnavailable(f"cannot use SQLite database {path!r}: {text}")
    return StoreError(f"SQLite store {path!r}: {text}")


log = logging.getLogger("corral.store")

#: What a write raises for a value SQLite cannot hold in one row (an int
#: past 64 bits, a NaN where NULL is refused, a type it cannot bind).
_REFUSED_DATA = (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.DataError, OverflowError)


@contextmanager
def _refused_as_store_error() -> Iterator[None]:
    """A refused value as a StoreError (not a bare OverflowError) for callers
    that fall back to another write on one."""
    try:
        yield
    except OverflowError as exc:
        raise StoreError(f"{type(exc).__name__}: {first_line(exc)}") from exc


def _guard(fn):
    """Translate sqlite3 errors into corral's StoreError tree at the boundary."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    return wrapper


@functools.lru_cache(maxsize=256)
def _limits_json(limits: tuple[str, ...]) -> str:
    """A task's limits as stored: every task of a name has the same few."""
    return dumps(list(limits))


def _row_fields(nt: NewTask, status: State, error: str | None, now: float) -> tuple:
    """A new task's row for ``insert_task``, all but its id."""
    return (
        nt.name,
        nt.args,
        status.value,
        nt.queue,
        nt.priority,
        nt.max_retries,
        nt.timeout,
        nt.group,
        nt.batch,
        nt.key,
        nt.trace_id,
        _limits_json(tuple(nt.limits)) if nt.limits else None,
        1 if nt.halt_group_on_failure else 0,
        now,
        nt.run_at if nt.run_at is not None else now,
        now if status.final else None,
        error,
        nt.ref,
        nt.on_upstream_failure,
        nt.debounce_key,
        nt.supersede_key,
        nt.expires_at,
    )


#: Where a row of ``insert_task`` (its id, then :func:`_row_fields`) holds the group.
_GROUP_FIELD = 8
#: Where :func:`_row_fields` holds run_at.
_RUN_AT_FIELD = 14


def _keyed(nt: NewTask) -> bool:
    """A debounce or supersede key: the submit reads and writes other rows."""
    return nt.debounce_key is not None or nt.supersede_key is not None


def _record(row: sqlite3.Row, deps: tuple[int, ...] = ()) -> TaskRecord:
    return task_record(row, json.loads(row["limits"]) if row["limits"] else (), deps)  # type: ignore[arg-type]


#: Candidates a claim reads ahead, when it first meets a key it has not
#: counted, to count the places and read the rows of their keys with it in one
#: go: as many as it asks units for, at most KEYS_AHEAD (twice as many each
#: next time, at most KEYS_AHEAD_MOST).
KEYS_AHEAD = 32
KEYS_AHEAD_MOST = 1024
#: Candidates in a row a claim passes over (a shut gate, a key served in
#: this pass) before it reads on without their limits and names.
PASS_OVER_RUN = 8


#: Rows of rates a claim charges in one statement (four parameters each:
#: SQLite binds at most 32 766).
CHARGES_AT_ONCE = 256


@functools.lru_cache(maxsize=64)
def _charges_sql(n: int) -> str:
    """``limit_charge`` for ``n`` rows in one statement."""
    head, _, tail = Q["limit_charge"].partition("VALUES (?, ?, ?, ?)")
    return head + "VALUES " + ", ".join(["(?, ?, ?, ?)"] * n) + tail


class _CandidateRow(NamedTuple):
    """A row of the claim's candidate queries (``claim_candidates`` and its
    kin; ``group_followers`` without ``ord``)."""

    id: int
    priority: int
    run_at: float
    group: str | None
    name: str
    limits: str | None
    queue: str
    status: str
    #: its place in the claim index (see :meth:`index_key`)
    ord: float | None = None
    #: past the deadline of its first start: the claim ends it, never starts it
    expired: int = 0

    def index_key(self) -> tuple:
        """Where it sits in its claim index: (ord, id); a head with no place
        yet (ord NULL) sorts first, as SQLite sorts NULL."""
        return (-math.inf if self.ord is None else self.ord, self.id)

    def candidate(self, now: float) -> Candidate:
        return Candidate(
            self.id,
            self.name,
            self.queue,
            self.group,
            frozenset(json.loads(self.limits)) if self.limits else NO_LIMITS,
            self.status == State.RETRYING,
            due=self.run_at <= now,
            queued=self.status in _QUEUED,
        )


def _candidate_cursor(con: sqlite3.Connection) -> sqlite3.Cursor:
    r"""A cursor whose rows are :class:`_CandidateRow`\ s (the claim's candidate queries)."""
    cur = con.cursor()
    cur.row_factory = _candidate_row
    return cur


def _candidate_row(_cur: sqlite3.Cursor, row: tuple) -> _CandidateRow:
    return _CandidateRow(*row)


def _task_cursor(con: sqlite3.Connection) -> sqlite3.Cursor:
    """A cursor whose rows are read by column name (task rows, and any row
    wider than one or two values; narrower rows are unpacked into names)."""
    cur = con.cursor()
    cur.row_factory = sqlite3.Row
    return cur


class _PlainRows:
    """A caller's connection seen as this store's own: rows as tuples
    whatever its ``row_factory``, statements on a cursor of its own."""

    def __init__(self, con: sqlite3.Connection):
        self._con = con

    def _cursor(self) -> sqlite3.Cursor:
        cur = self._con.cursor()
        cur.row_factory = None
        return cur

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        return self._cursor().execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        return self._cursor().executemany(sql, rows)


def _next_id(con: sqlite3.Connection) -> int:
    """The id the next inserted task takes."""
    (base,) = con.execute(Q["next_id_base"]).fetchone()
    return base + 1


def _split_script(script: str) -> list[str]:
    """Split a script into statements (executescript would COMMIT our transaction)."""
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip() and not all(ln.strip().startswith("--") or not ln.strip() for ln in buf.splitlines()):
        out.append(buf.strip())
    return out


class _Claimed(NamedTuple):
    """A claim's rows, per lease token, and their dependencies: read under
    the write lock, made records after it (every other writer waits meanwhile)."""

    parts: list[tuple[str, str | None, list]]
    deps: dict[int, tuple[int, ...]]

    def claims(self) -> list[Claim]:
        return [
            Claim(token, [_record(r, self.deps.get(r[0], ())) for r in rows], group)
            for token, group, rows in self.parts
            if rows
        ]


def _list_sql(select: str, flt: TaskFilter, *, whole: bool = False) -> tuple[str, list[Any]]:
    """``select`` (its columns, then ``FROM tasks``) with the conditions, order
    and page of ``flt``; ``whole``: every match is wanted (a bulk action's
    ids), so a queued state is read from its partial index too."""
    where: list[str] = []
    params: list[Any] = []
    if flt.status is not None:
        where.append(status_filter(State(flt.status)))
    for column, value in (
        ("queue", flt.queue),
        ("batch", flt.batch),
        ("group_key", flt.group),
        ("name", flt.name),
        ("trace_id", flt.trace_id),
        ("idem_key", flt.key),
    ):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if flt.error_prefix is not None:
        where.append("substr(error, 1, ?) = ?")
        params += [len(flt.error_prefix), flt.error_prefix]
    if flt.after_id is not None:
        where.append("id < ?" if flt.newest_first else "id > ?")
        params.append(flt.after_id)
    if flt.min_id is not None:
        where.append("id >= ?")
        params.append(flt.min_id)
    if flt.max_id is not None:
        where.append("id <= ?")
        params.append(flt.max_id)
    if flt.group is not None:
        # every grouped task is in the line's index or in the finished
        # ones': one arm each, merged in id order
        arms = [" AND ".join([*where, part]) for part in _GROUP_PARTS]
        sql = " UNION ALL ".join(f"{select} WHERE {arm}" for arm in arms)
        params = params * len(arms)
    else:
        sql = select
        via = (_WHOLE_STATE_INDEX if whole else _STATE_INDEX).get(State(flt.status)) if flt.status else None
        if via is not None and not (flt.batch or flt.trace_id or flt.key):
            # a sparse state read from its own partial index, not by a walk
            # of every task in id order (SQLite keeps no statistics here, and
            # walks the primary key for the ORDER BY): a page of RUNNING
            # tasks among a million finished read 300 ms, now under 1 ms
            index, implied = via
            sql = sql.replace("FROM tasks", f"FROM tasks INDEXED BY {index}", 1)
            if implied:
                where.append(implied)
        if where:
            sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id DESC" if flt.newest_first else " ORDER BY id"
    sql += " LIMIT ? OFFSET ?"
    params += [max(0, flt.limit), max(0, flt.offset)]
    return sql, params


class SQLiteStore(SqlStore):
    """The store on one SQLite file (see the module docstring)."""

    shared = True

    def __init__(self, url: str, *, clock: Clock = SYSTEM_CLOCK, create: bool = True):
        self.url = url
        self._clock = clock
        self._wakes = 0  # wake_waiters() calls: a change ends every wait_for_work()
        self.path, options = parse_url(url)
        sync = options.get("synchronous", "NORMAL").upper()
        if sync not in _SYNCHRONOUS:
            raise ConfigError(f"synchronous must be one of {', '.join(_SYNCHRONOUS)}, not {sync!r}")
        self.synchronous = sync
        try:
            self.busy_timeout_ms = int(options.get("busy_timeout", "5000"))
        except ValueError:
            raise ConfigError(f"busy_timeout must be milliseconds, not {options['busy_timeout']!r}") from None
        try:
            self.file_mode = int(options["mode"], 8) if "mode" in options else DEFAULT_FILE_MODE
        except ValueError:
            raise ConfigError(f"mode must be octal permission bits like 0600, not {options['mode']!r}") from None
        if not 0 <= self.file_mode <= 0o777:
            raise ConfigError(f"mode must be octal permission bits like 0600, not {options['mode']!r}")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []
        self._watches: list[FileWatch] = []  # the waiting threads' (closed with the store)
        self._pid = os.getpid()
        self._write_lock = threading.RLock()  # RLock: a write may nest in another (migrate)
        self._plain_until = 0.0  # monotonic time until which claims take the plain fast path
        self._keyed_until = 0.0  # ... and the fast path of ungrouped work (claim_keyed)
        self._keyed_missed_until = 0.0  # claim_keyed could not decide: not tried again until then
        self._keyed_reach = KEYED_REACH  # claim_keyed reads n x this candidates
        self._fake_time = False  # a clock of its own: events take its time (set after migrate)
        self._closed = False
        self._wrote = False  # written since the last checkpoint
        self._checkpointer: threading.Thread | None = None
        self._stopping = threading.Event()
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise StoreUnavailable(f"cannot open SQLite database {self.path!r}: directory {directory!r} does not exist")
        if not create:  # what commands that only read ask: never make a new store
            _must_exist(url, self.path)
        self._create_file()
        self._con()  # fail now, not at first use, when the file cannot be opened
        self.migrate()  # idempotent and cheap once done; a store is usable as opened
        self._claim_clock()

    def __reduce__(self):  # a store travels to a spawned process as its URL
        return (type(self), (self.url,))

    def __repr__(self) -> str:
        return f"SQLiteStore({self.url!r})"

    # ---- connections --------------------------------------------------------
    def _create_file(self) -> None:
        """Create the database file with ``file_mode`` before SQLite would
        create it with the umask's (usually world-readable); never change an
        existing file's mode."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.file_mode)
        except FileExistsError:
            return
        except OSError as exc:
            raise StoreUnavailable(f"cannot create SQLite database {self.path!r}: {exc.strerror}") from None
        try:
            os.fchmod(fd, self.file_mode)  # exactly the mode asked, whatever the umask
        finally:
            os.close(fd)

    def _con(self) -> sqlite3.Connection:
        if self._pid != os.getpid():  # forked: the parent's connections are not ours
            self._pid = os.getpid()
            self._local = threading.local()
            self._conns = []
            self._watches = []
            self._write_lock = threading.RLock()
            self._checkpointer = None  # threads do not survive a fork
            self._stopping = threading.Event()
        con = getattr(self._local, "con", None)
        if con is not None:
            return con
        if self._closed:
            raise StoreError("SQLite store is closed")
        try:
            con = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_ms / 1000.0,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
            con.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            self._set_wal(con)
            con.execute(f"PRAGMA synchronous = {self.synchronous}")
            con.execute("PRAGMA temp_store = MEMORY")
            con.execute("PRAGMA cache_size = -16000")
            con.execute("PRAGMA wal_autocheckpoint = 0")  # the checkpointer thread does it
        except sqlite3.Error as exc:
            kind = StoreCorrupt if _permanent(exc) else StoreUnavailable
            raise kind(f"cannot open SQLite database {self.path!r}: {first_line(exc)}") from exc
        self._local.con = con
        with self._lock:
            self._conns.append(con)
        return con

    def _set_wal(self, con: sqlite3.Connection) -> None:
        deadline = time.monotonic() + self.busy_timeout_ms / 1000.0
        while True:
            try:
                (mode,) = con.execute("PRAGMA journal_mode = WAL").fetchone()
                break
            except sqlite3.OperationalError as exc:  # another process is converting it
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)
        if str(mode).lower() != "wal":
            raise StoreUnavailable(f"cannot put SQLite database {self.path!r} in WAL mode (got {mode!r})")

    def _begin_immediate(self, con: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE, retried every fraction of a millisecond.

        Another process holding the write lock usually lets go within a
        millisecond; SQLite's own busy handler would sleep up to 100 ms. The
        pause stays short (at most 0.25 ms, a try costs a few microseconds):
        with pauses growing to 2 ms a waiting process missed the moments the
        lock was free, and the other process's next write took it again (a
        claim of fresh work waited 4 ms behind two claims and a completion).
        """
        deadline = time.monotonic() + self.busy_timeout_ms / 1000.0
        pause = 0.00005
        con.execute("PRAGMA busy_timeout = 0")
        try:
            while True:
                try:
                    con.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                        raise
                time.sleep(pause)
                pause = min(0.00025, pause * 1.5)
        finally:
            con.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction that holds the write lock from its start.

        Threads of one process queue on a Python lock first: SQLite's busy
        handler sleeps 1-100 ms between tries, so letting twenty slot threads
        contend through it wastes far more time than waiting in line here.
        """
        con = self._con()
        with self._write_lock:
            self._begin_immediate(con)
            try:
                if self._fake_time:  # the event triggers' time (see corral_clock in sqlite.sql)
                    con.execute(Q["set_clock"], (self._clock.time(),))
                yield con
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        self._wrote = True
        if self._checkpointer is None:
            self._start_checkpointer()

    def _start_checkpointer(self) -> None:
        with self._lock:
            if self._checkpointer is None and not self._closed:
                self._checkpointer = threading.Thread(
                    target=self._checkpoint_loop, name="corral-sqlite-checkpoint", daemon=True
                )
                self._checkpointer.start()

    def _checkpoint_loop(self) -> None:
        pid = os.getpid()
        while not self._stopping.wait(CHECKPOINT_INTERVAL):
            if os.getpid() != pid or self._closed:
                return
            if self._wrote:
                self._checkpoint_once()

    def _checkpoint_once(self) -> None:
        """One round: copy the WAL back; past its size bound, reset it. What
        cannot be done now leaves ``_wrote`` set, so the next round tries."""
        self._wrote = False
        try:
            con = self._con()
            con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            if self._wal_bytes() > WAL_RESET_BYTES and not self._reset_wal(con):
                self._wrote = True  # a reader outlasted the wait
        except sqlite3.Error:  # busy or closing
            self._wrote = True

    def _wal_bytes(self) -> int:
        try:
            return os.path.getsize(self.path + "-wal")
        except OSError:
            return 0

    def _reset_wal(self, con: sqlite3.Connection) -> bool:
        """Checkpoint everything and truncate the WAL, waiting a moment for
        the readers of older snapshots; False if they outlasted the wait
        (SQLite says so in the checkpoint's row, raising nothing: with no
        write after it, nothing would try again and the WAL kept its size)."""
        con.execute(f"PRAGMA busy_timeout = {WAL_RESET_WAIT_MS}")
        try:
            busy, _, _ = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        finally:
            con.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        return not busy

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for several reads."""
        con = self._con()
        con.execute("BEGIN")
        try:
            yield con
        finally:
            if con.in_transaction:
                con.execute("COMMIT")

    # ---- life cycle -------------------------------------------------------
    @_guard
    def migrate(self) -> None:
        with self._write() as con:
            con.execute(Q["schema_version_table"])
            (version,) = con.execute(Q["schema_version"]).fetchone()
            version = version or 0
            if version > SCHEMA_VERSION:
                raise StoreCorrupt(
                    f"SQLite database {self.path!r} has schema version {version}, newer than this corral knows"
                    f" ({SCHEMA_VERSION}); upgrade corral"
                )
            if version == SCHEMA_VERSION:
                return
            for stmt in _split_script(Q["schema"]):
                con.execute(stmt)
            for stmt in _split_script(Q["columns_v4"]):
                table, column = stmt.split()[2], stmt.split()[5]
                if column not in {r["name"] for r in _task_cursor(con).execute(f"PRAGMA table_info({table})")}:
                    con.execute(stmt)
            for stmt in _split_script(Q["schema_v17"]):
                con.execute(stmt)
            for stmt in _split_script(Q["event_stream"]):
                con.execute(stmt)
            for stmt in _split_script(Q["held_places"]):
                con.execute(stmt)
            con.execute(Q["set_schema_version"], (SCHEMA_VERSION,))

    def _claim_clock(self) -> None:
        """Events are stamped with SQLite's clock, or with this store's when
        it runs on one of its own (a test's fake clock)."""
        fake = self._clock is not SYSTEM_CLOCK
        with self._write() as con:
            if not fake:
                con.execute(Q["clear_clock"])  # a test left its time here: the real one again
        self._fake_time = fake

    def close(self) -> None:
        self._closed = True
        self._stopping.set()
        if self._checkpointer is not None and self._checkpointer is not threading.current_thread():
            self._checkpointer.join(5.0)
        with self._lock:
            conns, self._conns = self._conns, []
            watches, self._watches = self._watches, []
        for con in conns:
            try:
                con.close()
            except sqlite3.Error:  # pragma: no cover - closing is best effort
                pass
        for watch in watches:
            watch.close()
        self._local = threading.local()

    def now(self) -> float:
        return self._clock.time()

    # ---- helpers ------------------------------------------------------------
    def _deps(self, con: sqlite3.Connection, ids: Sequence[int]) -> dict[int, tuple[int, ...]]:
        if not ids:
            return {}
        out: dict[int, list[int]] = {}
        for tid, dep in con.execute(Q["deps_of"], (dumps(list(ids)),)):
            out.setdefault(tid, []).append(dep)
        return {k: tuple(v) for k, v in out.items()}

    def _records(self, con: sqlite3.Connection, rows: Sequence[sqlite3.Row]) -> list[TaskRecord]:
        deps = self._deps(con, [r["id"] for r in rows])
        return [shown_record(_record(r, deps.get(r["id"], ()))) for r in rows]

    @staticmethod
    def _refresh_heads(con: sqlite3.Connection, groups: Collection[str | None]) -> None:
        """Recompute ``is_head`` of groups whose line may have changed."""
        named = [g for g in groups if g is not None]
        if named:  # (groups are apart: all clears, then all sets)
            con.executemany(Q["head_clear"], [(g, g) for g in named])
            con.executemany(Q["head_set"], [(g,) for g in named])

    def _after_final(
        self, con: sqlite3.Connection, ended: Sequence[tuple[int, State]], now: float, groups: set | None = None
    ) -> None:
        """Dependents of tasks that just reached a final state, then group heads."""
        groups = set() if groups is None else groups
        try:
            self._dependents_after_final(con, ended, now, groups)
        finally:
            self._refresh_heads(con, groups)

    def _dependents_after_final(self, con, ended, now, groups: set) -> None:
        if not ended:
            return
        with_dependents = {tid for (tid,) in con.execute(Q["has_dependents"], (dumps([i for i, _ in ended]),))}
        if not with_dependents:
            return
        frontier = [(tid, status) for tid, status in ended if tid in with_dependents]
        while frontier:  # cancel WAITING dependents, and theirs, down the graph
            nxt = []
            for tid, status in frontier:
                if status is not State.SUCCESS:
                    for did, group in con.execute(
                        Q["cancel_dependents"], (dag.upstream_reason(tid, status.value), now, tid)
                    ).fetchall():
                        nxt.append((did, State.CANCELED))
                        groups.add(group)
                con.execute(Q["promote_dependents"], (tid,))
            frontier = nxt

    # ---- producers --------------------------------------------------------
    @_guard
    def submit(self, tasks: Sequence[NewTask], *, max_queued: int | None = None) -> list[SubmitResult]:
        tasks = list(tasks)
        if not tasks:
            return []
        self._hints_off(tasks)  # claims here must see this work at once
        # Rows that need nothing from the database (no key, no dependency) are
        # made before the write lock is taken: every other process's claims
        # and completions wait while a submit holds it.
        now = self._clock.time()
        made = None
        if not any(t.key is not None or t.depends_on or t.after or _keyed(t) for t in tasks):
            made = [_row_fields(t, State.PENDING, None, now) for t in tasks]
        with self._write() as con:
            return self._submit_on(con, tasks, max_queued, made=made, now=now)

    def _hints_off(self, tasks: Sequence[NewTask]) -> None:
        """End the fast paths this work would be passed over by: grouped or
        limited work ends the plain one, grouped work the one of ungrouped work."""
        if any(t.group is not None or t.limits for t in tasks):
            self._plain_until = 0.0
            if any(t.group is not None for t in tasks):
                self._keyed_until = 0.0

    def _submit_on(
        self,
        con: Any,
        tasks: list[NewTask],
        max_queued: int | None = None,
        *,
        made: list[tuple] | None = None,
        now: float | None = None,
    ) -> list[SubmitResult]:
        """The submit's writes on ``con``, inside a transaction its caller
        holds (this store's own write, or a user's transaction); ``made``:
        the rows (without their ids) when no task has a key or a dependency."""
        if max_queued is not None:  # read under the write lock: no other submit in between
            # (from the partial indexes alone: every other writer waits
            # while this one holds the lock)
            (queued,) = con.execute(Q["queued_count"]).fetchone()
            check_bound({"PENDING": queued}, len(tasks), max_queued)
        if now is None:
            now = self._clock.time()
        if made is not None:
            first = _next_id(con)
            self._insert_rows(con, [(first + i, *fields) for i, fields in enumerate(made)], [])
            return [SubmitResult(first + i, True) for i in range(len(made))]
        all_deps = {d for t in tasks for d in t.depends_on}
        dep_state: dict[int, State] = {}
        if all_deps:
            dep_state = {i: State(s) for i, s in con.execute(Q["dep_states"], (dumps(sorted(all_deps)),))}
            missing = sorted(all_deps - dep_state.keys())
            if missing:
                raise SubmitError(
                    f"unknown dependency id{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
                )
        next_id = _next_id(con)
        results: list[SubmitResult] = []
        rows: list[tuple] = []
        edges: list[tuple[int, int, int]] = []
        batch_keys: dict[str, int] = {}
        #: (name, debounce key) -> where this call's new task of that key is in rows
        debounced: dict[tuple[str, str], int] = {}
        for nt in tasks:
            if nt.debounce_key is not None:
                at = debounced.get((nt.name, nt.debounce_key))
                if at is not None:  # a new task of this same call
                    row = rows[at]
                    rows[at] = (*row[:2], nt.args, *row[3:])
                    results.append(SubmitResult(row[0], False))
                    continue
                bound = nt.debounce_max
                merged = con.execute(
                    Q["debounce_merge"], (nt.args, now + (nt.debounce or 0.0), bound, nt.name, nt.debounce_key)
                ).fetchone()
                if merged is not None:
                    results.append(SubmitResult(merged[0], False))
                    continue
                debounced[(nt.name, nt.debounce_key)] = len(rows)
            if nt.key is not None:
                existing = batch_keys.get(nt.key)
                if existing is None:
                    (existing,) = con.execute(Q["find_key"], (nt.key,)).fetchone() or (None,)
                    if existing is not None and existing not in dep_state:
                        # a later task of this call may depend on it
                        status_now, _, _ = con.execute(Q["status_of"], (existing,)).fetchone()
                        dep_state[existing] = State(status_now)
                if existing is not None:
                    results.append(SubmitResult(existing, False))
                    continue
            tid = next_id
            next_id += 1
            deps = tuple(dict.fromkeys((*nt.depends_on, *(results[j].id for j in nt.after))))
            edges.extend((tid, pos, dep) for pos, dep in enumerate(deps))
            status, error = dag.initial_state([(d, dep_state[d]) for d in deps], nt.on_upstream_failure)
            dep_state[tid] = status
            fields = _row_fields(nt, status, error, now)
            if nt.debounce is not None:
                fields = (*fields[:_RUN_AT_FIELD], now + nt.debounce, *fields[_RUN_AT_FIELD + 1 :])
            rows.append((tid, *fields))
            if nt.key is not None:
                batch_keys[nt.key] = tid
            results.append(SubmitResult(tid, True))
        self._insert_rows(con, rows, edges)
        for nt, r in zip(tasks, results):
            if nt.supersede_key is not None and r.created:
                self._supersede(con, nt.name, nt.supersede_key, r.id, now)
        return results

    def _supersede(self, con: Any, name: str, key: str, newest: int, now: float) -> None:
        """Cancel the queued tasks of ``name`` and ``key`` older than ``newest``
        ("superseded"), and ask a running one to stop."""
        ended = con.execute(Q["supersede_queued"], (now, name, key, newest)).fetchall()
        con.execute(Q["supersede_running"], (name, key, newest))
        if ended:
            groups = {group for _, group in ended if group is not None}
            self._after_final(con, [(tid, State.CANCELED) for tid, _ in ended], now, groups)

    def _insert_rows(self, con: Any, rows: list[tuple], edges: list[tuple[int, int, int]]) -> None:
        if rows:
            con.executemany(Q["insert_task"], rows)
        if edges:
            con.executemany(Q["insert_dep"], edges)
        groups = {r[_GROUP_FIELD] for r in rows if r[_GROUP_FIELD] is not None}
        if groups:
            # New tasks come after every task already in a line: a group that
            # has a head keeps it, and only the others need one.
            headed = {group for (group,) in con.execute(Q["groups_with_head"], (dumps(sorted(groups)),))}
            self._refresh_heads(con, groups - headed)

    def submit_in(
        self, connection: Any, tasks: Sequence[NewTask], *, max_queued: int | None = None
    ) -> list[SubmitResult]:
        """Submit inside the caller's own transaction on ``connection``, a
        :mod:`sqlite3` connection to this store's file: the tasks exist if and
        only if the caller commits. A connection not yet in a transaction
        starts one (BEGIN IMMEDIATE) that the caller commits or rolls back."""
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigError(
                f"connection= must be a sqlite3 connection to {self.path!r} for this store, "
                f"not {type(connection).__name__}"
            )
        tasks = list(tasks)
        try:
            listed = _task_cursor(connection).execute("PRAGMA database_list").fetchall()
            files = [r["file"] for r in listed if r["name"] == "main"]
            same = bool(files and files[0]) and os.path.samefile(files[0], self.path)
        except (sqlite3.Error, OSError) as exc:
            raise ConfigError(f"connection= cannot be used: {first_line(exc)}") from None
        if not same:
            shown = files[0] if files and files[0] else "an in-memory database"
            raise ConfigError(f"connection= is open on {shown}, not on this store's database {self.path!r}")
        if not tasks:
            return []
        self._hints_off(tasks)
        try:
            if not connection.in_transaction:
                connection.execute("BEGIN IMMEDIATE")
            return self._submit_on(_PlainRows(connection), tasks, max_queued)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    # ---- workers ----------------------------------------------------------
    @_guard
    def claim(self, worker_id: str, request: ClaimRequest) -> list[Claim]:
        if request.max_units <= 0 or not request.queues:
            return []
        local = self._local
        if getattr(local, "gated_empty", False):
            # The last claim here found work only behind a full limit (or an
            # open breaker). Look again read-only first: a reader does not
            # wait for the write lock nor keep the other processes' claims
            # and completions from it, and most such looks find nothing.
            con = self._con()
            local.probe_version = con.execute("PRAGMA data_version").fetchone()[0]
            with self._read() as con:
                # Nor does it look when nothing it depends on changed since
                # its last look of the same kind (the limits' places, new
                # tasks, the ready heads), for a moment: work that only became
                # due is found by the next look. A worker with slots per
                # queue claims for its queues in turn: each is its own kind.
                cap, _ = request.retry_bounds()
                kind = (request.queues, request.names, request.only_retries, cap, request.prefetch)
                seen = (kind, *self._gated_signature(con, request.queues))
                if seen == getattr(local, "gated_seen", None) and self._clock.monotonic() < local.gated_until:
                    return []
                if not self._pick(con, request, self._clock.time(), dry=True)[0]:
                    # a gate that opens with time (a rate, a pause, a breaker's
                    # cool-down) changes nothing in the store: look each time
                    timed = self._gate_wake is not None
                    local.gated_seen = None if timed else seen
                    local.gated_until = self._clock.monotonic() + GATED_LOOK_EVERY
                    return []
            del local.probe_version  # work found: the claim below starts afresh
        with self._write() as con:
            claimed = self._claim_on(con, worker_id, request)
        return claimed.claims()

    def _claim_on(
        self, con: sqlite3.Connection, worker_id: str, request: ClaimRequest, relay: Relay | None = None
    ) -> _Claimed:
        """The claim's writes on ``con``, inside the write transaction its
        caller holds; the rows become records once the lock is let go. A
        ``relay`` claims one unit under the running predecessor's token."""
        local = self._local
        now = self._clock.time()
        queues, prefetch = request.queues, request.prefetch
        cap, most = request.retry_bounds()
        simple = len(queues) == 1 and not request.only_retries and relay is None
        mono = time.monotonic()
        if simple and self._keyed_until and self._keyed_until <= mono and self._plain_until <= mono:
            # the fast path's hint ran out: look again (two cheap reads), not
            # through a full claim
            self._hints(con, mono, getattr(local, "timed_gates", False))
        if simple and (self._plain_until > mono or (prefetch and self._keyed_until > mono)):
            # Only plain work was queued a moment ago (or no group's head, and
            # a prefetch takes plain work alone): one statement.
            args: tuple = (
                now + request.lease_seconds,
                worker_id,
                None if prefetch else now,
                queues[0],
                now,
                dumps(sorted(request.names)) if request.names is not None else None,
                request.max_units,
            )
            if cap is None:
                rows = _task_cursor(con).execute(Q["claim_plain"], args).fetchall()
            else:
                rows = _task_cursor(con).execute(Q["claim_plain_shared"], (*args, cap, most)).fetchall()
            if rows or self._plain_until <= mono:
                deps = self._deps(con, [r["id"] for r in rows])
                return _Claimed([(r["lease_token"] or "", None, [r]) for r in rows], deps)
        elif simple and self._keyed_until > mono:
            # Only ungrouped work was queued a moment ago: one read decides
            # the claim when it can show the planner's answer.
            claimed = self._claim_keyed(con, worker_id, request, now)
            if claimed is not None:
                return claimed
        picked, gated = self._pick(con, request, now, relay=None if relay is None else relay.limits)
        local.gated_empty = not picked and gated
        local.gated_seen = None
        if any(m[0].group is not None for m in picked):
            self._plain_until = self._keyed_until = 0.0
        else:
            plain = all(not m[0].limits for m in picked)
            self._hints(con, time.monotonic(), local.timed_gates, plain)
        if not picked:
            return _Claimed([], {})
        expires = now + request.lease_seconds
        rows_by_claim: list[tuple[str, str | None, list]] = []
        touched: dict[str, float] = {}
        start = None if prefetch or relay is not None else now  # a relayed head starts once its predecessor ends
        singles: dict[int, str] = {}
        if relay is None and len(picked) > 1:
            # the units of one task each in one statement (a keyed claim takes many)
            singles = {members[0].id: uuid.uuid4().hex for members in picked if len(members) == 1}
            if len(singles) > 1:
                arg = dumps([[tid, token] for tid, token in singles.items()])
                cur = _task_cursor(con).execute(Q["claim_heads"], (arg, expires, worker_id, start))
                single_rows = {r[0]: r for r in cur}
            else:
                singles = {}
        for members in picked:
            head = members[0].id
            if head in singles:
                row = single_rows.get(head)
                rows_by_claim.append((singles[head], members[0].group, [row] if row is not None else []))
                if members[0].group is not None:
                    touched[members[0].group] = now
                continue
            token = uuid.uuid4().hex if relay is None else relay.token
            cur = _task_cursor(con)
            rows = cur.execute(Q["claim_head"], (token, expires, worker_id, start, head)).fetchall()
            if len(members) > 1:
                rest = [m.id for m in members[1:]]
                got = cur.execute(Q["claim_members"], (token, expires, worker_id, dumps(rest))).fetchall()
                place = {tid: k for k, tid in enumerate(rest)}
                rows += sorted(got, key=lambda r: place[r[0]])
            group = members[0].group
            if group is not None:
                touched[group] = now
            rows_by_claim.append((token, group, rows))
        if touched:
            con.executemany(Q["touch_group"], list(touched.items()))
        return _Claimed(rows_by_claim, self._deps(con, [r[0] for _, _, rows in rows_by_claim for r in rows]))

    def _hints(self, con: sqlite3.Connection, mono: float, timed: bool, plain: bool = True) -> None:
        """Which fast path claims may take until ``mono`` + PLAIN_HINT_TTL:
        claim_plain while only plain work is queued; claim_keyed while no
        group's head is, unless it could not decide lately, or a gate that
        opens with time (a rate, a pause's end, a breaker) took part in the
        last full claim here (``timed``): it would not decide either.
        (``plain``: nothing limited was just taken; else some is queued.)"""
        if plain and not con.execute(Q["special_ready"]).fetchone()[0]:
            self._plain_until, self._keyed_until = mono + PLAIN_HINT_TTL, 0.0
            return
        self._plain_until = 0.0
        if mono >= self._keyed_missed_until and not timed and not con.execute(Q["heads_ready"]).fetchone()[0]:
            self._keyed_until = mono + PLAIN_HINT_TTL
        else:
            self._keyed_until = 0.0

    def _claim_keyed(
        self, con: sqlite3.Connection, worker_id: str, request: ClaimRequest, now: float
    ) -> _Claimed | None:
        """The claim of ungrouped work in one read (``claim_keyed``: the first
        candidates and their gates) and one write, decided by
        :func:`corral.core.keyed_claims.decide`; None when that cannot show the
        planner's answer, or finds nothing (the full claim then says why, and
        when to look again)."""
        n = request.max_units
        cap, _ = request.retry_bounds()
        window = min(KEYED_WINDOW_MOST, int(n * self._keyed_reach) + 4)
        args = (
            request.queues[0],
            now,
            dumps(sorted(request.names)) if request.names is not None else None,
            window,
            0 if cap is None else 1,
        )
        rows, gates, retries = fast.read(con.execute(Q["claim_keyed"], args))
        full = len({r.id for r in rows}) >= window
        if retries:
            got = fast.Decision([], fast.UNDECIDED)
        else:
            got = fast.decide(rows, gates, n, full, prefetch=request.prefetch)
        if got.miss == fast.SHORT and self._keyed_reach < KEYED_REACH_MOST and window < KEYED_WINDOW_MOST:
            self._keyed_reach = min(KEYED_REACH_MOST, self._keyed_reach * 2)  # read further next time
            return None
        if got.miss is not None:
            # the full claims decide for a while
            self._keyed_until = 0.0
            self._keyed_missed_until = time.monotonic() + PLAIN_HINT_TTL
            return None
        ids = got.ids
        if not ids:
            return None  # nothing to take: the full claim says why, and when to look again
        self._keyed_reach = max(KEYED_REACH, self._keyed_reach * 0.9)
        start = None if request.prefetch else now
        cur = _task_cursor(con).execute(Q["claim_units"], (now + request.lease_seconds, worker_id, start, dumps(ids)))
        by_id = {r[0]: r for r in cur}
        taken = [by_id[tid] for tid in ids if tid in by_id]
        deps = self._deps(con, [r[0] for r in taken])
        return _Claimed([(r["lease_token"] or "", None, [r]) for r in taken], deps)

    def _pick(
        self,
        con: sqlite3.Connection,
        request: ClaimRequest,
        now: float,
        *,
        dry: bool = False,
        relay: frozenset[str] | None = None,
    ) -> tuple[list[list[Candidate]], bool]:
        """Choose the claims by the claim rules (:class:`ClaimPlanner` decides,
        over the candidates read here), and say whether a gate (a limit, a
        rate, a breaker) stood in the way of a candidate.

        It writes only the token buckets and breakers the gates changed, and
        nothing when ``dry`` (a read-only look: does anything fit?). With a
        retry share, the retry path is read apart (its own index) and merged
        in claim order with fresh work. A ``relay`` (the limits whose places
        a running unit passes on) counts those places free and takes work
        naming no other limit."""
        last_claimed: dict[str, float] = {}
        breakers = self._breaker_rows(con)
        paused = Paused.of((k, n) for k, n, _, _ in con.execute(Q["pauses"]))

        # A claim reads the places and the row of the keys it meets in batches:
        # when it first meets a key not read yet, it reads ahead in its
        # candidates (KEYS_AHEAD of each stream, twice as many each next time)
        # and reads the places held under and the rows of every key among
        # them, read or not, in two statements, whatever the number of keys.
        usage_of: list[LazyUsage] = []
        key_rows: dict[str, LimitState | None] = {}
        #: each stream's keys among its candidates read but not yet considered, and its next ones
        ahead: list[Callable[[int], Iterable[str]]] = []
        reach = [max(1, min(KEYS_AHEAD, request.max_units))]

        def the_gates() -> Gates:
            limits = {(lim := limit_state(r)).spec.name: lim for r in con.execute(Q["limits"])}
            usage = LazyUsage(lambda name: held(usage, name))
            usage_of.append(usage)
            for name in relay or ():
                usage[name] = max(0, usage.get(name, 0) - 1)
            return Gates(now, limits, usage, breakers, load_key=load_key)

        def read_keys(name: str) -> None:
            """Read the places and the row of ``name`` and of the keys the claim is about to meet."""
            names = {name}
            for keys in ahead:
                names.update(keys(reach[0]))
            reach[0] = min(KEYS_AHEAD_MOST, reach[0] * 2)
            todo = sorted(n for n in names if n not in key_rows)
            arg = dumps(todo)
            usage = usage_of[0]
            counted = dict(con.execute(Q["keys_held"], (arg,)).fetchall())
            for n in todo:
                usage.setdefault(n, counted.get(n, 0))  # a relay's count stays as it was set
                key_rows[n] = None
            for r in con.execute(Q["limit_key_rows"], (arg,)):
                own = limit_state(r)
                key_rows[own.spec.name] = own

        def held(usage: dict[str, int], name: str) -> int:
            if KEY_SEP not in name:
                return con.execute(Q["limit_held"], (name,)).fetchone()[0]
            if name not in key_rows:
                read_keys(name)
            return usage[name]

        def load_key(name: str) -> LimitState | None:
            if name not in key_rows:
                read_keys(name)
            return key_rows[name]

        closed = {n: b.state.state is brk.BreakerState.CLOSED for n, b in breakers.items()}
        plan = ClaimPlanner(request, the_gates, closed, relay=relay, dry=dry, paused=paused)
        queues = [q for q in request.queues if q not in paused.queues]
        ranks: dict[int, tuple] = {}

        def rank(c: Candidate) -> tuple:
            return ranks[c.id]

        def eligible_key(row: _CandidateRow) -> tuple:
            if row.group is None:
                return (claim_rank(row.priority, row.run_at), row.id)
            lca = last_claimed.get(row.group)
            if lca is None:
                hit = con.execute(Q["group_last_claimed"], (row.group,)).fetchone()
                lca = last_claimed[row.group] = hit[0] if hit else 0.0
            return (claim_rank(row.priority, max(row.run_at, lca)), row.id)

        cursors: list[sqlite3.Cursor] = []
        #: queued tasks read past the deadline of their first start: never
        #: candidates, and ended below (unless ``dry``), in this transaction
        met_expired: list[int] = []

        def ordered(*queries: str, fresh_only: bool = False) -> Iterator[Candidate]:
            """Candidates of ``queries`` in claim order: rank (priority with
            ageing), then id.

            Each query reads an index in (ord, id) order, where ord is never
            later than the row's rank when eligible (computed from a head's
            stored place in the round robin, else run_at); a row read early
            waits in a heap until the streams pass its eligibility, so with
            places up to date a claim reads about as many rows as it takes.
            A row the planner shuts out has its place in the order not worked
            out (that reads its group's last claim): behind a full limit,
            every head is passed over this way."""
            passed: set[str] = set()  # limits || char(30) || name the claim passes over from here
            mine: list[Iterable[_CandidateRow]] = [
                free_rows(q, passed) if query == "claim_candidates" else read(Q[query], (q, now))
                for query in queries
                for q in queues
            ]
            rows: Iterator[_CandidateRow] = iter(
                mine[0] if len(mine) == 1 else heapq.merge(*mine, key=_CandidateRow.index_key)
            )
            heap: list = []
            buffered: deque[_CandidateRow] = deque()  # read ahead for their keys (see read_keys)

            def stream() -> Iterator[_CandidateRow]:
                while True:
                    if buffered:
                        yield buffered.popleft()
                        continue
                    row = next(rows, None)
                    if row is None:
                        return
                    yield row

            def keys_ahead(n: int) -> Iterator[str]:
                """The keys of the candidates waiting in the heap and of the next ``n`` rows."""
                while len(buffered) < n:
                    row = next(rows, None)
                    if row is None:
                        break
                    buffered.append(row)
                for _, c in heap:
                    yield from (name for name in c.limits if KEY_SEP in name)
                for row in buffered:
                    if row.limits is not None and not row.expired:
                        yield from (name for name in json.loads(row.limits) if KEY_SEP in name)

            ahead.append(keys_ahead)
            for row in stream():
                if row.expired:
                    met_expired.append(row.id)
                    continue
                c = row.candidate(now)
                if (fresh_only and c.retrying) or plan.shut_out(c):
                    if row.limits is not None and plan.passes_over(c):
                        passed.add(f"{row.limits}\x1e{row.name}")
                    continue
                if row.limits is not None and row.group is None and plan.passes_over(c):
                    passed.add(f"{row.limits}\x1e{row.name}")
                key = ranks[c.id] = eligible_key(row)
                heapq.heappush(heap, (key, c))
                index_key = row.index_key()
                while heap and heap[0][0] <= index_key:
                    yield heapq.heappop(heap)[1]
            while heap:
                yield heapq.heappop(heap)[1]

        def read(sql: str, params: tuple) -> sqlite3.Cursor:
            cur = _candidate_cursor(con).execute(sql, params)
            cursors.append(cur)
            return cur

        def free_rows(queue: str, passed: set[str]) -> Iterator[_CandidateRow]:
            """Ungrouped candidates of ``queue`` in claim order. After
            PASS_OVER_RUN rows in a row of limits and names in ``passed``
            (shut gates, keys served in this pass: see
            :meth:`ClaimPlanner.passes_over`) it reads on from there without
            them (twice as many before each next time): a full key's backlog
            costs a claim a few rows, not all."""
            cur = read(Q["claim_candidates"], (queue, now))
            run, after = 0, PASS_OVER_RUN
            while True:
                for row in cur:
                    # passed over already when read: the rows a read without them would skip
                    known = row.limits is not None and f"{row.limits}\x1e{row.name}" in passed
                    yield row
                    if not known:
                        run = 0
                        continue
                    run += 1
                    if run >= after:
                        break
                else:
                    return
                run, after = 0, after * 2  # each read on costs more (the list grows): fewer of them
                cur.close()
                cur = read(Q["claim_candidates_past"], (queue, now, row.ord, row.id, dumps(sorted(passed))))

        def read_line(c: Candidate, far: int) -> list[Candidate]:
            got = _candidate_cursor(con).execute(Q["group_followers"], (c.group, c.id, far))
            return [f.candidate(now) for f in got]

        def try_take(c: Candidate) -> bool:
            """Try to make a claim headed by ``c``; True when it was taken."""
            if not plan.admits(c):
                return False  # the places this claim took since the row was read
            if c.group is not None and con.execute(Q["group_running"], (c.group,)).fetchone():
                return False  # an operator retried an old task while its group runs on
            return plan.try_head(c, read_line)

        streams: list[Iterator[Candidate]] = []
        try:
            if plan.retry_cap is None:
                streams.append(ordered("claim_candidates", "claim_head_candidates"))
                plan.run(streams[0], None, try_take, rank)
            else:
                streams.append(ordered("claim_candidates", "claim_head_candidates", fresh_only=True))
                streams.append(ordered("claim_retry_candidates"))
                plan.run(streams[0], streams[1], try_take, rank)
        finally:
            ahead.clear()  # the streams end here, with their cursors: none is read after
            for stream in streams:
                stream.close()  # type: ignore[attr-defined]
            for cur in cursors:
                cur.close()
        if met_expired and not dry:
            self._expire_on(con, met_expired[:EXPIRE_IN_CLAIM], now)
        gates = plan.gates
        self._note_gate_wait(gates.wait if gates is not None else None)
        #: a rate, a pause's end or a breaker took part: claim_keyed could not decide such work
        self._local.timed_gates = gates is not None and gates.timed()
        if gates is not None and not dry:
            charges = [(c.tokens, c.counted_at, c.starts, name) for name, c in gates.rate_writes().items()]
            for i in range(0, len(charges), CHARGES_AT_ONCE):  # a keyed rate charges a row per key
                part = charges[i : i + CHARGES_AT_ONCE]
                con.execute(_charges_sql(len(part)), [v for c in part for v in c])
            for name, (state, ev) in gates.breaker_writes().items():
                self._save_breaker(con, name, state, ev)
        return plan.units, gates is not None

    @_guard
    def forget_keys(self, limit: int = 1000) -> int:
        after = getattr(self, "_keys_after", "")
        with self._write() as con:
            now = self._clock.time()
            rows = [limit_state(r) for r in con.execute(Q["key_rows_after"], (after, max(1, limit))).fetchall()]
            declared = {(lim := limit_state(r)).spec.name: lim.spec for r in con.execute(Q["limits"])}
            gone = [k.spec.name for k in rows if key_at_rest(declared.get(k.spec.name.partition("\x1f")[0]), k, now)]
            if gone:  # a key whose controller saw a call lately keeps what it learned
                live = con.execute(Q["key_controllers"], {"names": json.dumps(gone)}).fetchall()
                kept = {n for n, c in live if adp.key_live(c, now)}
                gone = [n for n in gone if n not in kept]
            con.executemany(Q["forget_key_rows"], [(n,) for n in gone])
        # the next call goes on from here; after the last key, from the first again
        self._keys_after = rows[-1].spec.name if len(rows) >= max(1, limit) else ""
        return len(gone)

    def _expire_on(self, con: sqlite3.Connection, ids: list[int], now: float) -> None:
        """End the queued tasks ``ids`` a claim met past their deadline:
        CANCELED "expired", their groups and dependents moved on."""
        ended = con.execute(Q["expire_queued"], (now, dumps(ids))).fetchall()
        if ended:
            groups = {group for _, group in ended if group is not None}
            self._after_final(con, [(tid, State.CANCELED) for tid, _ in ended], now, groups)

    @staticmethod
    def _gated_signature(con: sqlite3.Connection, queues: Sequence[str]) -> tuple:
        """What a claim behind a full limit depends on, read cheaply."""
        return (
            *con.execute(Q["gated_signature"], (dumps(list(queues)),)).fetchone(),
            tuple(con.execute(Q["limit_usage"]).fetchall()),
        )

    @staticmethod
    def _breaker_rows(con: sqlite3.Connection) -> dict[str, BreakerRow]:
        return {(b := breaker_row(r)).name: b for r in con.execute(Q["breakers"])}

    @staticmethod
    def _save_breaker(con: sqlite3.Connection, name: str, state: brk.Breaker, ev: BreakerEvent | None) -> None:
        con.execute(Q["breaker_save"], (state.state.value, brk.state_to_json(state), name))
        if ev is not None:
            con.execute(Q["breaker_event"], (ev.at, ev.name, ev.before, ev.after, ev.reason, ev.calls, ev.failures))

    @_guard
    def backlog(self, at_most: int) -> int | None:
        (count,) = self._con().execute(Q["backlog"], (max(0, at_most),)).fetchone()
        return count

    @_guard
    def heartbeat(self, tokens: Collection[str], lease_seconds: float) -> HeartbeatReply:
        tokens = set(tokens)
        reply = HeartbeatReply()
        if not tokens:
            return reply
        arg = dumps(sorted(tokens))
        with self._write() as con:
            con.execute(Q["heartbeat_extend"], (self._clock.time() + lease_seconds, arg))
            held = set()
            for tid, token, cancel in con.execute(Q["heartbeat_held"], (arg,)):
                held.add(token)
                if cancel:
                    reply.cancel_requested.add(tid)
        reply.lost_tokens = tokens - held
        return reply

    @_guard
    def record_starts(self, starts: Sequence[Start]) -> int:
        if not starts:
            return 0
        rows = dumps([[st.task_id, st.token, st.attempt, st.started_at] for st in starts])
        with self._write() as con:
            return con.execute(Q["record_starts"], (rows,)).rowcount

    @_guard
    def cancel_requested(self, task_ids: Collection[int]) -> set[int]:
        if not task_ids:
            return set()
        return {tid for (tid,) in self._con().execute(Q["cancel_requested"], (dumps(sorted(task_ids)),))}

    @_guard
    def complete(self, outcomes: Sequence[Outcome]) -> list[bool]:
        outcomes = texts.safe_outcomes(outcomes)
        for o in outcomes:
            check_transition(State.RUNNING, o.status)
        if not outcomes:
            return []
        try:
            with self._write() as con:
                return self._complete_on(con, outcomes)
        except _REFUSED_DATA:
            # One row holds a value SQLite refuses (a NaN time is NULL to it):
            # write the batch row by row, so that row alone fails.
            return [self._complete_alone(o) for o in outcomes]

    def _complete_alone(self, o: Outcome) -> bool:
        """One outcome in its own write; one SQLite refuses is written as
        FAILED with the reason instead (the outcome changed to say so), or,
        if even that is refused, not at all (the sweeper takes it)."""
        for _ in range(2):
            try:
                with self._write() as con:
                    return self._complete_on(con, [o])[0]
            except _REFUSED_DATA as exc:
                why = f"{type(exc).__name__}: {first_line(exc)}"
            if o.status is State.FAILED and o.error and o.error.startswith("the store refused"):
                break
            log.warning("task %s: its outcome could not be stored (%s); writing it as FAILED", o.task_id, why)
            texts.refused(o, why)
        return False

    hands_over = True

    def complete_and_claim(
        self,
        outcomes: Sequence[Outcome],
        places: Sequence[Collection[str]],
        worker_id: str,
        request: ClaimRequest,
        *,
        relays: Sequence[tuple[str, Collection[str]]] = (),
    ) -> tuple[list[bool], list[Claim]]:
        # Under the write lock every claim counts the places itself: the
        # successors are an ordinary claim of one unit per ended one, in the
        # transaction that freed their places; none at all when the first
        # work waiting under one of their limits is another worker's.
        outcomes = texts.safe_outcomes(outcomes)
        for o in outcomes:
            check_transition(State.RUNNING, o.status)
        request = request.units(max(1, len(places)))
        with self._write() as con, _refused_as_store_error():  # complete() then writes row by row
            applied = self._complete_on(con, outcomes) if outcomes else []
            claimed = []
            if places and request.queues and self._ours_first(con, [self._tight(con, places, len(places))], request):
                claimed.append(self._claim_on(con, worker_id, request))
            for token, limits in relays:
                # a successor of a unit still running, under its token: it
                # names only limits whose place passes on without a charge
                held = frozenset(limits)
                if (
                    request.queues
                    and self._relay_fits(con, held)
                    and self._ours_first(con, [self._tight(con, [held], 1)], request)
                ):
                    claimed.append(self._claim_on(con, worker_id, request.units(1), Relay(token, held)))
        return applied, [c for part in claimed for c in part.claims()]

    def _relay_fits(self, con: sqlite3.Connection, names: frozenset[str]) -> bool:
        """May the places of ``names`` pass to a relay (capped, no rate, no pause, no breaker)?"""
        row = con.execute(Q["relay_fits"], (dumps(sorted(names)), self._clock.time())).fetchone()
        return bool(names) and row[0] == len(names)

    @staticmethod
    def _tight(con: sqlite3.Connection, places: Sequence[Collection[str]], n: int) -> list[str]:
        """The limits of ``places`` whose places a hand-over of ``n`` could
        keep from another worker: a rate's, or a cap's with fewer than n + 1
        places free. Under the others every worker still finds room after
        it, so whose work waits first there need not be looked for (a
        keyed limit's key is looked for past every other key's work)."""
        names = sorted({name for p in places for name in p})
        if not names:
            return []
        return [name for (name,) in con.execute(Q["limits_tight"], (dumps(names), n))]

    def _ours_first(self, con: sqlite3.Connection, places: Sequence[Collection[str]], request: ClaimRequest) -> bool:
        """Is the first work waiting under each limit of ``places`` work of the asked queues and names?"""
        now = self._clock.time()
        for name in sorted({n for p in places for n in p}):
            row = con.execute(Q["first_waiter"], (now, name, dumps(name), json.dumps(name))).fetchone()
            if row is not None and (row[0] not in request.queues or not request.knows(row[1])):
                return False
        return True

    def _complete_on(self, con: sqlite3.Connection, outcomes: list[Outcome]) -> list[bool]:
        """The outcomes' writes on ``con``, inside the write transaction its caller holds."""
        statuses = [State(o.status) for o in outcomes]
        if (
            len(outcomes) > 1
            and all(s in FINAL for s in statuses)
            and len({o.task_id for o in outcomes}) == len(outcomes)
        ):
            return self._complete_finals(con, outcomes, statuses)
        applied: list[bool] = []
        ended: list[tuple[int, State]] = []
        groups: set[str] = set()
        verdicts: list[tuple[Outcome, str, str | None]] = []
        now = self._clock.time()
        cur = con.cursor()
        final_sql, requeue_sql = Q["complete_final"], Q["complete_requeue"]
        for o, status in zip(outcomes, statuses):
            set_error = o.error is not None or status is State.SUCCESS
            give_back = 0 if o.burn_attempt else 1
            if status in FINAL:
                rows = cur.execute(
                    final_sql,
                    (
                        status.value,
                        o.result,
                        status is State.CANCELED,  # a supersede's reason wins
                        set_error,
                        o.error,
                        set_error,
                        o.traceback,
                        o.finished_at or now,
                        o.started_at,
                        o.attempt,
                        give_back,
                        o.task_id,
                        o.token,
                        o.version,
                    ),
                ).fetchall()
                if rows:
                    ((group, name, limits),) = rows
                    ended.append((o.task_id, status))
                    if group is not None:
                        groups.add(group)
                    verdicts.append((o, name, limits))
                applied.append(bool(rows))
            else:  # back in the queue: the group's line is unchanged
                rows = cur.execute(
                    requeue_sql,
                    (
                        status.value,
                        o.result,
                        set_error,
                        o.error,
                        set_error,
                        o.traceback,
                        o.run_at if o.run_at is not None else now,
                        o.started_at,
                        o.attempt,
                        1 if o.snooze else give_back,
                        1 if o.snooze else 0,
                        o.task_id,
                        o.token,
                        o.version,
                    ),
                ).fetchall()
                if rows:
                    ((name, limits),) = rows
                    verdicts.append((o, name, limits))
                    if o.pause_limits is not None and limits:
                        con.execute(Q["limit_pause"], (now + o.pause_limits, limits))
                applied.append(bool(rows))
        self._flow_after_complete(con, verdicts, now)
        self._after_final(con, ended, now, groups)
        return applied

    def _flow_after_complete(self, con: sqlite3.Connection, verdicts: list[tuple[Outcome, str, str | None]], now):
        """Feed the applied outcomes to the breakers on their tasks' names and limits."""
        if not verdicts:
            return
        rows = self._breaker_rows(con)
        if not rows:
            return
        feed = [((name, *(json.loads(lims) if lims else ())), o.breaker_failure) for o, name, lims in verdicts]
        changed, events = record_outcomes(rows, feed, now)
        for name, state in changed.items():
            self._save_breaker(con, name, state, None)
        for ev in events:
            con.execute(Q["breaker_event"], (ev.at, ev.name, ev.before, ev.after, ev.reason, ev.calls, ev.failures))
        if any(ev.after != "CLOSED" for ev in events):
            self._plain_until = 0.0

    def _complete_finals(self, con: sqlite3.Connection, outcomes: list[Outcome], statuses: list[State]) -> list[bool]:
        """A batch of final outcomes of distinct tasks: one UPDATE for all."""
        now = self._clock.time()
        rows = dumps(
            [
                [
                    o.task_id,
                    o.token,
                    o.version,
                    s.value,
                    o.result,
                    o.error is not None or s is State.SUCCESS,
                    o.error,
                    o.finished_at or now,
                    o.started_at,
                    o.attempt,
                    0 if o.burn_attempt else 1,
                    o.traceback,
                ]
                for o, s in zip(outcomes, statuses)
            ]
        )
        got = con.execute(Q["complete_final_many"], (rows,)).fetchall()
        done = {tid: group for tid, group, _, _ in got}
        status_of = {o.task_id: s for o, s in zip(outcomes, statuses)}
        ended = [(tid, status_of[tid]) for tid in done]
        by_id = {o.task_id: o for o in outcomes}
        self._flow_after_complete(con, [(by_id[tid], name, limits) for tid, _, name, limits in got], now)
        self._after_final(con, ended, now, {g for g in done.values() if g is not None})
        return [o.task_id in done for o in outcomes]

    def wake_waiters(self) -> None:
        self._wakes += 1  # each waiting loop looks at least every WATCH_SLICE

    def _watch(self) -> FileWatch | None:
        """This thread's watch on the database's files (None: poll)."""
        try:
            watch: FileWatch | None = self._local.watch
        except AttributeError:
            name = os.path.basename(self.path)
            watch = open_watch(os.path.dirname(os.path.abspath(self.path)), (name, name + "-wal"))
            self._local.watch = watch
            if watch is not None:
                with self._lock:
                    self._watches.append(watch)
        return watch

    def wait_for_work(self, timeout: float, queues: Collection[str] | None = None) -> None:
        """Return when another connection (any process) commits, or after ``timeout``.

        With ``queues``, only a commit after which a task in them is due (a
        queued one, or a group's head) ends the wait: most commits in a busy
        fleet are completions and claims, and each idle worker woken by one
        would take the write lock for a claim that finds nothing, in the way
        of the claims that do find work. Gates are not looked at: a task a
        limit holds back still wakes (the claim decides, as before).

        A commit writes the WAL file several times, and each write wakes the
        watch; the commit becomes visible to data_version only when SQLite
        then updates the ``-shm`` index, in shared memory, which raises no
        event. A wake that looked in between saw no change and slept on the
        watch until the next write or WATCH_SLICE (20 ms): at 100 commits
        a second, 5 to 19 in 1 000 were seen late, up to 90 ms. So a wake that
        shows no change looks again every SETTLE_STEP for SETTLE (2 ms)
        before sleeping: an idle store's files are not written, so an idle
        wait does not pay for it."""
        deadline = time.monotonic() + self._gate_timeout(max(0.0, timeout))
        wakes = self._wakes
        try:
            con = self._con()
            pragma = "PRAGMA data_version"
            # a read-only claim that just found nothing took its snapshot
            # before now: a commit since then is news
            seen = self._local.__dict__.pop("probe_version", None)
            watch = self._watch()
            if seen is None:
                (seen,) = con.execute(pragma).fetchone()
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._wakes != wakes or self._closed:
                    return
                if watch is None:
                    time.sleep(min(POLL_SLICE, remaining))
                    (version,) = con.execute(pragma).fetchone()
                else:
                    # a commit writes the WAL file: sleep until one does (and
                    # look now and then anyway, for wake_waiters() and for a
                    # write the watch cannot see)
                    woke = watch.wait(min(WATCH_SLICE, remaining)) and not watch.broken
                    settled = time.monotonic() + SETTLE
                    (version,) = con.execute(pragma).fetchone()
                    while woke and version == seen:
                        # the write may be a commit's that shows a moment later
                        watch.wait(SETTLE_STEP)
                        (version,) = con.execute(pragma).fetchone()
                        woke = time.monotonic() < settled
                if version != seen:
                    if queues is None or self._due_in(con, queues):
                        return
                    seen = version
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc

    def _due_in(self, con: sqlite3.Connection, queues: Collection[str]) -> bool:
        """Is a task in ``queues`` due now (read only, no lock)? A paused
        queue's work is not: an idle worker of a paused queue with a backlog
        would otherwise claim (for nothing) at every commit in the store."""
        now = self._clock.time()
        paused = {name for (name,) in con.execute(Q["paused_queues"])}
        return any(due for q in queues if q not in paused for (due,) in con.execute(Q["due_probe"], (q, now)))

    @_guard
    def set_progress(self, task_id: int, token: str, fraction: float, message: str | None) -> bool:
        with self._write() as con:
            message = texts.progress_message(message)
            return con.execute(Q["set_progress"], (fraction, message, task_id, token)).rowcount == 1

    @_guard
    def save_checkpoint(self, task_id: int, token: str, stage: str, data_json: str) -> bool:
        with self._write() as con:
            row = _task_cursor(con).execute(Q["get_checkpoint"], (task_id, token)).fetchone()
            if row is None:
                return False
            cp = loads(row["checkpoint"]) or {}
            cp.pop(stage, None)
            cp[stage] = loads(data_json)
            return con.execute(Q["set_checkpoint"], (dumps(cp), task_id, token)).rowcount == 1

    # ---- operators --------------------------------------------------------
    @_guard
    def get(self, task_id: int) -> TaskRecord | None:
        with self._read() as con:
            row = _task_cursor(con).execute(Q["get"], (task_id,)).fetchone()
            if row is None:
                return None
            return self._records(con, [row])[0]

    @_guard
    def list_tasks(self, flt: TaskFilter) -> list[TaskRecord]:
        sql, params = _list_sql(Q["select_tasks"], flt)
        with self._read() as con:
            return self._records(con, _task_cursor(con).execute(sql, params).fetchall())

    @_guard
    def task_ids(self, flt: TaskFilter) -> list[int]:
        sql, params = _list_sql("SELECT id\nFROM tasks", flt, whole=True)
        with self._read() as con:
            return [tid for (tid,) in con.execute(sql, params)]

    @_guard
    def finished_runs(self, start: float, end: float, limit: int) -> list[FinishedRun]:
        with self._read() as con:
            rows = _task_cursor(con).execute(Q["finished_runs"], (start, end, max(0, limit)))
            return [FinishedRun(**r) for r in rows]

    @_guard
    def save_minute_stats(self, rows: Sequence[MinuteStat], before: float) -> None:
        with self._write() as con:
            con.executemany(Q["save_minute_stat"], [astuple(r) for r in rows])
            con.execute(Q["trim_minute_stats"], (int(before),))

    @_guard
    def minute_stats(self, since: float) -> list[MinuteStat]:
        with self._read() as con:
            return [MinuteStat(**r) for r in _task_cursor(con).execute(Q["minute_stats"], (int(since),))]

    @_guard
    def held_tasks(
        self, worker: str | None = None, limit: int = 1000, after: tuple[str, int] | None = None
    ) -> list[TaskRecord]:
        sql, params = self._held_sql(worker, after)
        params.append(max(0, limit))
        with self._read() as con:
            return self._records(con, _task_cursor(con).execute(sql, params).fetchall())

    @staticmethod
    def _held_sql(worker: str | None, after: tuple[str, int] | None) -> tuple[str, list[Any]]:
        """The held tasks' query, its LIMIT's value left to add: read from the
        running tasks' own index (a few per worker slot), never by a walk of
        every task (SQLite otherwise walked them all: 500 ms among a million)."""
        sql = Q["select_tasks"].replace("FROM tasks", "FROM tasks INDEXED BY tasks_running_expiry", 1)
        sql += " WHERE status = 'RUNNING'"
        params: list[Any] = []
        if worker is not None:
            sql += " AND worker_id = ?"
            params.append(worker)
        if after is not None:
            sql += " AND (worker_id, id) > (?, ?)"
            params += [after[0], after[1]]
        return sql + " ORDER BY worker_id, id LIMIT ?", params

    @_guard
    def counts(self, queue: str | None = None) -> dict[str, int]:
        con = self._con()
        if queue is None:
            rows = con.execute(Q["counts"]).fetchall()
        else:
            rows = con.execute(Q["counts_queue"], (queue,)).fetchall()
        return shown_counts({status: n for status, n in rows})

    @_guard
    def active_counts(self) -> dict[str, int]:
        return {status: n for status, n in self._con().execute(Q["active_counts"]) if n}

    @_guard
    def queue_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for queue, status, n in self._con().execute(Q["queue_counts"]):
            out.setdefault(queue, {})[status] = n
        return out

    @_guard
    def group_lines(self, limit: int = 50, offset: int = 0) -> list[GroupLine]:
        with self._read() as con:
            rows = _task_cursor(con).execute(Q["group_lines"], (max(0, limit), max(0, offset))).fetchall()
        return [GroupLine(**r) for r in rows]

    @_guard
    def batch_list(self, after: str | None = None, limit: int = 20) -> list[tuple[str, dict[str, int]]]:
        with self._read() as con:
            names = [name for (name,) in con.execute(Q["batch_names"], (after if after is not None else "", limit))]
            if after is None and limit > 0:  # '' itself is a name: min(batch) > '' skips it
                if con.execute(Q["batch_empty_name"]).fetchone():
                    names = [""] + names[: limit - 1]
            return [(b, shown_counts(dict(con.execute(Q["batch_status_counts"], (b,)).fetchall()))) for b in names]

    @_guard
    def recent_finished(self, since: float, limit: int, *, newest_first: bool = False) -> list[FinishedTask]:
        q = Q["recent_finished_desc" if newest_first else "recent_finished"]
        with self._read() as con:
            return [FinishedTask(**r) for r in _task_cursor(con).execute(q, (since, max(0, limit)))]

    @_guard
    def finished_counts(self, since: float, until: float) -> list[tuple[float, str, int]]:
        with self._read() as con:
            return [(m, st, n) for m, st, n in con.execute(Q["finished_counts"], (since, until))]

    @_guard
    def cancel(self, task_id: int) -> TaskRecord | None:
        with self._write() as con:
            row = _task_cursor(con).execute(Q["status_of"], (task_id,)).fetchone()
            if row is None:
                return None
            status = State(row["status"]) if row["status"] in State.__members__ else None
            now = self._clock.time()
            if status is State.RUNNING:
                con.execute(Q["cancel_running"], (task_id,))
            elif status in (State.WAITING, State.PENDING, State.RETRYING):
                con.execute(Q["cancel_queued"], (now, task_id))
                self._after_final(con, [(task_id, State.CANCELED)], now, {row["group_key"]})
            return self._records(con, [_task_cursor(con).execute(Q["get"], (task_id,)).fetchone()])[0]

    @_guard
    def upstream(self, task_id: int) -> list[TaskRecord]:
        with self._read() as con:
            rows = _task_cursor(con).execute(Q["upstream"], (task_id,)).fetchall()
            return self._records(con, rows)

    @_guard
    def repair(self, limit: int) -> None:
        """Move the head of a group off a row whose status names no state.

        Such a row (written past the status rule) reads as FAILED and never
        blocks its group, as on PostgreSQL, whose triggers move the head at
        once; here the head flag it held moves on at the next sweep."""
        groups = [group for (group,) in self._con().execute(Q["heads_of_no_state"], (max(0, limit),))]
        if groups:
            with self._write() as con:
                self._refresh_heads(con, groups)

    @_guard
    def retry(self, task_id: int) -> bool:
        with self._write() as con:
            rows = con.execute(Q["retry"], (self._clock.time(), task_id)).fetchall()
            self._refresh_heads(con, {group for (group,) in rows})
            return bool(rows)

    # ---- dead letters -------------------------------------------------------
    @_guard
    def dead_letters(
        self, batch: str | None = None, limit: int = 100, offset: int = 0, *, after_id: int | None = None
    ) -> list[TaskRecord]:
        params = {"batch": batch, "limit": max(0, limit), "offset": max(0, offset), "after": max(0, after_id or 0)}
        with self._read() as con:
            q = Q["dead_letters" if batch is None else "dead_letters_batch"]
            return self._records(con, _task_cursor(con).execute(q, params).fetchall())

    @_guard
    def retry_dead(self, batch: str | None = None, limit: int = 10_000) -> list[int]:
        with self._write() as con:
            q = Q["dead_ids" if batch is None else "dead_ids_batch"]
            ids = [tid for (tid,) in con.execute(q, {"batch": batch, "limit": max(0, limit)})]
            now = self._clock.time()
            groups: set[str | None] = set()
            for tid in ids:
                groups.update(group for (group,) in con.execute(Q["retry"], (now, tid)))
            self._refresh_heads(con, groups)
            return ids

    @_guard
    def failing_kinds(self, since: float, in_a_row: int, scan: int = 500) -> list[str]:
        params = {"since": since, "n": max(1, in_a_row), "scan": max(0, scan)}
        return [name for (name,) in self._con().execute(Q["failing_kinds"], params)]

    # ---- fleet control ----------------------------------------------------------
    @_guard
    def fleet_level(self) -> FleetLevel:
        row = self._con().execute(Q["fleet_level"]).fetchone()
        if row is None:
            return FleetLevel()
        level, manual, calm_since, reason, changed_at = row
        return FleetLevel(level, bool(manual), calm_since, reason, changed_at)

    @_guard
    def set_fleet_level(self, new: FleetLevel, *, auto: bool, event: str | None = None) -> bool:
        with self._write() as con:
            now = self._clock.time()
            params = {
                "level": int(new.level),
                "manual": 1 if new.manual else 0,
                "calm_since": new.calm_since,
                "reason": new.reason,
                "now": now,
                "auto": 1 if auto else 0,
            }
            if con.execute(Q["set_fleet_level"], params).rowcount != 1:
                return False
            if event is not None:
                con.execute(Q["add_event"], (now, "level", "fleet", event))
            return True

    # ---- worker processes -------------------------------------------------
    @_guard
    def report_worker(self, info: WorkerInfo) -> None:
        params = {
            "id": info.id,
            "host": info.host,
            "pid": info.pid,
            "queues": json.dumps(list(info.queues)),
            "slots": info.slots,
            "in_use": info.in_use,
            "version": info.version,
            "beat_every": info.beat_every,
            "now": self._clock.time(),
        }
        with self._write() as con:
            con.execute(Q["report_worker"], params)

    @_guard
    def remove_worker(self, worker_id: str) -> None:
        with self._write() as con:
            con.execute(Q["remove_worker"], (worker_id,))

    @_guard
    def workers(self) -> list[WorkerInfo]:
        rows = _task_cursor(self._con()).execute(Q["workers"]).fetchall()
        return [WorkerInfo(**{**r, "queues": tuple(json.loads(r["queues"]))}) for r in rows]

    @_guard
    def forget_workers(self, before: float) -> int:
        with self._write() as con:
            return con.execute(Q["forget_workers"], {"before": before}).rowcount

    @_guard
    def add_event(self, kind: str, subject: str, data: str) -> int:
        with self._write() as con:
            cur = con.execute(Q["add_event"], (self._clock.time(), kind, subject, data))
            return int(cur.lastrowid or 0)

    @_guard
    def events(self, kind: str | None = None, limit: int = 100) -> list[Event]:
        params = {"kind": kind, "limit": max(0, limit)}
        return [Event(**r) for r in _task_cursor(self._con()).execute(Q["events"], params)]

    @_guard
    def event_cursor(self, since: int | None) -> Any:
        if since is None:
            (last,) = self._con().execute(Q["last_event_id"]).fetchone()
            return int(last)
        return int(since)

    @_guard
    def read_events(self, cursor: Any, limit: int = 500) -> tuple[list[Event], Any]:
        # ids follow commit order: one writer at a time holds the write lock
        out = [Event(**r) for r in _task_cursor(self._con()).execute(Q["read_events"], (int(cursor), max(0, limit)))]
        return out, (out[-1].id if out else cursor)

    @_guard
    def wait_for_events(self, timeout: float) -> None:
        """Return when an event was added (by any process), or after ``timeout``.

        SQLite cannot notify another process: a follower looks at the newest
        id every few milliseconds, one indexed read."""
        deadline = time.monotonic() + max(0.0, timeout)
        con = self._con()
        (seen,) = con.execute(Q["last_event_id"]).fetchone()
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(EVENTS_POLL, left))
            if con.execute(Q["last_event_id"]).fetchone() != (seen,):
                return

    @_guard
    def trim_events(self, keep: int, before: float, limit: int | None = None) -> int:
        params = {"keep": max(0, keep), "before": before, "max": -1 if limit is None else max(0, limit)}
        with self._write() as con:
            return con.execute(Q["trim_events"], params).rowcount

    @_guard
    def prune(self, before: Mapping[str, float], limit: int) -> int:
        params = prune_params(before, limit)
        if params is None:
            return 0
        with self._write() as con:
            ids = [tid for (tid,) in con.execute(Q["prune"], params).fetchall()]
            if ids:
                con.execute(Q["prune_deps"], (json.dumps(ids),))
        return len(ids)

    def _names_param(self, names: Sequence[str]) -> Any:
        return dumps(list(names))

    @_guard
    def line_head(self, group: str) -> TaskRecord | None:
        with self._read() as con:
            row = _task_cursor(con).execute(Q["line_head"], (group,)).fetchone()
            return None if row is None else self._records(con, [row])[0]

    @_guard
    def _read_all(self, reads: Sequence[Read]) -> list[list[Sequence]]:
        with self._read() as con:
            return [con.execute(Q[name], params).fetchall() for name, params in reads]

    # ---- limits -----------------------------------------------------------
    @_guard
    def set_batch(self, batch: str, on_complete: str | None) -> None:
        with self._write() as con:
            con.execute(Q["set_batch"], (batch, on_complete))

    @_guard
    def settle_batches(self, batches: Collection[str] | None = None, limit: int = 100) -> list[int]:
        names = None if batches is None else dumps(sorted(set(batches)))
        if names == "[]":
            return []
        # a read first: a completion outside any batch with a callback takes no write lock
        if not self._con().execute(Q["batches_unsettled"], (names, limit)).fetchall():
            return []
        submitted: list[int] = []
        with self._write() as con:  # the one write lock: no other settle in between
            for name, template in con.execute(Q["batches_unsettled"], (names, limit)).fetchall():
                if con.execute(Q["batch_active"], (name,)).fetchone() is not None:
                    continue
                counts_rows = con.execute(Q["batch_counts"], {"batch": name}).fetchall()
                durations = con.execute(Q["batch_durations"], {"batch": name}).fetchall()
                summary = summary_from_rows(name, counts_rows, durations)
                if summary.status not in FINAL_BATCH:
                    continue
                (res,) = self._submit_on(con, [callback_task(name, template, summary.as_dict())])
                con.execute(Q["batch_settle"], (self._clock.time(), res.id, name))
                submitted.append(res.id)
        return submitted

    @_guard
    def set_limit(self, spec: LimitSpec) -> LimitSpec:
        with self._write() as con:
            old = self._limit_row(con, spec.name)
            return self._write_limit(con, old, limit_rules.declare(old, spec), "declare", "app")

    @_guard
    def change_limit(self, name: str, changes: Mapping[str, Any], *, by: str, reset: bool = False) -> LimitSpec:
        with self._write() as con:
            old = self._limit_row(con, name) if KEY_SEP not in name else None
            if old is None:
                raise limit_rules.unknown(name, (n for (n,) in con.execute(Q["limit_names"])))
            after = limit_rules.change(old, changes, by, reset=reset)
            return self._write_limit(con, old, after, "reset" if reset else "set", by)

    @staticmethod
    def _limit_row(con: sqlite3.Connection, name: str) -> LimitSpec | None:
        row = con.execute(Q["limit_row"], (name,)).fetchone()
        return None if row is None else limit_state(row).spec

    def _write_limit(
        self, con: sqlite3.Connection, old: LimitSpec | None, spec: LimitSpec, action: str, by: str
    ) -> LimitSpec:
        """The row core.limits decided, and its event if anything changed (a
        commit: waiting workers wake, and claims behind a full limit look again)."""
        now = self._clock.time()
        changed = old is None or old.settings() != spec.settings()
        if changed:
            # later than every change before it, even on a clock that stood
            # still: claims behind a full limit compare the newest (gated_signature)
            (last,) = con.execute(Q["limits_changed"]).fetchone()
            if last is not None and last >= now:
                now = math.nextafter(last, math.inf)
        con.execute(Q["set_limit"], limit_params(spec, now if changed else None))
        con.execute(Q["clear_adaptive_keys"], {"prefix": keyed_name(spec.name, "")})  # fixed values: none learned
        data = limit_rules.event_data(action, by, old, spec)
        if data is not None:
            con.execute(Q["add_event"], (now, LIMIT_EVENT, limit_rules.subject(spec.name), data))
        return replace(spec, changed_at=now if changed else spec.changed_at)

    # ---- pauses by hand -----------------------------------------------------
    @_guard
    def pause(self, kind: str, name: str, by: str = "") -> bool:
        with self._write() as con:
            now = self._clock.time()
            if con.execute(Q["pause"], (kind, name, now, by)).rowcount != 1:
                return False
            con.execute(Q["add_event"], (now, *pause_event(kind, name, True, by)))
        if kind == "queue":
            self._plain_until = 0.0
        return True

    @_guard
    def resume(self, kind: str, name: str, by: str = "") -> bool:
        with self._write() as con:
            if con.execute(Q["resume"], (kind, name)).rowcount != 1:
                return False
            con.execute(Q["add_event"], (self._clock.time(), *pause_event(kind, name, False, by)))
        self._plain_until = 0.0
        self.wake_waiters()  # this process's own waiters; others see the commit
        return True

    @_guard
    def pauses(self) -> list[Pause]:
        rows = self._con().execute(Q["pauses"]).fetchall()
        return sorted((Pause(*r) for r in rows), key=pause_order)

    # ---- adaptive limits ----------------------------------------------------
    @_guard
    def declare_adaptive(self, limit: LimitSpec, spec: adp.AdaptiveSpec) -> None:
        with self._write() as con:
            rows = con.execute(Q["adaptive_limits"]).fetchall()
            old = next((adaptive_row(r) for r in rows if r[0] == limit.name), None)
            conc, rate = adp.declared(old, spec, limit.concurrency, limit.rate)
            params = {"name": limit.name, "concurrency": conc, "rate": rate, "burst": limit.burst}
            con.execute(Q["declare_adaptive"], {**params, "adaptive": spec.to_json(), "per_key": limit.per_key})

    @_guard
    def save_adaptive(
        self,
        name: str,
        holder: str,
        role: str,
        state: str,
        concurrency: int | None,
        rate: str | None,
        event: str | None,
    ) -> bool:
        with self._write() as con:
            now = self._clock.time()
            params = {"name": name, "holder": holder, "role": role, "now": now}
            values = {"state": state, "concurrency": concurrency, "rate": rate}
            saved = con.execute(Q["save_adaptive"], {**params, **values})
            if saved.rowcount != 1:
                return False
            if event is not None:
                con.execute(Q["add_event"], (now, LIMIT_ADAPTED, f"limit:{name}", event))
            return True

    @_guard
    def adaptive_keys(self, limit: str) -> dict[str, str]:
        rows = self._con().execute(Q["adaptive_keys"], {"prefix": keyed_name(limit, "")}).fetchall()
        return {key: controller for key, controller in rows}

    @_guard
    def save_adaptive_keys(
        self,
        limit: str,
        holder: str,
        role: str,
        keys: Mapping[str, tuple[str | None, int | None, str | None]],
        events: Mapping[str, str] | None = None,
    ) -> bool:
        with self._write() as con:
            now = self._clock.time()
            if con.execute(Q["leads_now"], {"role": role, "holder": holder, "now": now}).fetchone() is None:
                return False
            if not any(r[0] == limit for r in con.execute(Q["adaptive_limits"])):
                return False
            if events:
                con.executemany(
                    Q["add_event"],
                    [(now, LIMIT_KEY_ADAPTED, limit_key_subject(limit, key), data) for key, data in events.items()],
                )
            con.executemany(
                Q["save_adaptive_key"],
                [
                    {"name": keyed_name(limit, key), "concurrency": conc, "rate": rate, "state": state}
                    for key, (state, conc, rate) in keys.items()
                ],
            )
            return True

    @_guard
    def report_limits(self, worker_id: str, reports: str) -> None:
        with self._write() as con:
            now = self._clock.time()
            con.execute(Q["trim_limit_reports"], {"worker": worker_id, "before": now - adp.REPORTS_KEPT})
            con.execute(Q["put_limit_report"], {"worker": worker_id, "at": now, "reports": reports})

    @_guard
    def take_limit_reports(self) -> list[tuple[str, str]]:
        with self._write() as con:
            rows = con.execute(Q["take_limit_reports"]).fetchall()
        return [(worker, reports) for _, worker, reports in sorted(rows)]

    @_guard
    def limits_waiting(self, names: Collection[str]) -> set[str]:
        now = self._clock.time()
        plain, keys = sorted(n for n in names if KEY_SEP not in n), sorted(n for n in names if KEY_SEP in n)
        found: set[str] = set()
        for query, some in (("limits_waiting", plain), ("keys_waiting", keys)):
            if some:
                found.update(r[0] for r in self._con().execute(Q[query], {"names": json.dumps(some), "now": now}))
        return found

    # ---- circuit breakers -------------------------------------------------
    @_guard
    def set_breaker(self, name: str, config: brk.BreakerConfig) -> None:
        with self._write() as con:
            con.execute(Q["set_breaker"], (name, brk.config_to_json(config)))

    @_guard
    def breakers(self) -> dict[str, tuple[brk.BreakerConfig, brk.Breaker]]:
        with self._read() as con:
            return {n: (r.config, r.state) for n, r in self._breaker_rows(con).items()}

    @_guard
    def force_breaker(self, name: str, state: brk.BreakerState, reason: str) -> BreakerEvent:
        with self._write() as con:
            row = self._breaker_rows(con).get(name)
            if row is None:
                raise ConfigError(f"no breaker named {name!r}")
            now = self._clock.time()
            after, change = brk.force(row.state, row.config, now, state, reason)
            ev = BreakerEvent(now, name, change.before.value, change.after.value, reason, change.calls, change.failures)
            self._save_breaker(con, name, after, ev)
        if after.state is not brk.BreakerState.CLOSED:
            self._plain_until = 0.0
        return ev

    @_guard
    def breaker_events(self, name: str | None = None, limit: int = 20) -> list[BreakerEvent]:
        return [
            BreakerEvent(**r) for r in _task_cursor(self._con()).execute(Q["breaker_events"], (name, max(0, limit)))
        ]

    # ---- maintenance ------------------------------------------------------
    @_guard
    def find_stuck(self, now: float, limit: int) -> list[SweepRow]:
        return [SweepRow(**r) for r in _task_cursor(self._con()).execute(Q["find_stuck"], {"now": now, "limit": limit})]

    @_guard
    def find_stale_pending(self, before: float, limit: int) -> list[SweepRow]:
        rows = _task_cursor(self._con()).execute(Q["find_stale_pending"], {"before": before, "limit": limit})
        return [SweepRow(**r) for r in rows]

    @_guard
    def find_expired(self, now: float, limit: int) -> list[SweepRow]:
        rows = _task_cursor(self._con()).execute(Q["find_expired"], {"now": now, "limit": limit})
        return [SweepRow(**r) for r in rows]

    @_guard
    def rescue(self, rescues: Sequence[Rescue]) -> list[bool]:
        applied: list[bool] = []
        ended: list[tuple[int, State]] = []
        groups: set[str | None] = set()
        with self._write() as con:
            now = self._clock.time()
            for r in rescues:
                row = con.execute(
                    Q["rescue"],
                    {
                        "id": r.task_id,
                        "version": r.version,
                        "to": r.to.value,
                        "error": r.error,
                        "crashed": int(r.crashed),
                        "give_back": int(r.give_back),
                        "now": now,
                        "expected": (State.PENDING if r.to is State.CANCELED else State.RUNNING).value,
                    },
                ).fetchone()
                applied.append(row is not None)
                if row is not None:
                    (group,) = row
                    groups.add(group)
                    if r.to in FINAL:
                        ended.append((r.task_id, r.to))
            self._after_final(con, ended, now, groups)
        return applied

    # ---- periodic schedules -------------------------------------------------
    @_guard
    def save_schedules(self, schedules: Sequence[Schedule], now: float | None = None) -> None:
        with self._write() as con:
            now = self._clock.time() if now is None else first_stamp(now, self._clock.time())
            con.executemany(Q["save_schedule"], [schedule_params(s, now) for s in schedules])

    @_guard
    def schedules(self) -> list[ScheduleState]:
        return [schedule_state(r) for r in _task_cursor(self._con()).execute(Q["schedules"]).fetchall()]

    @_guard
    def fire_tick(self, schedule: Schedule, tick: int) -> TickResult:
        if schedule.group is not None or schedule.limits:
            self._plain_until = 0.0  # claims here must see this work at once
        if schedule.group is not None:
            self._keyed_until = 0.0
        with self._write() as con:
            now = self._clock.time()
            last = con.execute(Q["schedule_last_run"], (schedule.name,)).fetchone()
            if last is None:
                raise ConfigError(f"schedule {schedule.name!r} was never saved in this store")
            if too_early(tick, now):
                return TickResult(EARLY)
            if con.execute(Q["tick_claim"], (schedule.name, tick, ENQUEUED, now)).rowcount != 1:
                return TickResult(TAKEN)
            _, last_status = last
            if not schedule.overlap and last_status in STILL_GOING:
                con.execute(Q["tick_skipped"], (schedule.name, tick))
                self._ticked(con, schedule.name, tick, SKIPPED, None)
                return TickResult(SKIPPED)
            (result,) = self._submit_on(con, [schedule.new_task(tick)])
            con.execute(Q["tick_set_task"], (result.id, schedule.name, tick))
            self._ticked(con, schedule.name, tick, ENQUEUED, result.id)
            return TickResult(ENQUEUED, result.id)

    @staticmethod
    def _ticked(con: sqlite3.Connection, name: str, tick: int, outcome: str, task_id: int | None) -> None:
        con.execute(Q["schedule_ticked"], {"name": name, "tick": tick, "outcome": outcome, "task_id": task_id})
        con.execute(Q["trim_ticks"], (name, tick - TICKS_KEPT_SECONDS))

    @_guard
    def schedule_ticks(self, schedule: str, limit: int = 100) -> list[TickRecord]:
        rows = _task_cursor(self._con()).execute(Q["schedule_ticks"], (schedule, max(0, limit))).fetchall()
        return [TickRecord(**r) for r in rows]

    @_guard
    def try_lead(self, role: str, holder: str, ttl: float) -> bool:
        with self._write() as con:
            now = self._clock.time()
            return con.execute(Q["try_lead"], (role, holder, now + ttl, now)).rowcount == 1


__all__ = ["SQLiteStore", "parse_url", "SCHEMA_VERSION"]
