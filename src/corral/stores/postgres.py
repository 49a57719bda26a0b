"""PostgreSQL store: ``postgresql://user@host:port/dbname`` (or ``postgres://``).

Every worker process sharing the database sees the same tasks. All SQL lives
in ``sql/postgres.sql`` as named blocks; this module only binds parameters,
runs them through a small :class:`psycopg_pool.ConnectionPool` and turns rows
into :mod:`corral.core.model` objects.

Design notes
------------
* Times are epoch seconds from the database clock (``now()``), never the
  worker's.
* ``claim`` is one statement: ``FOR UPDATE SKIP LOCKED`` over two ordered
  candidate scans, one of free tasks and one of ready group heads, chunk
  followers and the state change in the same statement. Group heads are kept
  in the rows (``is_head``, and ``ready_at`` for the round-robin order) by
  statement triggers that refresh a group after any change of its tasks'
  status or ``run_at``, one refresher per group at a time (its
  ``corral_groups`` row lock); so a claim reads heads from an index and its
  cost does not follow the number of groups. The claim still checks the exact
  head rule itself (``NOT EXISTS`` an earlier task holding the group's place,
  or one of it running): two claimers can never hold two tasks of one group,
  whatever the flags say, because a lower task is seen either active (which
  blocks every higher one) or final (permanent), and the head row is locked.
* Tasks under a capped limit are claimed only inside a transaction that holds
  ``pg_advisory_xact_lock`` on each such limit, after counting the lease tokens
  in RUNNING; unlimited work never takes that path. Ungrouped work whose every
  limit (plain or keyed) is a cap alone is claimed in one statement,
  ``claim_simple``: it locks a bounded look-ahead of candidates, then the
  advisory locks of the names they name (in name order), and reads those
  gates' places through ``corral_gate_places``, a VOLATILE function whose
  query takes a fresh snapshot after the locks (the statement's own snapshot
  would miss the places a claim holding a lock took and committed meanwhile).
  What it cannot judge (a rate, a pause, a group head, a breaker, a key's
  second unit before keys out of its reach) it leaves, whole, to the other path.
* Durability: submits, claims and completions commit synchronously, so an
  accepted task, a claim and a finished result survive a crash of the
  database. A claim the database forgot would make its task claimable again
  while its first run still goes on: two runs at once, in a group too.
* Submits (and completions that free a group head, a limit slot or promote a
  dependent) ``NOTIFY corral_work`` once per statement and queue;
  :meth:`PostgresStore.wait_for_work` waits on one listening connection per
  store instance. Where notifications cannot reach it (a transaction pooler
  such as PgBouncer in ``pool_mode=transaction`` passes LISTEN but never
  delivers), it polls every ``POLL_WITHOUT_LISTEN`` seconds instead: chosen
  with ``?listen=off`` in the URL, or by itself when the first LISTEN fails
  or its own test notification does not come back.
* The event stream (``corral_events``, written by triggers) is a ring of
  partitions by id; trimming moves a floor and empties spent partitions by
  ``TRUNCATE``, so no event leaves a dead row (see migration_0049).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from corral.core import adaptive as adp
from corral.core import breaker as brk
from corral.core import dag, texts
from corral.core import limits as limit_rules
from corral.core.batches import FINAL_STATUSES as FINAL_BATCH
from corral.core.batches import callback_task
from corral.core.claims import ClaimRequest
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
from corral.core.gates import KEY_SEP, BreakerRow, Gates, LimitState, key_at_rest, keyed_name, record_outcomes
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
)
from corral.core.pacing import chunk_reach
from corral.core.pauses import Pause, pause_order
from corral.core.pauses import event_of as pause_event
from corral.core.states import FINAL, State, check_transition, shown_counts
from corral.errors import (
    ConfigError,
    CorralError,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    SubmitError,
)
from corral.stores import sql as _sql
from corral.stores.base import (
    STILL_GOING,
    TICKS_KEPT_SECONDS,
    Event,
    FinishedTask,
    FleetLevel,
    GroupLine,
    HeartbeatReply,
    Offer,
    Rescue,
    SweepRow,
    check_bound,
    prune_params,
    schedule_params,
    schedule_state,
)
from corral.stores.gates import LIMIT_COLUMNS, breaker_row, limit_params, limit_state
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

try:  # the driver is an optional dependency (pip install corral[postgres])
    import psycopg
    from psycopg.rows import dict_row, tuple_row
    from psycopg_pool import ConnectionPool, PoolTimeout
    from psycopg_pool.base import AttemptWithBackoff
except ImportError:  # pragma: no cover - reported when a store is opened
    psycopg = None  # type: ignore[assignment]
else:

    class _SteadyBackoff(AttemptWithBackoff):
        """The pool's reconnection attempts, at most :data:`RECONNECT_EVERY` apart.

        The pool doubles the wait between attempts (1, 2, 4, 8 ... s), so after
        an outage of a minute its next attempt may come half a minute after the
        server is back, and a worker would find its leases swept by a process
        whose pool happened to try sooner (sweepers wait one lease after an
        outage, not more). An attempt a second costs the server one refused
        connection a second per pool while it is away."""

        def update_delay(self, now: float) -> None:
            super().update_delay(now)
            self.delay = min(self.delay, RECONNECT_EVERY)

    class _Pool(ConnectionPool):
        def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
            if attempt is None:
                attempt = _SteadyBackoff(timeout=self.reconnect_timeout)
            super()._add_connection(attempt, growing)


#: The longest wait (seconds) between a pool's attempts to reconnect while the
#: server is away.
RECONNECT_EVERY = 1.0

T = TypeVar("T")

#: Driver errors no retry cures: the schema is missing or damaged, or the
#: role may not use it (transient ones are retried or raised as StoreError).
_PERMANENT: tuple[type[Exception], ...] = (
    (
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedColumn,
        psycopg.errors.UndefinedFunction,
        psycopg.errors.InsufficientPrivilege,
        psycopg.errors.DataCorrupted,
        psycopg.errors.IndexCorrupted,
    )
    if psycopg is not None
    else ()
)

#: How long a claimer trusts "only plain work is queued" before it checks again
#: (delayed grouped work coming due sends no notification).
PLAIN_HINT_TTL = 0.2

#: The low-water mark of the plain claim. A claim moves its rows out of the
#: claim-order index's predicate (PENDING) and leaves their old entries in it
#: until no open transaction can see them any more: with one transaction left
#: open (a session idle in transaction, a long report) nothing is removed, and
#: a claim that walks that index from its start steps over every task claimed
#: since that transaction began (3 -> 24 600 entries a claim, 0.35 -> 8 ms in
#: 150 s at 200 tasks/s). While only plain work is queued (the fast path's
#: hint), a claimer keeps, per queues and names asked, the claim order of the
#: first row its last claim took, and its next claim starts its walk there.
#: Grouped or limited work queued, or a ":g" notification (a dependent
#: released keeps its old run_at), ends the marks with the hint.
#: What can come to be queued below the mark is read apart, from the ready
#: rows' (queue, run_at) index: a task submitted, retried or rescued since
#: (MARK_SLACK seconds before the mark's claim: a submit's run_at is its
#: transaction's start), at a higher priority, and a delayed one coming due.
#: What that misses (a row a claim passed over because another transaction
#: held it or a breaker or pause barred it, a submit slower than the slack) is
#: taken by a claim without the mark, at the latest MARK_RESCAN times the last
#: such claim's own time after it: on a clean table nearly every claim (a
#: walk from the start costs well under a millisecond), under a pinned
#: horizon one in many, so their cost stays a small share of the claims'.
MARK_SLACK = 0.5
MARK_RESCAN = 20.0
MARKED = "  -- marked"

CHANNEL = "corral_work"
#: Seconds between claims of a store that does not listen (``?listen=off``,
#: or notifications do not reach it): short, since a claim that finds
#: nothing is one indexed statement.
POLL_WITHOUT_LISTEN = 0.05
#: How long the first LISTEN waits for its own test notification before the
#: store concludes that notifications do not reach it.
LISTEN_CHECK_SECONDS = 2.0
#: the longest slice of a wait on the listening connection (how soon wake_waiters() ends it)
WAKE_SLICE = 0.1
#: An offer outlives the wait it was made for by this long, at most.
OFFER_GRACE = 1.0
#: A handed-over task rides in its notification when its row (as JSON) is at
#: most this many bytes (PostgreSQL takes payloads under 8000); a bigger one
#: is read back by the worker, one round trip more.
MAX_NOTE_ROW = 7900
#: Ids of tasks read back by withdraws kept, so their notifications, which
#: come after, are not taken again.
READ_BACK_KEPT = 1024

log = logging.getLogger("corral.store")
#: Where statements that add events notify followers of the stream.
EVENTS_CHANNEL = "corral_events"
#: A follower reads again after this long without a notification: claims and
#: completions notify no one (see migration_0023).
EVENTS_POLL = 0.1
#: How long emptying a spent event partition waits for its lock (seconds):
#: readers of the stream that come meanwhile wait behind it, inserts do not
#: (they lock only the partition their rows go to).
EVENTS_TRUNCATE_WAIT = 0.05
#: Missing ids a reader keeps asking for (rolled-back event writes leave
#: some for good, until the transactions of their time have ended).
MAX_EVENT_GAPS = 10_000
#: Settings of every corral session. The statements are few and run
#: constantly: plan them once (psycopg prepares them) instead of re-planning
#: on every call. They are all short ordered index probes; a bitmap scan only
#: ever wins on statistics gone stale (a queue's contents swing faster than
#: ANALYZE follows), and then it reads every candidate and sorts them instead
#: of stopping at the first few. No JIT: a generic plan's cost estimate
#: (a table without statistics counts as hundreds of rows) can pass the
#: server's JIT thresholds, and compiling then took 0.7 s of a 2 ms statement,
#: on every call. No parallel plans: a generic plan's estimate of the count of
#: live tasks (backpressure, the dashboard's sampler every second, /metrics)
#: passed the threshold and launched two parallel workers on each call: 11 ms
#: where the serial plan takes 1.7 ms (10 000 queued).
SESSION_OPTIONS = (
    "-c plan_cache_mode=force_generic_plan -c enable_bitmapscan=off -c jit=off -c max_parallel_workers_per_gather=0"
)
#: Pooled connections per store instance. With the listening connection a
#: worker process holds at most ``POOL_MAX_SIZE + 1`` connections whatever
#: its slots: claims and completions are batched by one dispatcher and one
#: completer thread, so more connections would only idle (and fill the
#: server's ``max_connections`` as workers are added).
POOL_MAX_SIZE = 2
#: A claim reads and locks the keys (keyed limits' budgets) of at most this
#: many ready candidates per path for each unit it asks for, and at least
#: KEY_PROBE_MIN: the keys it looks at, never every key with work queued.
KEY_PROBE_EACH = 4
KEY_PROBE_MIN = 32
#: looks for distinct keys a claim makes at most (each passes over the keys found)
KEY_PROBE_LOOKS = 3
#: The look-ahead of the one-statement claim of work under simple limits
#: (``claim_simple``): the candidates it locks and judges for a claim of n
#: units, max(n + SIMPLE_LOOK_MIN, SIMPLE_LOOK_EACH x n) and at most
#: SIMPLE_LOOK_MAX: enough that n keys in turn are usually among them, few
#: enough that the rows it locks and leaves cost little (each lock is a
#: write to the row's page).
SIMPLE_LOOK_EACH = 2
SIMPLE_LOOK_MIN = 8
SIMPLE_LOOK_MAX = 2000
#: After that statement left a claim to the other path (a gate more than a
#: cap, a group head, one key's backlog in front), claims go straight to the
#: other path for this long (seconds).
SIMPLE_OFF = 0.2
#: ... and for this long when the database has no corral_gate_places yet.
SIMPLE_UNMIGRATED_OFF = 30.0
#: pg_advisory_lock key held around schema migration.
MIGRATE_LOCK_KEY = 7429000
#: The highest migration applied (``migration_00NN`` in sql/postgres.sql, run in
#: order; a number with no block was never a PostgreSQL migration):
#: 1: the tasks table, its partial indexes, limits, leadership and groups;
#: 2: group heads kept in the rows (is_head, ready_at) by statement triggers;
#: 3: the group-head index holds grouped tasks only;
#: 4: status must name a state (a CHECK constraint); 5: flow control;
#: 6: the dead-letter index, the fleet level row and the event log; 7: the retry path;
#: 8: periodic schedules and their ticks;
#: 13: batch settings (callbacks) and the index of a batch's unfinished tasks;
#: 14: the dashboard's indexes; 18: claim-order indexes hold the ageing rank;
#: 19: graph columns (ref, on_upstream_failure); 20: one claim index per path,
#: by exact status (fresh work, retries); 21: the task table vacuumed after 1 %
#: of its rows changed; 22: a search by group reads the line's index and an
#: index of the tasks that left it; 23: the event stream (task and breaker
#: events by trigger); 24: offers of waiting workers; 25: no statistics on
#: status (claim plans); 27: a task's crash count; 28: a failed attempt's
#: traceback; 33: a limit's log of recent starts (a sliding window's);
#: 34: worker processes' rows (corral_workers); 35: an index of held rows by
#: worker, dropped again (a write per claim); 36: each minute's figures (corral_minute_stats);
#: 37: debounce and supersede keys (debounce_key, supersede_key and their indexes);
#: 38: a deadline for a task's first start (expires_at, its partial index) and
#: why a running task was asked to stop (cancel_reason); 39: pauses by hand (corral_pauses);
#: 40: keyed limits' keys in a table of their own (corral_limit_keys), rows made by a rate or a pause only.
#: 41: limits changed while running (corral_limits.per_key, set_by, declared, changed_at).
#: 43: adaptive limits (corral_limits.adaptive, .controller) and the workers' reports (corral_limit_reports).
#: 45: task events stored narrow (see migration_0045).
#: 46: the places held under each limit (corral_held_places, kept by triggers).
#: 47: a keyed adaptive limit's keys' own values and controller states (corral_limit_keys columns).
#: 49: the event stream a ring of partitions, trimmed by a floor and TRUNCATE (see migration_0049).
#: 50: the gates' places and caps read after their locks (corral_gate_places, for claim_simple).
SCHEMA_VERSION = 50
#: A group's tasks, as the two indexes that hold them say: in its line, or
#: out of it (their conditions word for word, so a search by group reads
#: them both).
_GROUP_PARTS = (
    "group_key IS NOT NULL AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')"
    " OR (status = 'FAILED' AND halt_group_on_failure))",
    "group_key IS NOT NULL AND (status IN ('SUCCESS', 'TIMEOUT', 'CANCELED')"
    " OR (status = 'FAILED' AND NOT halt_group_on_failure))",
)


@functools.cache
def _queries() -> dict[str, str]:
    """The store's statements: the claims (their lines that end "-- marked"
    left out) and "<claim>_marked", with those lines, which walk from a mark."""
    q = dict(_sql.load("postgres"))
    for name in ("claim", "claim_plain"):
        lines = q[name].splitlines()
        q[name] = "\n".join(line for line in lines if not line.endswith(MARKED))
        q[name + "_marked"] = "\n".join(line.removesuffix(MARKED) for line in lines)
    return q


@dataclass(slots=True)
class _Mark:
    """Where a plain claim's walk of the claim-order index starts (see MARK_SLACK)."""

    rank: float
    id: int
    #: the rows below the mark read apart: those whose run_at is after this
    since: float
    #: monotonic time of the last claim without the mark
    full_at: float


def text_array(items: Collection[str]) -> str:
    """A PostgreSQL array literal of strings, sent as one text parameter
    (cast in the query): the driver's list adapter inspects every element in
    Python, which costs more than the claim it feeds."""
    return "{" + ",".join('"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items) + "}"


def int_array(items: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers (see :func:`text_array`)."""
    return "{" + ",".join(str(int(i)) for i in items) + "}"


def _close_quietly(conn: psycopg.Connection | None) -> None:
    """Close a connection that may be broken already: best effort."""
    if conn is not None:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


#: How long a process trusts its list of breaker names (a completion under
#: one feeds it); a breaker declared in this process is seen at once.
BREAKER_NAMES_TTL = 1.0


def _is_outage(exc: Exception) -> bool:
    """Whether an OperationalError means the server cannot be used right now.

    psycopg files some data errors under OperationalError too (an index
    entry too big is "program limit exceeded"); those fail the same way
    every time, so they are plain StoreErrors, neither retried nor called
    an outage. An outage: the connection broke (no SQLSTATE, or class 08),
    the server shuts down or refuses sessions (57P01..57P03), or it ran out
    of resources (class 53: disk, memory, connection slots)."""
    state = getattr(exc, "sqlstate", None)
    return state is None or state[:2] in ("08", "53") or state in ("57P01", "57P02", "57P03")


def _redact(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        parts = urlsplit(url)
        if parts.password is not None:
            host = parts.hostname or ""
            if parts.port:
                host = f"{host}:{parts.port}"
            user = parts.username or ""
            return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query, parts.fragment))
    except ValueError:
        pass
    return url


def _corral_options(url: str) -> tuple[str, bool, str | None]:
    """``url`` without corral's own parameters (libpq does not know them),
    whether the store listens for notifications, and the pooler it goes
    through. ``listen=off`` polls instead; ``pooler=session`` or
    ``pooler=transaction`` names a connection pooler such as PgBouncer in
    that mode (a transaction pooler implies ``listen=off``)."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v.strip().lower() for k, v in pairs if k in ("listen", "pooler")}
    pooler = ours.get("pooler")
    if pooler is not None and pooler not in ("session", "transaction"):
        raise ValueError(f"pooler={pooler!r}: use pooler=session or pooler=transaction")
    listen = pooler != "transaction"
    if "listen" in ours:
        if ours["listen"] not in _LISTEN_VALUES:
            raise ValueError(f"listen={ours['listen']!r}: use listen=on or listen=off")
        listen = _LISTEN_VALUES[ours["listen"]]
    if not ours:
        return url, listen, pooler
    rest = urlencode([(k, v) for k, v in pairs if k not in ours])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), listen, pooler


_LISTEN_VALUES = {
    **dict.fromkeys(("on", "true", "1", "yes"), True),
    **dict.fromkeys(("off", "false", "0", "no"), False),
}


def _set_session_options(conn) -> None:
    """SESSION_OPTIONS as SET statements, for a new connection of a session pooler."""
    for opt in SESSION_OPTIONS.split("-c "):
        if opt.strip():
            name, value = opt.strip().split("=", 1)
            conn.execute(f"SET {name} = {value}")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _record(row: dict[str, Any]) -> TaskRecord:
    return task_record(row, row["limits"] or (), row["depends_on"] or ())


#: Queued tasks as the partial indexes hold them: the free ones, the grouped
#: ones. ``status = 'PENDING'`` alone matches none of these indexes, so every
#: PENDING task of a queue (a bulk action's ids) is read as one arm each.
_PENDING_PARTS = (
    "(status = 'PENDING' AND group_key IS NULL)",
    "(status IN ('PENDING', 'RETRYING') AND group_key IS NOT NULL)",
)
#: States whose whole set a bulk action reads from their partial indexes,
#: sorted, rather than by the primary key's order: the sessions plan once
#: for any LIMIT (generic plans), and that plan walked the primary key past
#: every finished task (a bulk cancel's ids of a queue: 1.3 s among a million).
_SPARSE = (State.RUNNING, State.RESERVED)
_WHOLE_SPARSE = (*_SPARSE, State.PENDING, State.RETRYING, State.WAITING)


def _list_sql(select: str, flt: TaskFilter, *, whole: bool = False) -> tuple[str, dict[str, Any]]:
    """``select`` (its columns ``FROM corral_tasks``) with the conditions,
    order and page of ``flt``; ``whole``: every match is wanted (a bulk
    action's ids), so queued tasks are read from their partial indexes."""
    where: list[str] = []
    params: dict[str, Any] = {}
    for attr, col in (
        ("queue", "queue"),
        ("batch", "batch"),
        ("group", "group_key"),
        ("name", "name"),
        ("trace_id", "trace_id"),
        ("key", "idem_key"),
    ):
        value = getattr(flt, attr)
        if value is not None:
            where.append(f"{col} = %({attr})s")
            params[attr] = value
    if flt.status is not None:
        where.append(status_filter(State(flt.status)))
    if flt.error_prefix is not None:
        where.append("substr(error, 1, %(plen)s) = %(prefix)s")
        params["plen"] = len(flt.error_prefix)
        params["prefix"] = flt.error_prefix
    if flt.after_id is not None:
        where.append("id < %(after_id)s" if flt.newest_first else "id > %(after_id)s")
        params["after_id"] = flt.after_id
    if flt.min_id is not None:
        where.append("id >= %(min_id)s")
        params["min_id"] = flt.min_id
    if flt.max_id is not None:
        where.append("id <= %(max_id)s")
        params["max_id"] = flt.max_id
    if flt.group is not None:
        # every grouped task is in its line's index or in the finished
        # ones': one arm each, merged in id order
        sql = " UNION ALL ".join(select + " WHERE " + " AND ".join([*where, part]) for part in _GROUP_PARTS)
    elif whole and flt.status is State.PENDING:
        arms = " UNION ALL ".join(select + " WHERE " + " AND ".join([*where, part]) for part in _PENDING_PARTS)
        sql = f"SELECT * FROM ({arms}) AS queued"
    else:
        sql = select
        if where:
            sql += " WHERE " + " AND ".join(where)
    # the running tasks (a few per worker slot), and for a bulk action every
    # queued one, are read from their partial indexes and sorted, never found
    # by a walk of the primary key past every finished task, which the
    # planner picks when it takes them for many: ``id + 0`` is no order an
    # index gives
    sparse = flt.status in (_WHOLE_SPARSE if whole else _SPARSE) and flt.group is None
    order = "id + 0" if sparse else "id"
    sql += f" ORDER BY {order} {'DESC' if flt.newest_first else 'ASC'} LIMIT %(limit)s OFFSET %(offset)s"
    params["limit"] = max(0, int(flt.limit))
    params["offset"] = max(0, int(flt.offset))
    return sql, params


class PostgresStore(SqlStore):
    shared = True

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = POOL_MAX_SIZE, connect_timeout: float = 5.0):
        if psycopg is None:  # pragma: no cover
            raise StoreUnavailable("the PostgreSQL store needs psycopg: pip install 'corral[postgres]'")
        self.url = url
        self._shown = _redact(url)
        if url.startswith("postgres://"):
            url = "postgresql://" + url[len("postgres://") :]
        try:
            url, self._listening, self._pooler = _corral_options(url)
        except ValueError as exc:
            raise StoreUnavailable(f"cannot parse store URL {self._shown}: {exc}") from None
        self._dsn = url
        self._q = _queries()
        self._connect_timeout = connect_timeout
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot parse store URL {self._shown}: {first_line(exc)}") from None
        # Poolers refuse the `options` startup parameter: a session pooler
        # gets the settings with SET on each new connection; behind a
        # transaction pooler a SET would stay on whichever server session ran
        # it, so the database's own settings apply (see docs/scaling.md), and
        # no statement is prepared on a server session (the next statement
        # may run on another).
        self._conn_kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": max(1, int(connect_timeout))}
        configure = None
        if self._pooler is None:
            self._conn_kwargs["options"] = SESSION_OPTIONS
        elif self._pooler == "session":
            configure = _set_session_options
        else:
            self._conn_kwargs["prepare_threshold"] = None
        # Connect once directly: a clear one-line error beats a pool timeout.
        try:
            psycopg.connect(url, **self._conn_kwargs).close()
        except psycopg.Error as exc:
            hint = ""
            if "startup parameter" in str(exc):
                hint = " (through a connection pooler? add ?pooler=transaction or ?pooler=session to the URL)"
            raise StoreUnavailable(f"cannot connect to {self._shown}: {first_line(exc)}{hint}") from None
        self._pool = _Pool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs=self._conn_kwargs,
            configure=configure,
            timeout=connect_timeout * 2,
            name="corral",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout * 2)
        except PoolTimeout:
            self._pool.close()
            raise StoreUnavailable(f"cannot connect to {self._shown}: timed out") from None
        self._closed = False
        self._outage_at: float | None = None  # see last_outage
        self._pool_failures = 0
        self._limited_hint = True  # probe for capped limits before claiming
        #: limits seen keyed (their tasks name their keys): the probe passes over them
        self._keyed_limits: set[str] = set()
        self._breaker_names: frozenset[str] = frozenset()
        self._breaker_names_until = 0.0  # monotonic time until which that list is trusted
        self._plain_until = 0.0  # monotonic time until which claims take the plain fast path
        self._simple_off_until = 0.0  # monotonic time until which claims skip claim_simple
        self._simple_off = SIMPLE_OFF
        #: per (queues, names) claimed: the plain claim's low-water mark (see MARK_SLACK)
        self._marks: dict[tuple, _Mark] = {}
        self._full_claim_s = 0.0  # how long the last plain claim without a mark took
        self._mark_rescan = MARK_RESCAN
        # LISTEN/NOTIFY: one listener thread per store instance, started lazily.
        self._cond = threading.Condition()
        self._gen = 0
        self._wakes = 0  # wake_waiters() calls: a change ends the listening thread's wait
        self._listen_lock = threading.Lock()  # held by the thread using the listening connection
        self._listen_conn: Any = None
        self._local = threading.local()
        # where a submit tells this store's waiting worker it handed it a task
        self._offer_channel = f"corral_offer_{uuid.uuid4().hex[:16]}"
        #: each wait's offer has a number of its own (its row's key with the
        #: worker's id), from the clock so a restart under the same worker id
        #: does not reuse one; per worker, the number of its last offer's row
        #: if it may still be there (spent, or its withdraw failed): the next
        #: offer deletes it
        self._offer_numbers = itertools.count(time.time_ns() // 1000)
        self._offer_rows: dict[str, int] = {}
        # ids of tasks read back by a withdraw lately (their notifications may
        # still be queued), oldest first
        self._read_back: dict[int, None] = {}
        self._events_lock = threading.Lock()  # held by the thread following the event stream
        self._events_conn: Any = None

    # ---- plumbing -----------------------------------------------------------
    def last_outage(self) -> float | None:
        """When this process last found the server away: a call failed for
        it, or the pool failed to connect or lost connections since the last
        look (a call waiting for a connection through a short outage never
        fails, so the pool's own counts are read too; seen at the look)."""
        stats = self._pool.get_stats()
        failures = stats.get("connections_errors", 0) + stats.get("connections_lost", 0) + stats.get("returns_bad", 0)
        if failures != self._pool_failures:
            self._pool_failures = failures
            self._outage_at = time.monotonic()
        return self._outage_at

    def _run(self, fn: Callable[[Any], T], *, retry: bool = True) -> T:
        """Run ``fn(conn)`` on a pooled connection; retry once on a broken
        connection (a database restart), translate driver errors."""
        if self._closed:
            raise StoreError("store is closed")
        attempts = 2 if retry else 1
        for attempt in range(attempts):
            try:
                with self._pool.connection() as conn:
                    return fn(conn)
            except CorralError:
                raise
            except PoolTimeout as exc:
                self._outage_at = time.monotonic()
                raise StoreUnavailable(f"cannot connect to {self._shown}: {first_line(exc)}") from None
            except (psycopg.errors.TransactionRollback, psycopg.errors.DeadlockDetected) as exc:
                # a deadlock or serialization failure: the statement did nothing; run it again
                if attempt + 1 < attempts:
                    continue
                raise StoreError(f"{type(exc).__name__}: {first_line(exc)}") from None
            except psycopg.OperationalError as exc:
                if not _is_outage(exc):
                    raise StoreError(f"{type(exc).__name__}: {first_line(exc)}") from None
                self._outage_at = time.monotonic()  # (a broken connection: the server went away, if briefly)
                if attempt + 1 < attempts:
                    try:
                        self._pool.check()
                    except Exception:  # pragma: no cover - best effort
                        pass
                    continue
                raise StoreUnavailable(f"cannot reach {self._shown}: {first_line(exc)}") from None
            except _PERMANENT as exc:
                raise StoreCorrupt(f"cannot use {self._shown}: {first_line(exc)}") from None
            except psycopg.Error as exc:
                raise StoreError(f"{type(exc).__name__}: {first_line(exc)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _fetchall(self, name: str, params: dict | None = None, *, dicts: bool = False) -> list:
        def go(conn):
            cur = conn.cursor(row_factory=dict_row) if dicts else conn.cursor()
            cur.execute(self._q[name], params)
            return cur.fetchall() if cur.description is not None else []

        return self._run(go)

    def _value(self, name: str, params: dict | None = None) -> Any:
        """The one value the named query selects."""
        ((value,),) = self._fetchall(name, params)
        return value

    def _rowcount(self, name: str, params: dict) -> int:
        return self._run(lambda conn: conn.execute(self._q[name], params).rowcount)

    # ---- life cycle -----------------------------------------------------------
    def migrate(self) -> None:
        migrations = sorted((int(k.rsplit("_", 1)[1]), k) for k in self._q if k.startswith("migration_"))

        def go(conn):
            if self._pooler == "transaction":
                # a session lock could be taken on one server session and
                # released on another: hold a transaction's lock instead
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
                    steps(conn)
                return
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK_KEY,))
            try:
                steps(conn)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK_KEY,))

        def steps(conn):
            conn.execute(self._q["schema_version_table"])
            (current,) = conn.execute(self._q["schema_version"]).fetchone() or (0,)
            if current > SCHEMA_VERSION:
                raise StoreCorrupt(
                    f"{self._shown} has schema version {current}, newer than this corral knows"
                    f" ({SCHEMA_VERSION}); upgrade corral"
                )
            for version, key in migrations:
                if version <= current:
                    continue
                with conn.transaction():
                    conn.execute(self._q[key])
                    conn.execute(self._q["set_schema_version"], {"v": version})

        self._run(go)
        if self._value("status_statistics"):
            log.warning(
                "%s: corral_tasks.status still has planner statistics from an older corral, with which "
                "claims may read the whole table; a superuser can delete them (docs/scaling.md, "
                '"Statistics and claim plans")',
                self._shown,
            )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.wake_waiters()
        # a dispatcher may still wait on the listening connection: it returns
        # within a slice of its wait and finds the store closed
        got = self._listen_lock.acquire(timeout=2)
        try:
            self._drop_listen_conn()
        finally:
            if got:
                self._listen_lock.release()
        got = self._events_lock.acquire(timeout=2)
        try:
            self._drop_events_conn()
        finally:
            if got:
                self._events_lock.release()
        self._pool.close()

    def now(self) -> float:
        return self._value("now")

    # ---- producers --------------------------------------------------------------
    def submit(self, tasks: Sequence[NewTask], *, max_queued: int | None = None) -> list[SubmitResult]:
        tasks = list(tasks)
        if not tasks:
            return []
        if any(t.debounce_key is not None or t.supersede_key is not None for t in tasks):

            def keyed(conn):
                with conn.transaction():
                    return self._submit_keyed(conn, tasks, max_queued)

            return self._end_plain_hint(tasks, self._run(keyed))
        if any(t.after for t in tasks):

            def graph(conn):
                with conn.transaction():
                    return self._submit_graph(conn, tasks, max_queued)

            return self._end_plain_hint(tasks, self._run(graph))
        plan = _SubmitPlan(tasks)

        # one plain task due now may go straight to a waiting worker's offer
        offer = len(plan.rows) == 1 and max_queued is None and _plain_now(plan.rows[0])

        def go(conn):
            # Without dependencies the insert is one atomic statement; with
            # them, the dependency rows are locked first in the same transaction.
            with conn.transaction() if plan.all_deps or max_queued is not None else _nothing():
                return self._submit_on(conn, plan, max_queued, offer=offer)

        return self._end_plain_hint(tasks, plan.results(self._run(go)))

    def _end_plain(self) -> None:
        """Grouped or limited work is queued, or a task was made ready below
        the marks (a dependent released: ":g"): no fast path, no marks."""
        self._plain_until = 0.0
        self._marks.clear()

    def _end_plain_hint(self, tasks: Sequence[NewTask], out: T) -> T:
        """Grouped or limited work submitted here ends this store's plain fast
        path at once, once it is stored (other stores learn of it from the
        ":g" notification); returns ``out``."""
        self._keyed_limits.update(n.partition(KEY_SEP)[0] for t in tasks for n in t.limits if KEY_SEP in n)
        if any(t.group is not None or t.limits for t in tasks):
            self._end_plain()
        return out

    def _submit_graph(self, conn, tasks: list[NewTask], max_queued: int | None) -> list[SubmitResult]:
        """A graph (tasks naming earlier ones of the call by position): one
        insert per layer, each naming the ids the layers before it were given,
        all on ``conn`` inside its transaction."""
        self._admit(conn, len(tasks), max_queued)
        depth = dag.depths([t.after for t in tasks])
        out: list[SubmitResult | None] = [None] * len(tasks)
        for layer in range(max(depth) + 1):
            pos = [i for i, d in enumerate(depth) if d == layer]
            rows = []
            for i in pos:
                t = tasks[i]
                ids = (out[j].id for j in t.after)  # type: ignore[union-attr]
                rows.append(replace(t, depends_on=tuple(dict.fromkeys((*t.depends_on, *ids))), after=()))
            plan = _SubmitPlan(rows)
            for i, r in zip(pos, plan.results(self._submit_on(conn, plan, None))):
                out[i] = r
        return out  # type: ignore[return-value]

    def _submit_keyed(self, conn, tasks: list[NewTask], max_queued: int | None) -> list[SubmitResult]:
        """Tasks with debounce or supersede keys, one at a time on ``conn``
        inside its transaction: each reads and writes the rows of its key."""
        q = self._q
        out: list[SubmitResult] = []
        for t in tasks:
            if t.after:  # a graph's task: the ids of the earlier ones are known by now
                ids = (out[j].id for j in t.after)
                t = replace(t, depends_on=tuple(dict.fromkeys((*t.depends_on, *ids))), after=())
            if t.debounce_key is not None:
                at: dict[str, Any] = {"name": t.name, "key": t.debounce_key}
                conn.execute(q["debounce_lock"], at)
                merged = conn.execute(
                    q["debounce_merge"], dict(at, args=t.args, window=t.debounce or 0.0, bound=t.debounce_max)
                ).fetchone()
                if merged is not None:
                    out.append(SubmitResult(merged[0], False))
                    continue
            plan = _SubmitPlan([t])
            (r,) = plan.results(self._submit_on(conn, plan, max_queued))
            out.append(r)
            if not r.created:
                continue
            keys = {"id": r.id, "debounce_key": t.debounce_key, "supersede_key": t.supersede_key}
            conn.execute(q["set_keys"], dict(keys, window=t.debounce))
            if t.supersede_key is not None:
                at = {"name": t.name, "key": t.supersede_key, "id": r.id}
                conn.execute(q["supersede_lock_groups"], at)
                ended = conn.execute(q["supersede_queued"], at).fetchall()
                conn.execute(q["supersede_running"], at)
                if ended:
                    self._settle(conn, [tid for tid, _, _ in ended])
                    for queue in sorted({queue for _, queue, group in ended if group is not None}):
                        conn.execute(q["notify"], {"queue": queue})  # the next task of a group may start
        return out

    def _admit(self, conn, adding: int, max_queued: int | None) -> None:
        """Raise QueueFull unless ``adding`` more tasks fit under ``max_queued``,
        on ``conn`` inside the transaction that then inserts them.

        Exact across submitters without putting them in single file: each
        marks itself in flight (a shared advisory lock naming how many it
        adds) before it reads the marks of the others and then counts. Of two
        submitters at once, the one that reads the marks later sees the
        other's mark (held until its commit is visible) or its rows, so the
        last reader of any set of racing submitters counts them all. A
        submitter that does not fit for the marks of others may have been
        shut out by one that then gives up, so it tries again in single file
        (the exclusive lock), marked again only once it holds it: the last in
        that line decides on the rows alone."""
        if max_queued is None:
            return
        q = self._q
        n = min(adding, 2**31 - 1)

        def marked_count() -> int:
            """Mark this submit in flight, then count the queue and the others' marks."""
            conn.execute(q["mark_bounded_submit"], {"n": n})
            others = conn.execute(q["bounded_in_flight"]).fetchone()[0]
            return conn.execute(q["queued_upto"], {"n": max_queued + 1}).fetchone()[0] + others

        try:
            with conn.transaction():  # a savepoint: rolled back, it lets go of the mark
                if marked_count() + adding > max_queued:
                    raise _NoRoomYet
            return
        except _NoRoomYet:
            pass
        conn.execute(q["lock_queue_bound"])
        check_bound({"PENDING": marked_count()}, adding, max_queued)

    def _submit_on(self, conn, plan: _SubmitPlan, max_queued: int | None, *, offer: bool = False) -> tuple:
        """The submit's statements on ``conn``, inside whatever transaction it
        is in; with ``offer``, its one plain task goes in by ``submit_one``
        and may go to a waiting worker."""
        rows = plan.rows
        self._admit(conn, len(plan.tasks), max_queued)
        states: dict[int, State] = {}
        if plan.all_deps:
            for dep_id, status in conn.execute(self._q["dep_states"], {"ids": plan.all_deps}):
                states[dep_id] = State(status)
            missing = [d for d in plan.all_deps if d not in states]
            if missing:
                raise SubmitError(f"unknown dependency id(s): {', '.join(map(str, missing))}")
        status_col: list[str] = []
        error_col: list[str | None] = []
        for t in rows:
            status, error = dag.initial_state([(d, states[d]) for d in t.depends_on], t.on_upstream_failure)
            status_col.append(status.value)
            error_col.append(error)
        if offer:
            inserted = conn.execute(self._q["submit_one"], _one_params(rows[0])).fetchall()
        else:
            params = {"rows": _submit_rows(rows, status_col, error_col)}
            inserted = conn.execute(self._q["submit"], params).fetchall()
        by_key = {k: i for i, k, _ in inserted if k is not None}
        new_ids = [i for i, _, _ in inserted]
        existing: dict[str, int] = {}
        keys = [t.key for t in rows if t.key is not None and t.key not in by_key]
        if keys:
            existing = dict(conn.execute(self._q["ids_by_key"], {"keys": keys}).fetchall())
        return new_ids, by_key, existing

    def submit_in(
        self, connection: Any, tasks: Sequence[NewTask], *, max_queued: int | None = None
    ) -> list[SubmitResult]:
        """Submit inside the caller's own transaction on ``connection``, a
        psycopg (3) connection to this store's database, used as it is and
        never committed: the tasks exist if and only if the caller commits
        (the workers' wake-up NOTIFY is sent at that commit too)."""
        if psycopg is None or not isinstance(connection, psycopg.Connection):
            raise ConfigError(
                f"connection= must be a psycopg (3) connection to this store's database, "
                f"not {type(connection).__name__}"
            )
        tasks = list(tasks)
        status = connection.info.transaction_status
        TS = psycopg.pq.TransactionStatus
        if status == TS.INERROR:
            raise ConfigError("connection= is in a failed transaction: roll it back first")
        if status not in (TS.IDLE, TS.INTRANS):
            raise ConfigError("connection= is busy or broken; it cannot take the tasks")
        if status == TS.IDLE and connection.autocommit:
            raise ConfigError(
                "connection= is in autocommit mode with no transaction open: open one "
                "(with conn.transaction(): ...) so the tasks commit with your own writes"
            )
        if not tasks:
            return []
        plan = _SubmitPlan(tasks)
        try:
            cur = connection.cursor(row_factory=tuple_row)
            where: Any = cur.execute(self._q["whereami"]).fetchone()
            mine: Any = getattr(self, "_whereami", None)
            if mine is None:  # this store's own database: asked once
                mine = self._whereami = self._run(lambda conn: conn.execute(self._q["whereami"]).fetchone())
            database, tasks_table, started = where
            ours, _, _ = mine
            if (database, tasks_table, started) != tuple(mine):
                raise ConfigError(
                    f"connection= is open on database {database!r}, not on this store's database {ours!r}"
                )
            if tasks_table is None:
                raise ConfigError("connection= does not see corral's tables (another schema search path?)")
            self._end_plain_hint(tasks, None)
            if any(t.debounce_key is not None or t.supersede_key is not None for t in tasks):
                return self._submit_keyed(_Rows(cur), tasks, max_queued)
            if any(t.after for t in tasks):
                return self._submit_graph(_Rows(cur), tasks, max_queued)
            return plan.results(self._submit_on(_Rows(cur), plan, max_queued))
        except CorralError:
            raise
        except psycopg.Error as exc:
            raise StoreError(f"{type(exc).__name__}: {first_line(exc)}") from None

    def _settle(self, conn, ids: list[int]) -> None:
        """Settle the dependents of ended tasks; the ones canceled on the way
        are settled in turn, so a dependent that runs anyway sees them ended.
        A dependent made ready keeps its run_at, below the claim marks: this
        store's end now (others' with the ":g" notification)."""
        if ids:
            self._end_plain()
        while ids:
            canceled, _, _ = conn.execute(self._q["settle_dependents"], {"ids": ids}).fetchone()
            ids = canceled or []

    def upstream(self, task_id: int) -> list[TaskRecord]:
        return [shown_record(_record(r)) for r in self._fetchall("upstream", {"id": task_id}, dicts=True)]

    # ---- workers ----------------------------------------------------------------
    def claim(self, worker_id: str, request: ClaimRequest) -> list[Claim]:
        if request.max_units <= 0:
            return []
        max_units, prefetch = request.max_units, request.prefetch
        # Remember what this thread has seen, so wait_for_work() returns at
        # once if a notification arrived between this claim and the wait.
        self._local.seen = self._gen
        base = _claim_params(worker_id, request)

        key = (base["queues"], base["all_names"], base["names"])
        marked = ""

        def go(conn):
            nonlocal marked
            cur = conn.cursor(row_factory=dict_row)
            now = time.monotonic()
            # (a mark is kept only while no grouped or limited work is queued)
            mark = self._marks.get(key)
            marked = ""
            if mark is not None and now - mark.full_at < self._mark_rescan * self._full_claim_s:
                marked = "_marked"
                base.update(lo_rank=mark.rank, lo_id=mark.id, since=mark.since)
            if self._plain_until > now:
                # Only plain work was queued a moment ago: one light statement.
                cur.execute(self._q["claim_plain" + marked], {**base, "n": max_units})
                rows = cur.fetchall()
                self._mark(key, rows, None if marked else now, base["lease"])
                fast = bool(rows)
                if not fast:
                    rows = full(conn, cur)
            else:
                fast = False
                rows = full(conn, cur)
                self._mark(key, rows, None if marked else now, base["lease"])
            if not marked:
                # what the walks from the start cost (the claims, the probes)
                self._full_claim_s = time.monotonic() - now
            if fast:
                return rows
            # Take the fast path for a while if nothing grouped or limited waits;
            # a ":g" notification, or at the latest PLAIN_HINT_TTL, ends it.
            plain = not any(r["group_key"] is not None or r["limits"] for r in rows)
            if plain and not conn.execute(self._q["special_ready"]).fetchone()[0]:
                self._plain_until = now + PLAIN_HINT_TTL
            else:
                self._end_plain()
            return rows

        def full(conn, cur):
            # from the mark too, if that claim was (only plain work was queued)
            claim = self._q["claim" + marked]
            if prefetch:
                # no unit naming a limit: gates stay shut, nothing to lock or charge
                cur.execute(claim, {**base, "n": max_units, "allowed": []})
                return cur.fetchall()
            if self._limited_hint and not marked and _simple_fits(base):
                # limited work was queued: ungrouped work under caps alone in one statement
                rows, more = self._claim_simple(cur, base, max_units)
                if not more:
                    # It reads from the start of the claim order, with no mark: took it
                    # nothing limited, the plain claims (and their marks) go on, and
                    # the probe looks again once they find nothing.
                    self._limited_hint = any(r["limits"] for r in rows)
                    return rows
            tried = not self._limited_hint
            if tried:
                # Last time no capped limit had work waiting: claim unlimited
                # work in one round trip, and probe only if that found nothing.
                cur.execute(claim, {**base, "n": max_units, "allowed": []})
                rows = cur.fetchall()
                if rows:
                    return rows
            # A mark is kept only while no limited work is queued: no look for
            # keys (its read of fresh limited work walks the index the mark is
            # there to spare). Limited work submitted since ends the marks with
            # its ":g" notification, which wakes a claim.
            keys = [] if marked else self._probe_keys(conn, base["queues"], max_units)
            self._keyed_limits.update(k.partition(KEY_SEP)[0] for k in keys)
            probe = {"queues": base["queues"], "keyed": sorted(self._keyed_limits)}
            limited = conn.execute(self._q["claim_probe"], probe).fetchone()[0]
            self._limited_hint = bool(limited or keys)
            if not limited and not keys:
                self._note_gate_wait(None)
                if tried:
                    return []  # that claim was this one (work since then notifies)
                cur.execute(self._q["claim"], {**base, "n": max_units, "allowed": []})
                return cur.fetchall()
            return self._claim_limited(conn, cur, base, max_units, limited, keys)

        return _as_claims(self._run_listening(go))

    def _claim_simple(self, cur, base: dict, n: int) -> tuple[list[dict], bool]:
        """Claim up to ``n`` units of ungrouped work whose limits are caps
        alone in one statement (``claim_simple``). Returns the rows and
        whether the claim is left to the other path (then nothing was taken,
        and claims skip this statement for ``SIMPLE_OFF`` seconds)."""
        if time.monotonic() < self._simple_off_until:
            return [], True
        look = max(n + 1, min(SIMPLE_LOOK_MAX, max(n + SIMPLE_LOOK_MIN, SIMPLE_LOOK_EACH * n)))
        try:
            cur.execute(self._q["claim_simple"], {**base, "n": n, "look": look})
        except psycopg.errors.UndefinedFunction:
            # a database not migrated to schema 50 yet (a store opened before
            # its migration): the other path, and a look again a while later
            self._simple_off_until = time.monotonic() + SIMPLE_UNMIGRATED_OFF
            return [], True
        rows = cur.fetchall()
        more = bool(rows) and bool(rows[0]["more"])
        if more:
            self._simple_off_until = time.monotonic() + self._simple_off
        return [r for r in rows if r["id"] is not None], more

    def _mark(self, key: tuple, rows: list[dict], full_at: float | None, lease: float) -> None:
        """Move the mark of ``key`` to the first plain row of a claim's
        ``rows`` in claim order (``full_at``: the claim walked from the start
        at that monotonic time; a claim that found nothing keeps the mark)."""
        old = self._marks.get(key)
        plain = [r for r in rows if r["group_key"] is None and not r["limits"]]
        if not plain:
            if full_at is not None and old is not None:
                old.full_at = full_at
            return
        first = min(plain, key=lambda r: (r["run_at"] - r["priority"] * 60.0, r["id"]))
        # the claim's clock: each row's lease ends `lease` after it
        since = first["lease_expires_at"] - lease - MARK_SLACK
        at = full_at if full_at is not None else (old.full_at if old is not None else None)
        if at is None:
            return  # a mark starts from a claim that walked from the start
        self._marks[key] = _Mark(first["run_at"] - first["priority"] * 60.0, first["id"], since, at)

    def _probe_keys(self, conn, queues: Any, max_units: int) -> list[str]:
        """The keys of the first ready candidates, in claim order: distinct
        keys, so one hot key's backlog in front does not hide the keys behind
        it (each further look passes over the keys found so far)."""
        m = max(KEY_PROBE_MIN, KEY_PROBE_EACH * max_units)
        keys: list[str] = []
        # as many looks as it takes to find a key per unit (a key's long backlog
        # in front is passed over by the next look), and at least KEY_PROBE_LOOKS
        for _ in range(max(KEY_PROBE_LOOKS, max_units)):
            more = conn.execute(self._q["key_probe"], {"queues": queues, "m": m, "skip": keys}).fetchone()[0]
            keys += more
            if not more or len(keys) >= max_units:
                break
        return sorted(keys)

    def _claim_limited(self, conn, cur, base: dict, max_units: int, names: list[str], keys: list[str]) -> list[dict]:
        """Claim while holding the advisory locks of the gates (limits and
        breakers) that have ready work, and of the keys of the first
        candidates (``keys``: a keyed limit's budgets, read and locked for
        those keys only, however many the store holds). A claim uses at most
        one place of each gate (a unit under a rate or a probing breaker is
        one task), so taking at most ``min(room)`` claims per statement never
        overfills one; a key's room is kept inside the statement (a candidate
        past its key's room is left). The tokens and probes taken are written
        back in the same transaction."""
        out: list[dict] = []
        with conn.transaction():
            conn.execute(self._q["limit_lock"], {"names": sorted({*names, *keys})})
            rows = cur.execute(self._q["limits"]).fetchall()  # by column name
            now = rows[0]["now"] if rows else conn.execute(self._q["tx_now"]).fetchone()[0]
            limits = {r["name"]: limit_state(r) for r in rows}
            free_cap = dict(conn.execute(self._q["limit_free"], {"names": names, "own": []}).fetchall())
            usage = {n: (limits[n].spec.concurrency or 0) - f for n, f in free_cap.items() if n in limits}
            if keys:
                for name, held, paused, tokens, at, starts, conc, rate, has_row in conn.execute(
                    self._q["key_usage"], {"names": keys}
                ):
                    usage[name] = held
                    if has_row:  # its own bucket, pause or values (a keyed adaptive limit's key learns its own)
                        spec = LimitSpec(name, concurrency=conc, rate=rate, paused_until=paused)
                        limits[name] = LimitState(spec, tokens, at, starts)
            breakers = self._breaker_rows(conn)
            gates = Gates(now, limits, usage, breakers)
            free = {n: gates.room(n) for n in names}
            room = {k: gates.room(k) for k in keys}
            solo = [n for n in (*names, *keys) if gates.solo((n,), "")] + [n for n in names if gates.solo((), n)]
            self._note_gate_wait(gates.wait)
            if (
                all(f <= 0 for f in free.values())
                and all(f <= 0 for f in room.values())
                and not conn.execute(self._q["unlimited_ready"], {"queues": base["queues"]}).fetchone()[0]
            ):
                self._save_gates(conn, gates)
                return out  # every gate is shut and nothing else waits: skip the claim
            remaining = max_units
            k = remaining
            # Keys in turn (the planner's rule, corral.core.claims): a key heads at
            # most one unit in a pass; a statement offers each key not yet served
            # in this pass one place, and the next statement leaves out the keys
            # it served. A pass ends when no other key has a candidate; a key
            # alone in its pass then takes the rest of its room at once.
            served: set[str] = set()
            took: set[str] = set()  # the keys served in this pass
            empty: set[str] = set()  # keys with no candidate left for this claim
            alone = False
            while remaining > 0 and k > 0:
                allowed = [n for n, f in free.items() if f >= k]
                open_keys = [n for n, f in room.items() if f > 0 and n not in served and n not in empty]
                params = {**base, "n": k, "allowed": allowed, "solo": solo}
                rooms = [room[n] if alone else 1 for n in open_keys]
                params.update(keys=open_keys, rooms=rooms)
                cur.execute(self._q["claim"], params)
                rows = cur.fetchall()
                out.extend(rows)
                got = len({r["lease_token"] for r in rows})
                remaining -= got
                used: dict[str, set[str]] = {}
                heads: dict[str, dict] = {}
                for r in rows:
                    for n in (*(r["limits"] or ()), r["name"]):
                        if n in free or n in room:
                            used.setdefault(n, set()).add(r["lease_token"])
                    heads.setdefault(r["lease_token"], r)
                for n, toks in used.items():
                    if n in free:
                        free[n] -= len(toks)
                    else:
                        room[n] -= len(toks)
                        served.add(n)
                        took.add(n)
                for r in heads.values():
                    gates.take(r["limits"] or (), r["name"])
                small = [f for f in free.values() if 0 < f < k]
                open_slots = [f for f in free.values() if f > 0]
                if got < k and not small:
                    if not got:
                        empty.update(open_keys)  # nothing of these keys in reach
                    if any(room[n] > 0 for n in open_keys if n not in served and n not in empty):
                        pass  # the keys not yet served in this pass: the next statement
                    elif took and any(room[n] > 0 for n in took):
                        # the next pass: the keys served in this one, once more each
                        alone = len(took) == 1 and not any(
                            room[n] > 0 for n in room if n not in took and n not in empty
                        )
                        served.clear()
                        took = set()
                    else:
                        break  # nothing more this allowed set can take
                k = min(remaining, min(open_slots)) if open_slots else remaining
            self._save_gates(conn, gates)
        return out

    def forget_keys(self, limit: int = 1000) -> int:
        """Under the keys' own locks (a claim charging a key holds its lock),
        so a row is never deleted under a claim that read it."""
        after = getattr(self, "_keys_after", "")
        n = max(1, limit)

        def go(conn):
            with conn.transaction():
                names = [r[0] for r in conn.execute(self._q["key_names_after"], {"after": after, "n": n})]
                if not names:
                    return names, 0
                conn.execute(self._q["limit_lock"], {"names": names})
                rows = conn.execute(self._q["limits"]).fetchall()
                now = rows[0][-1] if rows else conn.execute(self._q["tx_now"]).fetchone()[0]
                declared = {r[0]: limit_state(r).spec for r in rows}
                keys = [limit_state(r) for r in conn.execute(self._q["limit_key_rows"], {"names": names})]
                gone = [
                    k.spec.name for k in keys if key_at_rest(declared.get(k.spec.name.partition(KEY_SEP)[0]), k, now)
                ]
                if gone:  # a key whose controller saw a call lately keeps what it learned
                    live = conn.execute(self._q["key_controllers"], {"names": gone}).fetchall()
                    kept = {n for n, c in live if adp.key_live(c, now)}
                    gone = [n for n in gone if n not in kept]
                if gone:
                    conn.execute(self._q["forget_key_rows"], {"names": gone})
                return names, len(gone)

        names, gone = self._run(go)
        self._keys_after = names[-1] if len(names) >= n else ""
        return gone

    def _save_gates(self, conn, gates: Gates) -> None:
        keyed = []
        for name, c in gates.rate_writes().items():
            if KEY_SEP in name:  # the keys' rows in one statement, however many
                keyed.append([name, c.tokens, c.counted_at, c.starts])
            else:
                conn.execute(
                    self._q["limit_charge"], {"tokens": c.tokens, "at": c.counted_at, "starts": c.starts, "name": name}
                )
        if keyed:
            conn.execute(self._q["key_charges"], {"rows": json.dumps(keyed)})
        for name, (state, ev) in gates.breaker_writes().items():
            self._save_breaker(conn, name, state, ev)

    def _breaker_rows(self, conn) -> dict[str, BreakerRow]:
        rows = conn.execute(self._q["breakers"]).fetchall()
        self._breaker_names = frozenset(b.name for b in (breaker_row(r) for r in rows))
        self._breaker_names_until = time.monotonic() + BREAKER_NAMES_TTL
        return {(b := breaker_row(r)).name: b for r in rows}

    def _save_breaker(self, conn, name: str, state: brk.Breaker, ev: BreakerEvent | None) -> None:
        conn.execute(
            self._q["breaker_save"], {"state_name": state.state.value, "state": brk.state_to_json(state), "name": name}
        )
        if ev is not None:
            self._log_event(conn, ev)

    def _log_event(self, conn, ev: BreakerEvent) -> None:
        conn.execute(self._q["breaker_event"], asdict(ev))

    def heartbeat(self, tokens: Collection[str], lease_seconds: float) -> HeartbeatReply:
        tokens = list(tokens)
        if not tokens:
            return HeartbeatReply()
        rows = self._fetchall("heartbeat", {"tokens": tokens, "lease": float(lease_seconds)})
        held = {tok for _, tok, _ in rows}
        return HeartbeatReply(
            lost_tokens=set(tokens) - held,
            cancel_requested={tid for tid, _, flag in rows if flag},
        )

    def record_starts(self, starts: Sequence[Start]) -> int:
        if not starts:
            return 0
        rows = json.dumps([[st.task_id, st.token, st.attempt, st.started_at] for st in starts])
        return self._run(lambda conn: conn.execute(self._q["record_starts"], {"rows": rows}).rowcount)

    def cancel_requested(self, task_ids: Collection[int]) -> set[int]:
        if not task_ids:
            return set()
        return {tid for (tid,) in self._fetchall("cancel_requested", {"ids": sorted(task_ids)})}

    def complete(self, outcomes: Sequence[Outcome]) -> list[bool]:
        outcomes = texts.safe_outcomes(outcomes)
        if not outcomes:
            return []
        try:
            rows = self._run(lambda conn: self._complete_rows(conn, outcomes))
        except _RefusedData:
            # One row holds a value the database refuses: write the batch
            # row by row, so that row alone fails and the others are kept.
            rows = self._complete_each(outcomes)
        return self._after_complete(outcomes, rows)

    def _complete_rows(self, conn, outcomes: list[Outcome]) -> list:
        try:
            rows = conn.execute(self._q["complete"], _complete_params(outcomes, hush=False)).fetchall()
        except psycopg.DataError as exc:
            raise _RefusedData(f"{type(exc).__name__}: {first_line(exc)}") from None
        self._settle_after(conn, outcomes, rows)
        return rows

    def _complete_each(self, outcomes: list[Outcome]) -> list:
        """The complete statement's rows for each outcome written alone; one
        the database refuses is written as FAILED with the reason instead
        (the outcome is changed to say so), or, if even that is refused, not
        at all (its lease runs out and the sweeper takes it)."""
        rows: list = []
        for i, o in enumerate(outcomes):
            alone = functools.partial(self._complete_rows, outcomes=[o])
            try:
                got = self._run(alone)
            except _RefusedData as exc:
                log.warning("task %s: its outcome could not be stored (%s); writing it as FAILED", o.task_id, exc)
                texts.refused(o, str(exc))
                try:
                    got = self._run(alone)
                except _RefusedData:
                    continue
            rows += [(i + 1, ended, notified, name, limits) for _, ended, notified, name, limits in got]
        return rows

    hands_over = True
    keys_hand_over = False  # a claim charging a key holds its lock (claim_simple)

    def complete_and_claim(
        self,
        outcomes: Sequence[Outcome],
        places: Sequence[Collection[str]],
        worker_id: str,
        request: ClaimRequest,
        *,
        relays: Sequence[tuple[str, Collection[str]]] = (),
    ) -> tuple[list[bool], list[Claim]]:
        outcomes = texts.safe_outcomes(outcomes)
        relayed = [(t, h) for t, h in relays if h and not any(KEY_SEP in x for x in h)]
        keyed = sum(1 for p in places if any(KEY_SEP in x for x in p))
        if keyed == len(places) and not relayed:
            # A key's place never passes over (a claim holds the key's lock to
            # charge it): the outcomes alone, and the dispatcher claims while
            # the next ones are written, as for work under no limit.
            return self.complete(outcomes), []
        params = _complete_params(outcomes, hush=True)
        base = _claim_params(worker_id, request)
        kinds: dict[tuple[str, ...], int] = {}
        for p in places:  # one claim per set of limits: a successor fits the places of its set
            key = tuple(sorted(set(p)))
            kinds[key] = kinds.get(key, 0) + 1

        def allowed_of(conn, limits: tuple[str, ...], n: int, own: list[str]) -> list[str]:
            if not limits:
                return []
            args = {
                "names": list(limits),
                "n": n,
                "own": own,
                "queues": base["queues"],
                "all_names": base["all_names"],
                "task_names": base["names"],
            }
            return [r[0] for r in conn.execute(self._q["handoff_allowed"], args)]

        def go(conn):
            with conn.transaction():
                rows = conn.execute(self._q["complete"], params).fetchall() if outcomes else []
                got: list[dict] = []
                left_free = False  # a place not passed over: the workers must hear of it
                cur = conn.cursor(row_factory=dict_row)
                for limits, n in sorted(kinds.items()):
                    if any(KEY_SEP in x for x in limits):
                        continue
                    allowed = allowed_of(conn, limits, n, [])
                    left_free = left_free or len(allowed) < len(limits)
                    cur.execute(self._q["claim"], {**base, "n": n, "allowed": allowed})
                    got += cur.fetchall()
                if keyed or left_free or len({r["lease_token"] for r in got}) < len(places) - keyed:
                    conn.execute(self._q["notify"], {"queue": ""})
                for token, held in relayed:
                    # the place stays with the predecessor unless every limit may pass it on
                    key = tuple(sorted(set(held)))
                    if len(allowed_of(conn, key, 1, [token])) == len(key):
                        cur.execute(self._q["claim"], {**base, "n": 1, "allowed": list(key), "relay": token})
                        got += cur.fetchall()
            self._settle_after(conn, outcomes, rows)
            return rows, got

        rows, got = self._run(go)
        return self._after_complete(outcomes, rows), _as_claims(got)

    def _settle_after(self, conn, outcomes: list[Outcome], rows: list) -> None:
        """Settle the dependents of the outcomes that ended their task: in a
        statement of its own (a fresh snapshot), after the rows committed; if
        it fails, sweep() settles those dependents later."""
        settle = [outcomes[pos - 1].task_id for pos, ended_upstream, _, _, _ in rows if ended_upstream]
        if settle:
            try:
                self._settle(conn, settle)
            except psycopg.Error:
                pass

    def _after_complete(self, outcomes: list[Outcome], rows: list) -> list[bool]:
        self._feed_breakers(outcomes, rows)
        applied = {pos for pos, _, _, _, _ in rows}
        return [i + 1 in applied for i in range(len(outcomes))]

    def _feed_breakers(self, outcomes: list[Outcome], rows: list) -> None:
        """Count the applied outcomes of tasks under a breaker (their name or a
        limit), under the breakers' locks; nothing to do, and no round trip,
        when no breaker is declared."""
        if time.monotonic() >= self._breaker_names_until:
            self._run(self._breaker_rows)
        known = self._breaker_names
        if not known:
            return
        feed = []
        for pos, _, _, name, limits in rows:
            gate_names = (name, *(limits or ()))
            if any(n in known for n in gate_names):
                feed.append((gate_names, outcomes[pos - 1].breaker_failure))
        if not feed:
            return
        names = sorted({n for g, _ in feed for n in g if n in known})

        def go(conn):
            with conn.transaction():
                conn.execute(self._q["limit_lock"], {"names": names})
                now = conn.execute(self._q["limits"]).fetchone()
                at = now[len(LIMIT_COLUMNS)] if now else conn.execute(self._q["tx_now"]).fetchone()[0]
                changed, events = record_outcomes(self._breaker_rows(conn), feed, at)
                for name, state in changed.items():
                    self._save_breaker(conn, name, state, None)
                for ev in events:
                    self._log_event(conn, ev)

        self._run(go, retry=False)

    def set_progress(self, task_id: int, token: str, fraction: float, message: str | None) -> bool:
        message = texts.progress_message(message)
        return (
            self._rowcount(
                "set_progress", {"id": task_id, "token": token, "fraction": float(fraction), "message": message}
            )
            == 1
        )

    def save_checkpoint(self, task_id: int, token: str, stage: str, data_json: str) -> bool:
        value = json.loads(data_json)

        def go(conn):
            with conn.transaction():
                row = conn.execute(self._q["get_checkpoint"], {"id": task_id, "token": token}).fetchone()
                if row is None:
                    return False
                (checkpoint,) = row
                data = json.loads(checkpoint) if checkpoint else {}
                data.pop(stage, None)  # last stage last
                data[stage] = value
                cur = conn.execute(
                    self._q["set_checkpoint"], {"id": task_id, "token": token, "checkpoint": dumps(data)}
                )
                return cur.rowcount == 1

        return self._run(go)

    # ---- LISTEN/NOTIFY ----------------------------------------------------------
    # The dispatcher waits on the listening connection itself and claims on
    # that same connection between its waits: no hand-over from a listener
    # thread, the server process that just sent a notification is awake (an
    # idle one takes 0.2-0.5 ms to wake on a small machine), and claims do not
    # queue for the pool behind the completer. A
    # second thread of the process that waits meanwhile is woken through
    # _cond by the one listening, or by its own timeout.
    def wake_waiters(self) -> None:
        self._wakes += 1
        self._bump()

    def _bump(self) -> None:
        with self._cond:
            self._gen += 1
            self._cond.notify_all()

    def _drop_listen_conn(self) -> None:
        conn, self._listen_conn = self._listen_conn, None
        _close_quietly(conn)

    def _drop_events_conn(self) -> None:
        conn, self._events_conn = self._events_conn, None
        _close_quietly(conn)

    def _run_listening(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn`` on the listening connection if no thread waits on it (the
        dispatcher claims between its waits there), else on a pooled one.

        Claims then never queue for the pool behind the completer's writes
        and the heartbeat: with two pooled connections, a quarter of pool
        requests queued in a busy worker, 1.4 ms each. A notification that
        arrives meanwhile is kept by the connection for the next wait."""
        if not self._listen_lock.acquire(blocking=False):
            return self._run(fn)
        try:
            conn = self._listen_conn
            if conn is not None:
                try:
                    return fn(conn)
                except psycopg.Error:
                    self._drop_listen_conn()  # broken or in doubt: the pool runs it again
        finally:
            self._listen_lock.release()
        return self._run(fn)

    def wait_for_work(self, timeout: float, queues: Collection[str] | None = None) -> None:
        self._wait(timeout)

    def wait_offering(
        self, timeout: float, queues: Collection[str], offer: Offer, take: Callable[[list[Claim]], None]
    ) -> None:
        self._wait(timeout, offer, take)

    def _wait(
        self, timeout: float, offer: Offer | None = None, take: Callable[[list[Claim]], None] | None = None
    ) -> None:
        """The wait for work; the thread waiting on the listening connection
        opens ``offer`` for the wait and passes each task handed over under
        it to ``take`` as it comes (other threads offer nothing).

        The offer stays open through its hand-overs until its slots are all
        taken: one that closed after each task (to be opened again after the
        worker's next claim, two round trips later) sent the next submits
        of a steady stream to the queue and woke every worker for them, so
        most tasks waited for a submit's commit and a claim's, not one."""
        if self._closed:
            return
        timeout = self._gate_timeout(timeout)
        seen = getattr(self._local, "seen", None)
        if not self._listen_lock.acquire(blocking=False):
            # another thread of this process listens: wait for its word
            deadline = time.monotonic() + max(0.0, timeout)
            with self._cond:
                start = self._gen if seen is None else seen
                while self._gen == start and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                self._local.seen = self._gen
            return
        woken: bool | None = False
        opened: _OpenOffer | None = None  # the offer open now, until withdrawn or spent
        try:
            if not self._listening:
                woken = None
            elif self._listen_conn is None:
                self._listen_conn = psycopg.connect(self._dsn, **self._conn_kwargs)
                if self._pooler == "session":  # claims run here too: the same settings as the pool's
                    _set_session_options(self._listen_conn)
                why = self._start_listening(self._listen_conn)
                if why is not None:
                    log.warning("%s: %s; polling for work every %g s instead", self._shown, why, POLL_WITHOUT_LISTEN)
                    self._listening = False
                    self._drop_listen_conn()
                woken = True  # work may have come before we listened: look now
            else:
                # notifications that came while no thread waited here are kept
                # by the connection and returned at once; the wait goes in
                # slices, so wake_waiters() ends it within one
                wakes = self._wakes
                deadline = time.monotonic() + max(0.0, timeout)
                if offer is not None and take is not None and offer.slots > 0 and timeout > 0:
                    opened = _OpenOffer(offer.worker_id, int(offer.slots), take, next(self._offer_numbers))
                    old = self._offer_rows.get(offer.worker_id)
                    self._listen_conn.execute(self._q["offer"], self._offer_params(offer, timeout, opened.n, old))
                    self._offer_rows[offer.worker_id] = opened.n
                while not woken and self._wakes == wakes:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    for note in self._listen_conn.notifies(timeout=min(left, WAKE_SLICE), stop_after=1):
                        if note.channel == self._offer_channel:
                            woken = self._handed_over(note.payload, opened)
                        else:
                            if note.channel == CHANNEL and note.payload.endswith(":g"):
                                self._end_plain()
                            woken = True
                if opened is not None and not opened.spent:
                    self._withdraw(self._listen_conn, opened)
                opened = None
        except psycopg.Error:
            self._drop_listen_conn()
            woken = None
        finally:
            self._listen_lock.release()
            if opened is not None and not opened.spent:  # the listening connection broke meanwhile
                try:
                    self._run(lambda conn: self._withdraw(conn, opened))
                except StoreError:
                    pass  # the server is away: the offer expires, its tasks' leases too
        if woken is None:
            # not listening (poll briefly), or the server is away (poll meanwhile);
            # close() ends the wait
            with self._cond:
                if not self._closed:
                    self._cond.wait(min(max(0.0, timeout), 0.2 if self._listening else POLL_WITHOUT_LISTEN))
            return
        if woken:
            self._bump()
        self._local.seen = self._gen

    def _offer_params(self, offer: Offer, timeout: float, n: int, old: int | None) -> dict[str, Any]:
        return {
            "worker": offer.worker_id,
            "n": n,
            "old": old,
            "channel": self._offer_channel,
            "queues": text_array(offer.queues),
            "all_names": offer.names is None,
            "names": text_array(offer.names or ()),
            # every free slot: each task handed over rides in its own
            # notification, and the offer stays open for the next one
            "free": int(offer.slots),
            "lease": float(offer.lease_seconds),
            # a worker that died waiting is handed nothing for long (what it
            # was handed comes back when its lease ends)
            "ttl": timeout + OFFER_GRACE,
        }

    def _handed_over(self, payload: str, opened: _OpenOffer | None) -> bool:
        """A note on this store's offer channel: pass the task it carries to
        the open offer's taker. True when the wait ends: the offer is spent
        (no slot left to offer), or the task was too big to ride along and
        is read back by the withdraw. A note of a task an earlier withdraw
        read back is no news."""
        if opened is None:
            return False  # read back by the last withdraw; its note came after
        if not payload.startswith("{"):
            return True  # too big for a notification: the withdraw reads it back
        row = self._carried(payload, opened.worker_id)
        if row is None:
            return False
        opened.received.add(row["id"])
        opened.take(_as_claims([row]))
        return opened.spent

    def _carried(self, payload: str, worker_id: str) -> dict | None:
        """The task row a handing-over submit sent in its notification, or
        None when it is not (or no longer) this offer's: one read back by an
        earlier withdraw still has its notification queued."""
        try:
            row = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(row, dict) or row.get("worker_id") != worker_id or row.get("id") in self._read_back:
            return None
        return row

    def _withdraw(self, conn, opened: _OpenOffer) -> None:
        """End the offer; what was handed over under it and not received in
        a notification yet is read back and passed to its taker."""
        cur = conn.cursor(row_factory=dict_row)
        rows = cur.execute(
            self._q["offer_withdraw"], {"worker": opened.worker_id, "n": opened.n, "taken": sorted(opened.received)}
        ).fetchall()
        if self._offer_rows.get(opened.worker_id) == opened.n:
            del self._offer_rows[opened.worker_id]
        given = set(rows[0]["offer_given"]) if rows else set()
        for r in rows:
            del r["offer_given"]
        found = [r for r in rows if r["id"] is not None]  # (one row of NULLs when none was found)
        missing = given - opened.received - {r["id"] for r in found}
        if missing:
            found += cur.execute(
                self._q["offer_given"], {"ids": sorted(missing), "worker": opened.worker_id}
            ).fetchall()
        for task_id in given - opened.received:
            self._read_back[task_id] = None
        while len(self._read_back) > READ_BACK_KEPT:
            del self._read_back[next(iter(self._read_back))]
        opened.received.update(given)
        if found:
            opened.take(_as_claims(found))

    def _start_listening(self, conn) -> str | None:
        """LISTEN on ``conn`` and check that a notification sent from another
        session comes back; returns why not, or None when it does. Behind a
        transaction pooler LISTEN runs on some server session that is handed
        to another client at once, so nothing would ever wake this store."""
        try:
            conn.execute(f"LISTEN {CHANNEL}")
            conn.execute(f"LISTEN {self._offer_channel}")
            probe = f"corral_check_{uuid.uuid4().hex[:16]}"
            conn.execute(f"LISTEN {probe}")
        except psycopg.OperationalError as exc:
            if _is_outage(exc):
                raise
            return f"LISTEN failed ({first_line(exc)})"
        except psycopg.Error as exc:
            return f"LISTEN failed ({first_line(exc)})"
        self._send_check(probe)
        deadline = time.monotonic() + LISTEN_CHECK_SECONDS
        came = False
        while not came and (left := deadline - time.monotonic()) > 0:
            for note in conn.notifies(timeout=left, stop_after=1):
                came = came or note.channel == probe
                if note.payload.endswith(":g"):
                    self._end_plain()
        conn.execute(f"UNLISTEN {probe}")
        if not came:
            return f"a test notification did not come back within {LISTEN_CHECK_SECONDS:g} s (a transaction pooler?)"
        return None

    def _send_check(self, channel: str) -> None:
        """Send the listening check's notification from a pooled session."""
        self._run(lambda conn: conn.execute(f"NOTIFY {channel}"))

    # ---- operators ---------------------------------------------------------------
    def get(self, task_id: int) -> TaskRecord | None:
        rows = self._fetchall("get", {"id": task_id}, dicts=True)
        return shown_record(_record(rows[0])) if rows else None

    def line_head(self, group: str) -> TaskRecord | None:
        rows = self._fetchall("line_head", {"group": group}, dicts=True)
        return shown_record(_record(rows[0])) if rows else None

    def _names_param(self, names: Sequence[str]) -> Any:
        return list(names)

    def list_tasks(self, flt: TaskFilter) -> list[TaskRecord]:
        sql, params = _list_sql("SELECT * FROM corral_tasks", flt)

        def go(conn):
            cur = conn.cursor(row_factory=dict_row)
            return [shown_record(_record(r)) for r in cur.execute(sql, params).fetchall()]

        return self._run(go)

    def task_ids(self, flt: TaskFilter) -> list[int]:
        sql, params = _list_sql("SELECT id FROM corral_tasks", flt, whole=True)
        return self._run(lambda conn: [tid for (tid,) in conn.execute(sql, params).fetchall()])

    def finished_runs(self, start: float, end: float, limit: int) -> list[FinishedRun]:
        params = {"start": start, "end": end, "limit": max(0, int(limit))}
        return [FinishedRun(**r) for r in self._fetchall("finished_runs", params, dicts=True)]

    def save_minute_stats(self, rows: Sequence[MinuteStat], before: float) -> None:
        def go(conn):
            with conn.transaction():
                if rows:
                    conn.cursor().executemany(self._q["save_minute_stat"], [asdict(r) for r in rows])
                conn.execute(self._q["trim_minute_stats"], {"before": int(before)})

        self._run(go)

    def minute_stats(self, since: float) -> list[MinuteStat]:
        return [MinuteStat(**r) for r in self._fetchall("minute_stats", {"since": int(since)}, dicts=True)]

    def held_tasks(
        self, worker: str | None = None, limit: int = 1000, after: tuple[str, int] | None = None
    ) -> list[TaskRecord]:
        sql = "SELECT * FROM corral_tasks WHERE status = 'RUNNING'"
        params: dict[str, Any] = {"limit": max(0, int(limit))}
        if worker is not None:
            sql += " AND worker_id = %(worker)s"
            params["worker"] = worker
        if after is not None:
            sql += " AND (worker_id, id) > (%(after_worker)s, %(after_id)s)"
            params["after_worker"], params["after_id"] = after
        sql += " ORDER BY worker_id, id LIMIT %(limit)s"

        def go(conn):
            cur = conn.cursor(row_factory=dict_row)
            return [shown_record(_record(r)) for r in cur.execute(sql, params).fetchall()]

        return self._run(go)

    def counts(self, queue: str | None = None) -> dict[str, int]:
        if queue is None:
            rows = self._fetchall("counts")
        else:
            rows = self._fetchall("counts_queue", {"queue": queue})
        return shown_counts({status: n for status, n in rows})

    def backlog(self, at_most: int) -> int | None:
        return self._value("backlog", {"n": max(0, at_most)})

    def queue_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for queue, status, n in self._fetchall("queue_counts"):
            per = out.setdefault(queue, {})
            per[status] = per.get(status, 0) + n
        return out

    def group_lines(self, limit: int = 50, offset: int = 0) -> list[GroupLine]:
        rows = self._fetchall("group_lines", {"limit": max(0, limit), "offset": max(0, offset)}, dicts=True)
        return [GroupLine(**r) for r in rows]

    def batch_list(self, after: str | None = None, limit: int = 20) -> list[tuple[str, dict[str, int]]]:
        def go(conn):
            names = [name for (name,) in conn.execute(self._q["batch_names"], {"after": after or "", "limit": limit})]
            if after is None and limit > 0 and conn.execute(self._q["batch_empty_name"]).fetchone():
                names = [""] + names[: limit - 1]  # '' itself is a name: min(batch) > '' skips it
            per: dict[str, dict[str, int]] = {b: {} for b in names}
            for b, status, n in conn.execute(self._q["batch_status_counts"], {"batches": names}):
                per[b][status] = n
            return [(b, shown_counts(per[b])) for b in names]

        return self._run(go)

    def recent_finished(self, since: float, limit: int, *, newest_first: bool = False) -> list[FinishedTask]:
        q = "recent_finished_desc" if newest_first else "recent_finished"
        return [FinishedTask(**r) for r in self._fetchall(q, {"since": since, "limit": max(0, limit)}, dicts=True)]

    def finished_counts(self, since: float, until: float) -> list[tuple[float, str, int]]:
        rows = self._fetchall("finished_counts", {"since": since, "until": until})
        return [(float(m), st, int(n)) for m, st, n in rows]

    def active_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for status, n in self._fetchall("active_counts"):
            if n:
                out[status] = out.get(status, 0) + n
        return out

    def cancel(self, task_id: int) -> TaskRecord | None:
        def go(conn):
            with conn.transaction():
                conn.execute(self._q["lock_group_of"], {"id": task_id})
                row = conn.execute(self._q["cancel_queued"], {"id": task_id}).fetchone()
                if row is not None:
                    _, queue, group = row
                    self._settle(conn, [task_id])
                    if group is not None:  # the next task of its group may start
                        conn.execute(self._q["notify"], {"queue": queue})
                else:
                    conn.execute(self._q["cancel_running"], {"id": task_id})

        self._run(go)
        return self.get(task_id)

    def retry(self, task_id: int) -> bool:
        def go(conn):
            with conn.transaction():
                conn.execute(self._q["lock_group_of"], {"id": task_id})
                row = conn.execute(self._q["retry"], {"id": task_id}).fetchone()
                if row is not None:
                    _, queue = row
                    conn.execute(self._q["notify"], {"queue": queue})
                return row is not None

        return self._run(go)

    # ---- dead letters ------------------------------------------------------------
    def dead_letters(
        self, batch: str | None = None, limit: int = 100, offset: int = 0, *, after_id: int | None = None
    ) -> list[TaskRecord]:
        params = {"batch": batch, "limit": max(0, limit), "offset": max(0, offset), "after": max(0, after_id or 0)}
        q = "dead_letters" if batch is None else "dead_letters_batch"
        return [shown_record(_record(r)) for r in self._fetchall(q, params, dicts=True)]

    def retry_dead(self, batch: str | None = None, limit: int = 10_000) -> list[int]:
        def go(conn):
            with conn.transaction():
                q = self._q["dead_ids" if batch is None else "dead_ids_batch"]
                rows = conn.execute(q, {"batch": batch, "limit": max(0, limit)}).fetchall()
                if not rows:
                    return []
                groups = sorted({g for _, g in rows if g is not None})
                if groups:
                    conn.execute(self._q["lock_groups"], {"groups": groups}).fetchall()
                done = conn.execute(self._q["retry_many"], {"ids": [i for i, _ in rows]}).fetchall()
                for queue in sorted({q for _, q in done}):
                    conn.execute(self._q["notify"], {"queue": queue})
                return sorted(i for i, _ in done)

        return self._run(go)

    def failing_kinds(self, since: float, in_a_row: int, scan: int = 500) -> list[str]:
        params = {"since": float(since), "n": max(1, in_a_row), "scan": max(0, scan)}
        return [name for (name,) in self._fetchall("failing_kinds", params)]

    # ---- fleet control ------------------------------------------------------------
    def fleet_level(self) -> FleetLevel:
        rows = self._fetchall("fleet_level")
        if not rows:
            return FleetLevel()
        level, manual, calm_since, reason, changed_at = rows[0]
        return FleetLevel(level, bool(manual), calm_since, reason, changed_at)

    def set_fleet_level(self, new: FleetLevel, *, auto: bool, event: str | None = None) -> bool:
        params = {
            "level": int(new.level),
            "manual": bool(new.manual),
            "calm_since": new.calm_since,
            "reason": new.reason,
            "auto": bool(auto),
        }

        def go(conn):
            with conn.transaction():
                if conn.execute(self._q["set_fleet_level"], params).fetchone() is None:
                    return False
                if event is not None:
                    conn.execute(self._q["add_event"], {"kind": "level", "subject": "fleet", "data": event})
                return True

        return self._run(go)

    def add_event(self, kind: str, subject: str, data: str) -> int:
        ((event_id, _),) = self._fetchall("add_event", {"kind": kind, "subject": subject, "data": data})
        return int(event_id)

    def events(self, kind: str | None = None, limit: int = 100) -> list[Event]:
        return [Event(**r) for r in self._fetchall("events", {"kind": kind, "limit": max(0, limit)}, dicts=True)]

    def event_cursor(self, since: int | None) -> Any:
        """A cursor is (the highest id delivered, the ids below it not seen
        yet with the snapshot's xmax when each was first missed)."""
        if since is not None:
            return (int(since), ())
        hi, present, xmax = self._fetchall("stream_now")[0]
        have = set(present or ())
        low = min(have) if have else hi
        return (int(hi), tuple((i, int(xmax)) for i in range(low + 1, hi) if i not in have))

    def read_events(self, cursor: Any, limit: int = 500) -> tuple[list[Event], Any]:
        """Events by id, and ids skipped earlier once their transaction
        commits. An id missing below the highest delivered one belongs to a
        transaction still open (or rolled back): it is asked for again until
        every transaction that held an id when it was first missed has ended
        (snapshot xmin at or past that xmax). Every transaction that writes an
        event holds its id before it takes the event's number."""
        hi, gaps = cursor
        noted = dict(gaps)
        rows = self._fetchall("read_events", {"hi": int(hi), "gaps": sorted(noted), "limit": max(0, limit)})
        _, _, _, _, _, xmin, xmax = rows[0]  # every row holds the snapshot's bounds, even with no event
        xmin, xmax = int(xmin), int(xmax)
        out = [Event(i, at, kind, subject, data) for i, at, kind, subject, data, _, _ in rows if i is not None]
        got = {e.id for e in out}
        new_hi = max([hi, *got])
        if len(out) >= limit:  # the page ended: ids past its last one are not missed, only unread
            new_hi = max([hi, *(i for i in got if i not in noted)])
        pending = {i: x for i, x in noted.items() if i not in got and xmin < x}
        for i in range(hi + 1, new_hi):
            if i not in got:
                pending[i] = xmax
        if len(pending) > MAX_EVENT_GAPS:  # a flood of rolled-back writes: keep the newest
            pending = dict(sorted(pending.items())[-MAX_EVENT_GAPS:])
        return out, (new_hi, tuple(sorted(pending.items())))

    def wait_for_events(self, timeout: float) -> None:
        """Wait on a connection listening to ``corral_events`` and
        ``corral_work`` (one per store instance, opened at the first wait), at
        most ``EVENTS_POLL`` seconds."""
        timeout = min(max(0.0, timeout), EVENTS_POLL)
        with self._events_lock:
            try:
                if self._events_conn is None:
                    self._events_conn = psycopg.connect(
                        self._dsn, autocommit=True, connect_timeout=max(1, int(self._connect_timeout))
                    )
                    self._events_conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    self._events_conn.execute(f"LISTEN {CHANNEL}")  # submits wake followers too
                    return  # events may have come before we listened: look now
                for _ in self._events_conn.notifies(timeout=timeout, stop_after=1):
                    pass
                return
            except psycopg.Error:
                self._drop_events_conn()
        time.sleep(timeout)  # the server is away: poll meanwhile

    def trim_events(self, keep: int, before: float, limit: int | None = None) -> int:
        """Move the floor past what the rules trim (no row is deleted: see
        migration_0049); once it stops moving (a batch short of ``limit``),
        empty the partitions wholly below it."""
        params = {"keep": max(0, keep), "before": float(before), "max": None if limit is None else limit}

        def go(conn):
            with conn.transaction():
                conn.execute(self._q["events_trim_lock"])
                return conn.execute(self._q["trim_events"], params).fetchone()

        n, _ = self._run(go)
        if limit is None or n < limit:
            self.reclaim_events()
        return int(n)

    def reclaim_events(self) -> int:
        """Empty (TRUNCATE) the event partitions whose rows are all trimmed,
        each in a transaction of its own that waits ``EVENTS_TRUNCATE_WAIT`` at
        most for the partition's lock (a reader holding it); one not had is
        left for the next trim. Returns how many were emptied."""
        emptied = 0
        for (part,) in self._fetchall("events_spent"):

            def go(conn, part=part):
                try:
                    with conn.transaction():
                        wait_ms = max(1, round(EVENTS_TRUNCATE_WAIT * 1000))
                        params = {"part": part, "wait_ms": wait_ms}
                        return conn.execute(self._q["events_truncate"], params).fetchone()[0]
                except psycopg.errors.LockNotAvailable:
                    log.debug("%s: event partition %s is in use; emptied at a later trim", self._shown, part)
                    return False

            emptied += bool(self._run(go))
        return emptied

    def has_schema(self) -> bool:
        return bool(self._value("has_schema"))

    def prune(self, before: Mapping[str, float], limit: int) -> int:
        params = prune_params(before, limit)
        if params is None:
            return 0
        return int(self._value("prune", params))

    def _read_all(self, reads: Sequence[Read]) -> list[list[Any]]:
        def go(conn):
            with conn.transaction():
                return [conn.execute(self._q[name], params).fetchall() for name, params in reads]

        return self._run(go)

    # ---- limits -------------------------------------------------------------------
    def set_batch(self, batch: str, on_complete: str | None) -> None:
        self._rowcount("set_batch", {"name": batch, "on_complete": on_complete})

    def settle_batches(self, batches: Collection[str] | None = None, limit: int = 100) -> list[int]:
        names = None if batches is None else sorted(set(batches))
        if names == []:
            return []
        candidates = [b for (b,) in self._fetchall("batches_unsettled", {"names": names, "limit": int(limit)})]
        submitted: list[int] = []
        for name in candidates:  # one short transaction per batch: a lock held for one batch only

            def go(conn, name=name):
                with conn.transaction():
                    row = conn.execute(self._q["batch_lock_unsettled"], {"name": name}).fetchone()
                    if row is None or conn.execute(self._q["batch_active"], {"batch": name}).fetchone():
                        return None
                    counts_rows = conn.execute(self._q["batch_counts"], {"batch": name}).fetchall()
                    durations = conn.execute(self._q["batch_durations"], {"batch": name}).fetchall()
                    summary = summary_from_rows(name, counts_rows, durations)
                    if summary.status not in FINAL_BATCH:
                        return None
                    (on_complete,) = row
                    plan = _SubmitPlan([callback_task(name, on_complete, summary.as_dict())])
                    (res,) = plan.results(self._submit_on(conn, plan, None))
                    conn.execute(self._q["batch_settle"], {"id": res.id, "name": name})
                    return res.id

            tid = self._run(go)
            if tid is not None:
                submitted.append(tid)
        return submitted

    def set_limit(self, spec: LimitSpec) -> LimitSpec:
        def go(conn):
            with conn.transaction():
                conn.execute(self._q["limit_lock"], {"names": [spec.name]})
                old = self._limit_row(conn, spec.name)
                return self._write_limit(conn, old, limit_rules.declare(old, spec), "declare", "app")

        return self._run(go)

    def change_limit(self, name: str, changes: Mapping[str, Any], *, by: str, reset: bool = False) -> LimitSpec:
        def go(conn):
            with conn.transaction():
                conn.execute(self._q["limit_lock"], {"names": [name]})
                old = self._limit_row(conn, name) if KEY_SEP not in name else None
                if old is None:
                    names = (n for (n,) in conn.execute(self._q["limit_names"]).fetchall())
                    raise limit_rules.unknown(name, names)
                after = limit_rules.change(old, changes, by, reset=reset)
                return self._write_limit(conn, old, after, "reset" if reset else "set", by)

        return self._run(go, retry=False)

    def _limit_row(self, conn, name: str) -> LimitSpec | None:
        row = conn.execute(self._q["limit_row"], {"name": name}).fetchone()
        return None if row is None else limit_state(row).spec

    def _write_limit(self, conn, old: LimitSpec | None, spec: LimitSpec, action: str, by: str) -> LimitSpec:
        """The row core.limits decided, its keys' rows (a keyed limit's
        budgets carry its settings), its event if anything changed, and a
        notification: a raised limit frees places for waiting work."""
        (now,) = conn.execute(self._q["tx_now"]).fetchone()
        changed = old is None or old.settings() != spec.settings()
        params = limit_params(spec, now if changed else None)
        if changed:  # a changed rate: the keys' buckets full again (read before the row changes)
            conn.execute(self._q["set_limit_keys"], params)
        conn.execute(self._q["set_limit"], params)
        conn.execute(self._q["clear_adaptive_keys"], {"prefix": keyed_name(spec.name, "")})  # fixed: none learned
        if changed:
            conn.execute(self._q["notify"], {"queue": ""})
        data = limit_rules.event_data(action, by, old, spec)
        if data is not None:
            conn.execute(
                self._q["add_event"], {"kind": LIMIT_EVENT, "subject": limit_rules.subject(spec.name), "data": data}
            )
        return replace(spec, changed_at=now if changed else spec.changed_at)

    # ---- pauses by hand -------------------------------------------------------------
    def pause(self, kind: str, name: str, by: str = "") -> bool:
        def go(conn):
            with conn.transaction():
                if conn.execute(self._q["pause"], {"kind": kind, "name": name, "by": by}).fetchone() is None:
                    return False
                ekind, subject, data = pause_event(kind, name, True, by)
                conn.execute(self._q["add_event"], {"kind": ekind, "subject": subject, "data": data})
                return True

        return self._run(go)

    def resume(self, kind: str, name: str, by: str = "") -> bool:
        def go(conn):
            with conn.transaction():
                if conn.execute(self._q["resume"], {"kind": kind, "name": name}).fetchone() is None:
                    return False
                ekind, subject, data = pause_event(kind, name, False, by)
                conn.execute(self._q["add_event"], {"kind": ekind, "subject": subject, "data": data})
                # every waiting worker looks again (":g": off its fast path too)
                conn.execute(self._q["notify"], {"queue": ""})
                return True

        return self._run(go)

    def pauses(self) -> list[Pause]:
        return sorted((Pause(**r) for r in self._fetchall("pauses", dicts=True)), key=pause_order)

    # ---- adaptive limits ------------------------------------------------------------
    def declare_adaptive(self, limit: LimitSpec, spec: adp.AdaptiveSpec) -> None:
        def go(conn):
            with conn.transaction():
                conn.execute(self._q["limit_lock"], {"names": [limit.name]})
                rows = conn.execute(self._q["adaptive_limit_lock"], {"name": limit.name}).fetchall()
                old = adaptive_row(rows[0]) if rows else None
                conc, rate = adp.declared(old, spec, limit.concurrency, limit.rate)
                params = {"name": limit.name, "concurrency": conc, "rate": rate, "burst": limit.burst}
                conn.execute(
                    self._q["declare_adaptive"], {**params, "adaptive": spec.to_json(), "per_key": limit.per_key}
                )
                conn.execute(self._q["notify"], {"queue": ""})

        self._run(go)

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
        def go(conn):
            with conn.transaction():
                params = {"name": name, "holder": holder, "role": role, "state": state}
                saved = conn.execute(self._q["save_adaptive"], {**params, "concurrency": concurrency, "rate": rate})
                if saved.rowcount != 1:
                    return False
                if event is not None:
                    data = {"kind": LIMIT_ADAPTED, "subject": f"limit:{name}", "data": event}
                    conn.execute(self._q["add_event"], data)
                # a raised limit may free places for waiting work
                conn.execute(self._q["notify"], {"queue": ""})
                return True

        return self._run(go)

    def adaptive_keys(self, limit: str) -> dict[str, str]:
        rows = self._run(
            lambda conn: conn.execute(self._q["adaptive_keys"], {"prefix": keyed_name(limit, "")}).fetchall()
        )
        return {key: controller for key, controller in rows}

    def save_adaptive_keys(
        self,
        limit: str,
        holder: str,
        role: str,
        keys: Mapping[str, tuple[str | None, int | None, str | None]],
        events: Mapping[str, str] | None = None,
    ) -> bool:
        names = {keyed_name(limit, key): v for key, v in keys.items()}
        said = [
            {"kind": LIMIT_KEY_ADAPTED, "subject": limit_key_subject(limit, key), "data": data}
            for key, data in (events or {}).items()
        ]

        def go(conn):
            with conn.transaction():
                if conn.execute(self._q["leads_now"], {"role": role, "holder": holder}).fetchone() is None:
                    return False
                if not any(r[0] == limit for r in conn.execute(self._q["adaptive_limits"])):
                    return False  # (no row lock: a claim holding a key's lock may write the limit's row)
                if names:
                    conn.execute(self._q["limit_lock"], {"names": sorted(names)})
                    rows = [[n, state, conc, rate] for n, (state, conc, rate) in sorted(names.items())]
                    conn.execute(self._q["save_adaptive_keys"], {"rows": json.dumps(rows)})
                    # a raised key may free places for waiting work
                    conn.execute(self._q["notify"], {"queue": ""})
                for data in said:  # (few: the keeper bounds them)
                    conn.execute(self._q["add_event"], data)
                return True

        return self._run(go)

    def report_limits(self, worker_id: str, reports: str) -> None:
        self._rowcount("report_limits", {"worker": worker_id, "reports": reports, "kept": adp.REPORTS_KEPT})

    def take_limit_reports(self) -> list[tuple[str, str]]:
        rows = self._run(lambda conn: conn.execute(self._q["take_limit_reports"]).fetchall())
        return [(worker, reports) for _, worker, reports in sorted(rows)]

    def limits_waiting(self, names: Collection[str]) -> set[str]:
        plain, keys = sorted(n for n in names if KEY_SEP not in n), sorted(n for n in names if KEY_SEP in n)
        found: set[str] = set()
        for query, some in (("limits_waiting", plain), ("keys_waiting", keys)):
            if some:
                found.update(r[0] for r in self._fetchall(query, {"names": some}))
        return found

    # ---- circuit breakers -----------------------------------------------------------
    def set_breaker(self, name: str, config: brk.BreakerConfig) -> None:
        self._rowcount("set_breaker", {"name": name, "config": brk.config_to_json(config)})
        self._breaker_names_until = 0.0

    def breakers(self) -> dict[str, tuple[brk.BreakerConfig, brk.Breaker]]:
        return {n: (r.config, r.state) for n, r in self._run(self._breaker_rows).items()}

    def force_breaker(self, name: str, state: brk.BreakerState, reason: str) -> BreakerEvent:
        def go(conn):
            with conn.transaction():
                conn.execute(self._q["limit_lock"], {"names": [name]})
                row = self._breaker_rows(conn).get(name)
                if row is None:
                    raise ConfigError(f"no breaker named {name!r}")
                (now,) = conn.execute(self._q["tx_now"]).fetchone()
                after, change = brk.force(row.state, row.config, now, state, reason)
                ev = BreakerEvent(
                    now, name, change.before.value, change.after.value, reason, change.calls, change.failures
                )
                self._save_breaker(conn, name, after, ev)
                conn.execute(self._q["notify"], {"queue": ""})
                return ev

        return self._run(go, retry=False)

    def breaker_events(self, name: str | None = None, limit: int = 20) -> list[BreakerEvent]:
        params = {"name": name, "limit": max(0, limit)}
        return [BreakerEvent(**r) for r in self._fetchall("breaker_events", params, dicts=True)]

    # ---- worker processes -----------------------------------------------------------
    def report_worker(self, info: WorkerInfo) -> None:
        params = {
            "id": info.id,
            "host": info.host,
            "pid": info.pid,
            "queues": list(info.queues),
            "slots": info.slots,
            "in_use": info.in_use,
            "version": info.version,
            "beat_every": info.beat_every,
        }
        self._rowcount("report_worker", params)

    def remove_worker(self, worker_id: str) -> None:
        self._rowcount("remove_worker", {"id": worker_id})

    def workers(self) -> list[WorkerInfo]:
        rows = self._fetchall("workers", dicts=True)
        return [WorkerInfo(**{**r, "queues": tuple(r["queues"])}) for r in rows]

    def forget_workers(self, before: float) -> int:
        return self._rowcount("forget_workers", {"before": before})

    # ---- maintenance --------------------------------------------------------------
    def find_stuck(self, now: float, limit: int) -> list[SweepRow]:
        return [SweepRow(**r) for r in self._fetchall("find_stuck", {"now": now, "limit": limit}, dicts=True)]

    def find_stale_pending(self, before: float, limit: int) -> list[SweepRow]:
        rows = self._fetchall("find_stale_pending", {"before": before, "limit": limit}, dicts=True)
        return [SweepRow(**r) for r in rows]

    def find_expired(self, now: float, limit: int) -> list[SweepRow]:
        rows = self._fetchall("find_expired", {"now": now, "limit": limit}, dicts=True)
        return [SweepRow(**r) for r in rows]

    def rescue(self, rescues: Sequence[Rescue]) -> list[bool]:
        params = {
            "id": [r.task_id for r in rescues],
            "version": [r.version for r in rescues],
            "to": [r.to.value for r in rescues],
            "error": [r.error for r in rescues],
            "crashed": [int(r.crashed) for r in rescues],
            "give_back": [int(r.give_back) for r in rescues],
        }

        def go(conn):
            with conn.transaction():
                rows = conn.execute(self._q["rescue"], params).fetchall()
                ended = [tid for tid, status, _ in rows if State(status) in FINAL]
                if ended:
                    self._settle(conn, ended)
                for queue in sorted({q for _, _, q in rows}):
                    conn.execute(self._q["notify"], {"queue": queue})
            return rows

        done = {tid for tid, _, _ in self._run(go, retry=False)}
        return [r.task_id in done for r in rescues]

    def repair(self, limit: int) -> None:
        """Settle dependents a crashed completion left WAITING behind a finished task."""

        def go(conn):
            ids = [tid for (tid,) in conn.execute(self._q["unsettled"], {"max_rows": limit})]
            if ids:
                self._settle(conn, ids)

        self._run(go, retry=False)

    # ---- periodic schedules -------------------------------------------------
    def save_schedules(self, schedules: Sequence[Schedule], now: float | None = None) -> None:
        def go(conn):
            with conn.transaction():
                (db_now,) = conn.execute(self._q["now"]).fetchone()
                stamp = db_now if now is None else first_stamp(now, db_now)
                with conn.cursor() as cur:
                    cur.executemany(self._q["save_schedule"], [schedule_params(s, stamp) for s in schedules])

        self._run(go)

    def schedules(self) -> list[ScheduleState]:
        return [schedule_state(r) for r in self._fetchall("schedules", dicts=True)]

    def fire_tick(self, schedule: Schedule, tick: int) -> TickResult:
        name = schedule.name

        def go(conn):
            with conn.transaction():
                last = conn.execute(self._q["schedule_lock"], {"name": name}).fetchone()
                if last is None:
                    raise ConfigError(f"schedule {name!r} was never saved in this store")
                _, last_status, db_now = last
                if too_early(tick, db_now):  # the database's clock, not this worker's
                    return TickResult(EARLY)
                params = {"name": name, "tick": tick}
                outcome = ENQUEUED
                if not schedule.overlap and last_status in STILL_GOING:
                    outcome = SKIPPED
                if conn.execute(self._q["tick_claim"], dict(params, outcome=outcome)).fetchone() is None:
                    return TickResult(TAKEN)
                task_id = None
                if outcome == ENQUEUED:
                    rows = _submit_rows([schedule.new_task(tick)], [State.PENDING.value], [None])
                    task_id, _, _ = conn.execute(self._q["submit"], {"rows": rows}).fetchone()
                    conn.execute(self._q["tick_set_task"], dict(params, task_id=task_id))
                conn.execute(self._q["schedule_ticked"], dict(params, outcome=outcome, task_id=task_id))
                conn.execute(self._q["trim_ticks"], {"name": name, "before": tick - TICKS_KEPT_SECONDS})
                return TickResult(outcome, task_id)

        return self._run(go)

    def schedule_ticks(self, schedule: str, limit: int = 100) -> list[TickRecord]:
        params = {"name": schedule, "limit": max(0, limit)}
        return [TickRecord(**r) for r in self._fetchall("schedule_ticks", params, dicts=True)]

    def try_lead(self, role: str, holder: str, ttl: float) -> bool:
        rows = self._fetchall("try_lead", {"role": role, "holder": holder, "ttl": float(ttl)})
        return bool(rows)


class _Rows:
    """A caller's cursor with the ``execute`` of a connection (each statement
    on it returns the cursor, whose rows are tuples)."""

    def __init__(self, cur: Any):
        self._cur = cur

    def execute(self, query: str, params: Any = None) -> Any:
        return self._cur.execute(query, params)


class _SubmitPlan:
    """A submit's tasks, with idempotency keys repeated inside one call
    folded (the first one wins), and how to map inserted ids back."""

    def __init__(self, tasks: list[NewTask]):
        self.tasks = tasks
        first_of_key: dict[str, int] = {}
        self.dup_of: dict[int, int] = {}
        self.rows: list[NewTask] = []
        self.row_index: list[int] = []
        for i, t in enumerate(tasks):
            if t.key is not None:
                if t.key in first_of_key:
                    self.dup_of[i] = first_of_key[t.key]
                    continue
                first_of_key[t.key] = i
            self.rows.append(t)
            self.row_index.append(i)
        self.all_deps = sorted({d for t in self.rows for d in t.depends_on})

    def results(self, written: tuple) -> list[SubmitResult]:
        new_ids, by_key, existing = written
        out: list[SubmitResult | None] = [None] * len(self.tasks)
        it = iter(new_ids)
        for pos, t in zip(self.row_index, self.rows):
            if t.key is not None and t.key not in by_key:
                out[pos] = SubmitResult(existing[t.key], False)
            else:
                out[pos] = SubmitResult(next(it), True)
        for i, j in self.dup_of.items():
            first = out[j]
            assert first is not None  # a duplicate points at a row already filled
            out[i] = SubmitResult(first.id, False)
        return out  # type: ignore[return-value]


def _submit_rows(rows: Sequence[NewTask], status: list[str], error: list[str | None]) -> str:
    """The rows of a submit as one JSON array (the ``submit`` query reads it
    with ``json_to_recordset``): one parameter to encode instead of an array
    per column, which is most of a small submit's client-side cost."""
    return json.dumps(
        [
            {
                "name": t.name,
                "args": t.args,
                "status": st,
                "queue": t.queue,
                "priority": t.priority,
                "max_retries": t.max_retries,
                "timeout": t.timeout,
                "grp": t.group,
                "batch": t.batch,
                "key": t.key,
                "trace_id": t.trace_id,
                "run_at": t.run_at,
                "limits": list(t.limits) if t.limits else None,
                "deps": list(t.depends_on) if t.depends_on else None,
                "halt": bool(t.halt_group_on_failure),
                "error": err,
                "ref": t.ref,
                "policy": t.on_upstream_failure,
                "expires": t.expires_at,
            }
            for t, st, err in zip(rows, status, error)
        ]
    )


def _one_params(t: NewTask) -> dict[str, Any]:
    """The parameters of ``submit_one``, for a task :func:`_plain_now` accepts."""
    return {
        "name": t.name,
        "args": t.args,
        "queue": t.queue,
        "priority": t.priority,
        "max_retries": t.max_retries,
        "timeout": t.timeout,
        "batch": t.batch,
        "key": t.key,
        "trace_id": t.trace_id,
        "halt": bool(t.halt_group_on_failure),
        "ref": t.ref,
        "policy": t.on_upstream_failure,
        "max_note": MAX_NOTE_ROW,
    }


class _NoRoomYet(Exception):
    """A bounded submit's first look found no room: it looks again in single file."""


def _plain_now(t: NewTask) -> bool:
    """A task a waiting worker could be handed in its submit: queued at once,
    in no group, under no limit, with nothing to wait for."""
    return (
        t.group is None
        and not t.limits
        and not t.depends_on
        and not t.after
        and t.run_at is None
        and t.expires_at is None  # submit_one writes no deadline
    )


class _RefusedData(StoreError):
    """The database refused a batch of outcomes for a value in one of its rows."""


def _complete_params(outcomes: Sequence[Outcome], *, hush: bool) -> dict[str, Any]:
    """The complete statement's parameters; ``hush``: the ended units' limit
    places are handed over in the same transaction, so freeing them wakes no
    worker (a group's next task still does)."""
    for o in outcomes:
        check_transition(State.RUNNING, o.status)
    return {
        "hush": hush,
        "ids": int_array(o.task_id for o in outcomes),
        "rows": json.dumps(
            [
                (
                    o.task_id,
                    o.token,
                    o.version,
                    State(o.status).value,
                    o.result,
                    o.error,
                    o.run_at,
                    bool(o.burn_attempt),
                    o.started_at,
                    o.finished_at,
                    o.attempt,
                    bool(o.snooze),
                    o.pause_limits,
                    o.traceback,
                )
                for o in outcomes
            ]
        ),
    }


def _simple_fits(base: dict[str, Any]) -> bool:
    """Whether a claim may take the one-statement path for simple limits:
    not a prefetch (which takes nothing under a limit), not retries only
    (a level's restriction, applied by the other path)."""
    return not base["prefetch"] and not base["only_retries"]


def _claim_params(worker_id: str, request: ClaimRequest) -> dict[str, Any]:
    """The claim statement's parameters, but for ``n`` and ``allowed``."""
    chunk, tail = request.chunk, request.tail
    only_retries, share = request.only_retries, request.retry_share
    names = request.names
    plain_share = only_retries or share is None
    return {
        "queues": text_array(request.queues),
        "all_names": names is None,
        "names": text_array(sorted(names or ())),
        "chunk": chunk,
        "reach": chunk_reach(chunk),
        # near the end of the queued work: lines shorter than "long" take chunks of "short"
        "short": chunk if tail is None else max(1, int(tail[0])),
        "long": 0 if tail is None else int(tail[1]),
        "lease": float(request.lease_seconds),
        "worker": worker_id,
        "only_retries": bool(only_retries),
        # the retry path apart: one statement still (the share is applied in it)
        "share": None if plain_share else float(share),  # type: ignore[arg-type]
        # a worker's own bound on retries (what is left of its share of its slots)
        "cap": None if plain_share or request.retry_cap is None else max(0, int(request.retry_cap)),
        # and the most retries a claim takes even when fresh work runs short
        "most": 2**31 - 1 if plain_share or request.retry_max is None else max(0, int(request.retry_max)),
        "solo": "{}",
        # the keys a claim may take work of (it holds their locks) and the room of each
        "keys": "{}",
        "rooms": "{}",
        "prefetch": bool(request.prefetch),
        "relay": None,
    }


@dataclass(slots=True)
class _OpenOffer:
    """A worker's offer open on the listening connection for one wait."""

    worker_id: str
    #: the slots offered
    places: int
    #: given each task handed over under the offer
    take: Callable[[list[Claim]], None]
    #: the offer's number (its row's key, with the worker's id)
    n: int
    #: ids of the tasks passed to ``take``
    received: set[int] = field(default_factory=set)

    @property
    def spent(self) -> bool:
        """Every slot offered was taken and each task came in its notification:
        nothing is left to offer or to read back."""
        return len(self.received) >= self.places


def _as_claims(rows: Iterable[dict]) -> list[Claim]:
    """Claimed rows, one claim per lease token, in the rows' order."""
    claims: dict[str, Claim] = {}
    for row in rows:
        rec = _record(row)
        token = rec.lease_token or ""  # a claimed row always holds its lease token
        c = claims.get(token)
        if c is None:
            claims[token] = Claim(token, [rec], rec.group)
        else:
            c.tasks.append(rec)
    return list(claims.values())
