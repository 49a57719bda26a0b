-- SQLite dialect of the corral store (see corral/stores/sqlite.py).
--
-- Every block below is a named query; the SQL text never changes at run time,
-- so sqlite3's statement cache keeps them prepared. Timestamps are REAL epoch
-- seconds; args, result and checkpoint are JSON text; limits is a JSON array
-- (NULL when empty).

-- name: schema
CREATE TABLE IF NOT EXISTS corral_schema (
    version INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS tasks (
    id                    INTEGER PRIMARY KEY AUTOINCREMENT,
    name                  TEXT    NOT NULL,
    args                  TEXT    NOT NULL,
    status                TEXT    NOT NULL,
    queue                 TEXT    NOT NULL DEFAULT 'default',
    priority              INTEGER NOT NULL DEFAULT 0,
    attempt               INTEGER NOT NULL DEFAULT 0,
    max_retries           INTEGER NOT NULL DEFAULT 0,
    timeout               REAL,
    group_key             TEXT,
    batch                 TEXT,
    idem_key              TEXT,
    trace_id              TEXT,
    limits                TEXT,
    halt_group_on_failure INTEGER NOT NULL DEFAULT 0,
    created_at            REAL    NOT NULL,
    run_at                REAL    NOT NULL,
    started_at            REAL,
    finished_at           REAL,
    result                TEXT,
    error                 TEXT,
    version               INTEGER NOT NULL DEFAULT 0,
    lease_token           TEXT,
    lease_expires_at      REAL,
    worker_id             TEXT,
    progress              REAL,
    progress_message      TEXT,
    checkpoint            TEXT,
    cancel_requested      INTEGER NOT NULL DEFAULT 0,
    is_head               INTEGER NOT NULL DEFAULT 0  -- first task still in its group's line
);

-- Claim candidates without a group, in claim order: rank (priority with
-- ageing: run_at - priority x 60 s), then id. Its size follows the claimable
-- backlog, never the number of finished tasks. (Group heads have their own
-- index, in round-robin order: tasks_ready_heads_rank, made with the ready_at
-- column below.)
DROP INDEX IF EXISTS tasks_ready;
DROP INDEX IF EXISTS tasks_ready_rank;
DROP INDEX IF EXISTS tasks_ready_plain;
CREATE INDEX IF NOT EXISTS tasks_ready_plain_rank
    ON tasks (queue, (run_at - priority * 60.0), id)
    WHERE status IN ('PENDING', 'RETRYING') AND group_key IS NULL;

-- The retry path: claim candidates waiting to be retried, in claim order. A
-- claim with a retry share looks here first; it stays empty while nothing fails.
DROP INDEX IF EXISTS tasks_retry_ready;
CREATE INDEX IF NOT EXISTS tasks_retry_ready_rank
    ON tasks (queue, (run_at - priority * 60.0), id)
    WHERE status = 'RETRYING' AND (group_key IS NULL OR is_head = 1);

-- Every queued row by run_at (the sweeper's stale-PENDING rule).
CREATE INDEX IF NOT EXISTS tasks_queued_run_at
    ON tasks (run_at)
    WHERE status IN ('PENDING', 'RETRYING');

-- Tasks waiting for their dependencies (counted by active_counts).
CREATE INDEX IF NOT EXISTS tasks_waiting
    ON tasks (id)
    WHERE status = 'WAITING';

-- The head of each group (at most one row per group).
CREATE INDEX IF NOT EXISTS tasks_group_head
    ON tasks (group_key)
    WHERE is_head = 1;

-- The tasks that still occupy their group (the head rule looks here).
CREATE INDEX IF NOT EXISTS tasks_group_line
    ON tasks (group_key, id)
    WHERE group_key IS NOT NULL
      AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
           OR (status = 'FAILED' AND halt_group_on_failure = 1));

CREATE INDEX IF NOT EXISTS tasks_running_token
    ON tasks (lease_token)
    WHERE status = 'RUNNING';

-- A group's running task, if any (schema 21): a claim asks for each head it
-- takes; the line's index would read every queued task of the group.
CREATE INDEX IF NOT EXISTS tasks_group_running
    ON tasks (group_key)
    WHERE status = 'RUNNING' AND group_key IS NOT NULL;

-- The limits of running units (schema 21): counting a limit's places reads
-- this index alone, not every running task's row (status is in it so that
-- the count needs no row).
CREATE INDEX IF NOT EXISTS tasks_running_limits
    ON tasks (lease_token, limits, status)
    WHERE status = 'RUNNING' AND limits IS NOT NULL;

CREATE INDEX IF NOT EXISTS tasks_running_expiry
    ON tasks (lease_expires_at)
    WHERE status = 'RUNNING';

-- Schema 35 had an index of held rows by worker; it cost every claim an index
-- write, and the held rows (bounded by the fleet's slots) are read without it.
DROP INDEX IF EXISTS tasks_held_by_worker;

-- Each minute's figures per queue and task name (schema 36), written by the
-- sweeper's leader and kept a day (corral.core.minutes): what the dashboard's
-- Over time page draws.
CREATE TABLE IF NOT EXISTS minute_stats (
    minute   INTEGER NOT NULL,
    queue    TEXT    NOT NULL,
    name     TEXT    NOT NULL,
    done     INTEGER NOT NULL,
    failed   INTEGER NOT NULL,
    depth    INTEGER NOT NULL,
    dur_p50  REAL,
    dur_p99  REAL,
    wait_p50 REAL,
    wait_p99 REAL,
    PRIMARY KEY (minute, queue, name)
) WITHOUT ROWID;

CREATE UNIQUE INDEX IF NOT EXISTS tasks_idem_key
    ON tasks (idem_key)
    WHERE idem_key IS NOT NULL;

CREATE INDEX IF NOT EXISTS tasks_batch
    ON tasks (batch)
    WHERE batch IS NOT NULL;

-- A status must name a state: a row no state machine knows would be claimed
-- by nothing and counted nowhere. Triggers rather than a CHECK, so a file
-- made by an older version gets the rule without rebuilding its table, and
-- rows it already holds are kept (they read as FAILED, saying what they hold).
CREATE TRIGGER IF NOT EXISTS tasks_status_insert BEFORE INSERT ON tasks
WHEN NEW.status NOT IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING', 'SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELED')
BEGIN
    SELECT RAISE(ABORT, 'task status must be one of WAITING, PENDING, RETRYING, RUNNING, SUCCESS, FAILED, TIMEOUT, CANCELED');
END;

CREATE TRIGGER IF NOT EXISTS tasks_status_update BEFORE UPDATE OF status ON tasks
WHEN NEW.status NOT IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING', 'SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELED')
BEGIN
    SELECT RAISE(ABORT, 'task status must be one of WAITING, PENDING, RETRYING, RUNNING, SUCCESS, FAILED, TIMEOUT, CANCELED');
END;

CREATE TABLE IF NOT EXISTS task_deps (
    task_id    INTEGER NOT NULL,
    pos        INTEGER NOT NULL,
    depends_on INTEGER NOT NULL,
    PRIMARY KEY (task_id, pos)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS task_deps_upstream
    ON task_deps (depends_on, task_id);

CREATE TABLE IF NOT EXISTS task_groups (
    group_key       TEXT PRIMARY KEY,
    last_claimed_at REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS named_limits (
    name        TEXT PRIMARY KEY,
    concurrency INTEGER,
    rate        TEXT
) WITHOUT ROWID;

-- The declared limits apart from the rows of keyed limits' keys (schema 40):
-- a claim reads these whole and a key's row only when a task of that key is a
-- candidate, however many keys the store holds. A key's name holds U+001F.
CREATE INDEX IF NOT EXISTS named_limits_declared
    ON named_limits (name)
    WHERE instr(name, char(31)) = 0;

-- Circuit breakers on a limit or a task name: config and state as JSON,
-- the state's name apart (the plain claim path reads it).
CREATE TABLE IF NOT EXISTS breakers (
    name       TEXT PRIMARY KEY,
    config     TEXT NOT NULL,
    state_name TEXT NOT NULL DEFAULT 'CLOSED',
    state      TEXT
) WITHOUT ROWID;

-- Every change of a breaker, with why and the counts behind it.
CREATE TABLE IF NOT EXISTS breaker_events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       REAL    NOT NULL,
    name     TEXT    NOT NULL,
    before   TEXT    NOT NULL,
    after    TEXT    NOT NULL,
    reason   TEXT    NOT NULL,
    calls    INTEGER NOT NULL,
    failures INTEGER NOT NULL
);

-- Workers' reports of their adaptive limits (schema 43): one row per worker
-- and second, JSON of limit name to counts (corral.core.adaptive.LimitReport),
-- taken (deleted) by the sweeper's leader, which runs the controller.
CREATE TABLE IF NOT EXISTS limit_reports (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    worker  TEXT NOT NULL,
    at      REAL NOT NULL,
    reports TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS limit_reports_worker ON limit_reports (worker, at);

CREATE TABLE IF NOT EXISTS leadership (
    role       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;

-- Dead letters: tasks that ended FAILED or TIMEOUT (schema 5). Only failures
-- hold an entry, so a success costs nothing here; the leader also reads the
-- newest failures from it to see which task kinds fail in a row.
CREATE INDEX IF NOT EXISTS tasks_dead
    ON tasks (id)
    WHERE status IN ('FAILED', 'TIMEOUT');

-- The fleet-wide degradation level: one row (id 1), absent until first set.
CREATE TABLE IF NOT EXISTS fleet_control (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    level       INTEGER NOT NULL DEFAULT 0,
    manual      INTEGER NOT NULL DEFAULT 0,
    calm_since  REAL,
    reason      TEXT NOT NULL DEFAULT '',
    changed_at  REAL
);

-- What changed and why (the event stream: tasks' states and progress, breakers, levels), newest by id; trimmed by the
-- sweeper leader.
-- A task's state change stores only what changes (task_id, status, prior,
-- attempt); its JSON is made when the event is read (events_read below),
-- from the task's row, so the claim and completion pay for little.
-- AUTOINCREMENT: an id is never handed out twice, even after a trim took the
-- newest, so a follower's cursor never skips a new event.
CREATE TABLE IF NOT EXISTS events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL NOT NULL,
    kind    TEXT NOT NULL,
    subject TEXT NOT NULL,
    data    TEXT NOT NULL,
    task_id INTEGER,
    status  TEXT,
    prior   TEXT,
    attempt INTEGER
);

-- Batch settings (schema 13): a batch's on_complete callback (a task template,
-- JSON) and when it was settled, i.e. its callback submitted; a settled batch
-- never gets a second one. Its concurrency is the named limit 'batch:<name>'.
CREATE TABLE IF NOT EXISTS batches (
    name        TEXT PRIMARY KEY,
    on_complete TEXT,
    settled_at  REAL,
    callback_id INTEGER
) WITHOUT ROWID;

-- Unfinished tasks of a batch: whether a batch has ended is one index probe,
-- whatever its size.
CREATE INDEX IF NOT EXISTS tasks_batch_active
    ON tasks (batch)
    WHERE batch IS NOT NULL AND status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING');

-- Worker processes (schema 34): each writes its row every few seconds
-- (heartbeat_at) and deletes it when it stops cleanly; a row gone silent is a
-- dead worker's, listed with the tasks it still holds until the sweeper has
-- taken their leases back and clears it. queues is a JSON array.
CREATE TABLE IF NOT EXISTS workers (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    queues       TEXT NOT NULL,
    slots        INTEGER NOT NULL,
    in_use       INTEGER NOT NULL,
    version      TEXT NOT NULL,
    beat_every   REAL NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
) WITHOUT ROWID;

-- Periodic schedules (schema 7): the definitions a worker stores when it
-- starts (so `corral periodic` lists them without the app) and what their last
-- tick did. last_task_id is the last task a tick enqueued (overlap=False
-- checks it); last_outcome says whether the last tick enqueued or skipped.
CREATE TABLE IF NOT EXISTS schedules (
    name         TEXT PRIMARY KEY,
    task         TEXT NOT NULL,
    expr         TEXT NOT NULL,
    timezone     TEXT NOT NULL,
    queue        TEXT NOT NULL,
    group_key    TEXT,
    overlap      INTEGER NOT NULL,
    catch_up     TEXT NOT NULL,
    max_delay    REAL,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    last_tick    INTEGER,
    last_outcome TEXT,
    last_task_id INTEGER
);

-- One row per tick of a schedule, written in the transaction that enqueues the
-- tick's task: every worker may try, the primary key lets one win.
CREATE TABLE IF NOT EXISTS schedule_ticks (
    schedule TEXT NOT NULL,
    tick     INTEGER NOT NULL,
    outcome  TEXT NOT NULL,
    task_id  INTEGER,
    at       REAL NOT NULL,
    PRIMARY KEY (schedule, tick)
) WITHOUT ROWID;

-- The dashboard's reads (schema 14). Tasks by the time they finished: the
-- charts read the last minutes only.
CREATE INDEX IF NOT EXISTS tasks_finished
    ON tasks (finished_at)
    WHERE finished_at IS NOT NULL;

-- Search by trace id and by group (any state), newest first by id.
CREATE INDEX IF NOT EXISTS tasks_trace
    ON tasks (trace_id)
    WHERE trace_id IS NOT NULL;

-- A group's tasks that left its line (schema 22), read beside the line's
-- own index (tasks_group_line) by a search by group: between them every
-- grouped task, each in one. An index of every grouped task took each
-- submit's rows at as many places as the batch had groups; these rows come
-- in when a unit's tasks end, side by side.
DROP INDEX IF EXISTS tasks_group_all;
CREATE INDEX IF NOT EXISTS tasks_group_done
    ON tasks (group_key, id)
    WHERE group_key IS NOT NULL
      AND (status IN ('SUCCESS', 'TIMEOUT', 'CANCELED')
           OR (status = 'FAILED' AND halt_group_on_failure = 0));

-- A batch's tasks per state, counted from the index alone.
CREATE INDEX IF NOT EXISTS tasks_batch_status
    ON tasks (batch, status)
    WHERE batch IS NOT NULL;

-- Pauses by hand (schema 39): a queue, a group or a limit no claim takes
-- work of while its row is here (core/pauses.py). Every claim reads them in
-- its own transaction; apart from a limit's paused_until (a 429's pause).
CREATE TABLE IF NOT EXISTS pauses (
    kind      TEXT NOT NULL CHECK (kind IN ('queue', 'group', 'limit')),
    name      TEXT NOT NULL,
    paused_at REAL NOT NULL,
    paused_by TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (kind, name)
) WITHOUT ROWID;

-- Columns of schema version 4 (flow control) and later; each is added only
-- when missing.
-- name: columns_v4
ALTER TABLE tasks ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN ready_at REAL;
ALTER TABLE named_limits ADD COLUMN burst INTEGER;
ALTER TABLE named_limits ADD COLUMN tokens REAL;
ALTER TABLE named_limits ADD COLUMN counted_at REAL;
ALTER TABLE named_limits ADD COLUMN paused_until REAL;
ALTER TABLE named_limits ADD COLUMN starts TEXT;
ALTER TABLE tasks ADD COLUMN ref TEXT;
ALTER TABLE tasks ADD COLUMN on_upstream_failure TEXT NOT NULL DEFAULT 'cancel';
ALTER TABLE events ADD COLUMN task_id INTEGER;
ALTER TABLE events ADD COLUMN status TEXT;
ALTER TABLE events ADD COLUMN prior TEXT;
ALTER TABLE events ADD COLUMN attempt INTEGER;
ALTER TABLE tasks ADD COLUMN traceback TEXT;
ALTER TABLE tasks ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN debounce_key TEXT;
ALTER TABLE tasks ADD COLUMN supersede_key TEXT;
ALTER TABLE tasks ADD COLUMN expires_at REAL;
ALTER TABLE tasks ADD COLUMN cancel_reason TEXT;
ALTER TABLE named_limits ADD COLUMN per_key INTEGER NOT NULL DEFAULT 0;
ALTER TABLE named_limits ADD COLUMN set_by TEXT;
ALTER TABLE named_limits ADD COLUMN declared TEXT;
ALTER TABLE named_limits ADD COLUMN changed_at REAL;
ALTER TABLE named_limits ADD COLUMN adaptive TEXT;
ALTER TABLE named_limits ADD COLUMN controller TEXT;

-- The event stream (schema version 9), after the columns it needs: written by
-- triggers in the transaction that changed a task, so every path (claim,
-- completion, cancel, sweep, a dependency's end) is covered, a rolled-back
-- write leaves no event, and the ids follow commit order (one writer at a
-- time). The kinds are those of corral.core.events.
--
-- An event's time is SQLite's own clock, read in C: a Python function called
-- from the trigger would wait for the GIL while holding the write lock. A
-- store on a test's fake clock puts its time in corral_clock at the start of
-- each write, and the triggers take it from there.
-- name: event_stream
CREATE TABLE IF NOT EXISTS corral_clock (now REAL NOT NULL);

CREATE TRIGGER IF NOT EXISTS tasks_event_insert AFTER INSERT ON tasks
WHEN NEW.status <> 'SUCCESS'
BEGIN
    INSERT INTO events (at, kind, subject, data, task_id, status, prior, attempt)
    VALUES (coalesce((SELECT now FROM corral_clock), (julianday('now') - 2440587.5) * 86400.0), 'submitted', '', '', NEW.id, NEW.status, NULL, NEW.attempt);
END;

CREATE TRIGGER IF NOT EXISTS tasks_event_status AFTER UPDATE OF status ON tasks
WHEN NEW.status IS NOT OLD.status
BEGIN
    INSERT INTO events (at, kind, subject, data, task_id, status, prior, attempt)
    VALUES (coalesce((SELECT now FROM corral_clock), (julianday('now') - 2440587.5) * 86400.0),
        CASE NEW.status WHEN 'RUNNING' THEN 'started' WHEN 'SUCCESS' THEN 'succeeded'
            WHEN 'FAILED' THEN 'failed' WHEN 'RETRYING' THEN 'retrying' WHEN 'PENDING' THEN 'queued'
            WHEN 'TIMEOUT' THEN 'timed_out' WHEN 'CANCELED' THEN 'canceled' WHEN 'WAITING' THEN 'waiting'
            ELSE lower(NEW.status) END,
        '', '', NEW.id, NEW.status, OLD.status, NEW.attempt);
END;

CREATE TRIGGER IF NOT EXISTS tasks_event_progress AFTER UPDATE OF progress, progress_message ON tasks
WHEN NEW.status = 'RUNNING' AND NEW.status IS OLD.status
 AND (NEW.progress IS NOT OLD.progress OR NEW.progress_message IS NOT OLD.progress_message)
BEGIN
    INSERT INTO events (at, kind, subject, data)
    VALUES (coalesce((SELECT now FROM corral_clock), (julianday('now') - 2440587.5) * 86400.0), 'progress', 'task:' || NEW.id, json_object(
        'id', NEW.id, 'name', NEW.name, 'fraction', NEW.progress, 'message', NEW.progress_message));
END;

CREATE TRIGGER IF NOT EXISTS breaker_event_stream AFTER INSERT ON breaker_events
BEGIN
    INSERT INTO events (at, kind, subject, data)
    VALUES (NEW.at, 'breaker', 'breaker:' || NEW.name, json_object(
        'name', NEW.name, 'from', NEW.before, 'to', NEW.after, 'reason', NEW.reason));
END;

-- Events as readers see them: a task event's JSON from its row and the task's.
CREATE VIEW IF NOT EXISTS events_read AS
SELECT e.id, e.at, e.kind,
       CASE WHEN e.task_id IS NULL THEN e.subject ELSE 'task:' || e.task_id END AS subject,
       CASE WHEN e.task_id IS NULL THEN e.data ELSE json_object(
           'id', e.task_id, 'name', t.name, 'queue', t.queue, 'status', e.status, 'from', e.prior,
           'attempt', e.attempt, 'group', t.group_key, 'batch', t.batch, 'trace_id', t.trace_id,
           'error', CASE WHEN e.status IN ('FAILED', 'RETRYING', 'TIMEOUT', 'CANCELED')
                         THEN substr(t.error, 1, 500) END) END AS data
FROM events e LEFT JOIN tasks t ON t.id = e.task_id;

-- After the columns (schema 17): a group head's place in the round robin,
-- ready_at = max(run_at, the group's last claim), kept by head_set, so a
-- claim reads ready heads from an index in claim order. Before, it read every
-- queued head and looked up its group's last claim to find the first one
-- eligible: at 10 000 groups, 10 000 rows per claim once every group had been
-- claimed once. The index of every candidate it replaces goes.
-- name: schema_v17
-- When a limit's settings last changed (schema 41): a claim that found its
-- work behind a full limit reads the newest, so a raised limit is seen at
-- once (gated_signature); key rows never set it.
CREATE INDEX IF NOT EXISTS named_limits_changed ON named_limits (changed_at)
    WHERE changed_at IS NOT NULL;
DROP INDEX IF EXISTS tasks_ready_heads;
CREATE INDEX IF NOT EXISTS tasks_ready_heads_rank
    ON tasks (queue, (ready_at - priority * 60.0), id)
    WHERE status IN ('PENDING', 'RETRYING') AND is_head = 1 AND group_key IS NOT NULL;
UPDATE tasks
SET ready_at = max(run_at, coalesce((SELECT g.last_claimed_at FROM task_groups AS g
                                     WHERE g.group_key = tasks.group_key), 0))
WHERE status IN ('PENDING', 'RETRYING') AND is_head = 1 AND group_key IS NOT NULL AND ready_at IS NULL;
DROP INDEX IF EXISTS tasks_ready;
DROP INDEX IF EXISTS tasks_ready_rank;

-- The one PENDING task a debounce key's submits collapse into (schema 37). Not
-- unique: submits of one key are one at a time under the write lock, and a
-- task handed back to PENDING after a newer submit of its key must not fail.
CREATE INDEX IF NOT EXISTS tasks_debounce
    ON tasks (name, debounce_key) WHERE debounce_key IS NOT NULL AND status = 'PENDING';
-- The unfinished tasks of each supersede key (schema 37).
CREATE INDEX IF NOT EXISTS tasks_supersede
    ON tasks (name, supersede_key)
    WHERE supersede_key IS NOT NULL AND status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING');
-- Tasks with a deadline for their first start (schema 38), for the sweeper's
-- read of those past it: empty while no task has one, and never written for
-- a task without (the column stays NULL and never changes).
CREATE INDEX IF NOT EXISTS tasks_expires
    ON tasks (expires_at) WHERE expires_at IS NOT NULL;

-- The places held under each limit (schema 44): one row per limit and lease
-- token running under it (a place is a claim, however many tasks it holds),
-- kept by triggers in the transaction that changed the task, so every path
-- that starts or ends a running task (claim, completion, hand-back, sweep,
-- cancel, retention) keeps it exact. A claim counts a limit's places from
-- this table's rows of that name alone; counting the running rows' limits
-- read every running limited task per claim (20 ms at 10 000 running).
-- Rebuilt from the running rows whenever the schema script runs.
-- name: held_places
CREATE TABLE IF NOT EXISTS held_places (
    name TEXT NOT NULL,
    lease_token TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (name, lease_token)
) WITHOUT ROWID;

DELETE FROM held_places;

INSERT INTO held_places (name, lease_token, n)
SELECT j.value, coalesce(t.lease_token, ''), count(DISTINCT t.id)
FROM tasks AS t, json_each(t.limits) AS j
WHERE t.status = 'RUNNING' AND t.limits IS NOT NULL
GROUP BY j.value, coalesce(t.lease_token, '');

CREATE TRIGGER IF NOT EXISTS held_places_leave AFTER UPDATE OF status, lease_token, limits ON tasks
WHEN OLD.status = 'RUNNING' AND OLD.limits IS NOT NULL
BEGIN
    UPDATE held_places SET n = n - 1
    WHERE lease_token = coalesce(OLD.lease_token, '') AND name IN (SELECT value FROM json_each(OLD.limits));
    DELETE FROM held_places
    WHERE lease_token = coalesce(OLD.lease_token, '') AND n <= 0
      AND name IN (SELECT value FROM json_each(OLD.limits));
END;

CREATE TRIGGER IF NOT EXISTS held_places_enter AFTER UPDATE OF status, lease_token, limits ON tasks
WHEN NEW.status = 'RUNNING' AND NEW.limits IS NOT NULL
BEGIN
    INSERT INTO held_places (name, lease_token, n)
    SELECT DISTINCT value, coalesce(NEW.lease_token, ''), 1 FROM json_each(NEW.limits) WHERE true
    ON CONFLICT (name, lease_token) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER IF NOT EXISTS held_places_insert AFTER INSERT ON tasks
WHEN NEW.status = 'RUNNING' AND NEW.limits IS NOT NULL
BEGIN
    INSERT INTO held_places (name, lease_token, n)
    SELECT DISTINCT value, coalesce(NEW.lease_token, ''), 1 FROM json_each(NEW.limits) WHERE true
    ON CONFLICT (name, lease_token) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER IF NOT EXISTS held_places_delete AFTER DELETE ON tasks
WHEN OLD.status = 'RUNNING' AND OLD.limits IS NOT NULL
BEGIN
    UPDATE held_places SET n = n - 1
    WHERE lease_token = coalesce(OLD.lease_token, '') AND name IN (SELECT value FROM json_each(OLD.limits));
    DELETE FROM held_places
    WHERE lease_token = coalesce(OLD.lease_token, '') AND n <= 0
      AND name IN (SELECT value FROM json_each(OLD.limits));
END;

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS corral_schema (version INTEGER NOT NULL)

-- name: schema_version
SELECT max(version) FROM corral_schema

-- name: set_schema_version
INSERT INTO corral_schema (version) VALUES (?)

-- ---- submit ------------------------------------------------------------------

-- name: next_id_base
SELECT max(
    coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'tasks'), 0),
    coalesce((SELECT max(id) FROM tasks), 0))

-- name: find_key
SELECT id FROM tasks WHERE idem_key = ?

-- name: dep_states
SELECT id, status FROM tasks WHERE id IN (SELECT value FROM json_each(?))

-- name: insert_task
INSERT INTO tasks (
    id, name, args, status, queue, priority, max_retries, timeout, group_key,
    batch, idem_key, trace_id, limits, halt_group_on_failure, created_at,
    run_at, finished_at, error, ref, on_upstream_failure, debounce_key, supersede_key, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: debounce_merge
-- A submit with a debounce key into the PENDING task of its name and key: the
-- newest arguments, run_at now + debounce but never past the first submit +
-- debounce_max (params: args, now + debounce, debounce_max or NULL, name, key).
UPDATE tasks
SET args = ?1, run_at = min(?2, created_at + coalesce(?3, 1e300)), version = version + 1
WHERE id = (SELECT id FROM tasks
            WHERE name = ?4 AND debounce_key = ?5 AND status = 'PENDING'
            ORDER BY id DESC LIMIT 1)
RETURNING id

-- name: supersede_queued
-- A newer submit (id ?4) cancels the queued tasks of its name and supersede key.
UPDATE tasks SET status = 'CANCELED', finished_at = ?1, error = 'superseded', version = version + 1
WHERE name = ?2 AND supersede_key = ?3 AND id < ?4 AND status IN ('WAITING', 'PENDING', 'RETRYING')
RETURNING id, group_key

-- name: supersede_running
-- ... and asks a running one to stop, as a cancel does; if it ends CANCELED,
-- its error says why (complete).
UPDATE tasks SET cancel_requested = 1, cancel_reason = 'superseded'
WHERE name = ?1 AND supersede_key = ?2 AND id < ?3 AND status = 'RUNNING'

-- name: insert_dep
INSERT INTO task_deps (task_id, pos, depends_on) VALUES (?, ?, ?)

-- ---- reading tasks -------------------------------------------------------------

-- name: select_tasks
SELECT id, name, args, status, queue, priority, attempt, max_retries, timeout,
       group_key, batch, idem_key, trace_id, limits, halt_group_on_failure,
       created_at, run_at, started_at, finished_at, result, error, version,
       lease_token, lease_expires_at, worker_id, progress, progress_message,
       checkpoint, cancel_requested, snoozes, ref, on_upstream_failure, traceback, crashes, expires_at, debounce_key
FROM tasks

-- name: get
SELECT id, name, args, status, queue, priority, attempt, max_retries, timeout,
       group_key, batch, idem_key, trace_id, limits, halt_group_on_failure,
       created_at, run_at, started_at, finished_at, result, error, version,
       lease_token, lease_expires_at, worker_id, progress, progress_message,
       checkpoint, cancel_requested, snoozes, ref, on_upstream_failure, traceback, crashes, expires_at, debounce_key
FROM tasks WHERE id = ?

-- The head of a group's line: its smallest id still ACTIVE or halting-FAILED
-- (one seek of the line index; `corral why`).
-- name: line_head
SELECT id, name, args, status, queue, priority, attempt, max_retries, timeout,
       group_key, batch, idem_key, trace_id, limits, halt_group_on_failure,
       created_at, run_at, started_at, finished_at, result, error, version,
       lease_token, lease_expires_at, worker_id, progress, progress_message,
       checkpoint, cancel_requested, snoozes, ref, on_upstream_failure, traceback, crashes, debounce_key
FROM tasks
WHERE id = (SELECT min(id) FROM tasks INDEXED BY tasks_group_line
            WHERE group_key = ?
              AND group_key IS NOT NULL
              AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                   OR (status = 'FAILED' AND halt_group_on_failure = 1)))

-- The tasks one task depends on, in its depends_on order (ctx.upstream).
-- name: upstream
SELECT t.id, t.name, t.args, t.status, t.queue, t.priority, t.attempt, t.max_retries, t.timeout,
       t.group_key, t.batch, t.idem_key, t.trace_id, t.limits, t.halt_group_on_failure,
       t.created_at, t.run_at, t.started_at, t.finished_at, t.result, t.error, t.version,
       t.lease_token, t.lease_expires_at, t.worker_id, t.progress, t.progress_message,
       t.checkpoint, t.cancel_requested, t.snoozes, t.ref, t.on_upstream_failure, t.crashes
FROM task_deps AS d JOIN tasks AS t ON t.id = d.depends_on
WHERE d.task_id = ?
ORDER BY d.pos

-- name: deps_of
SELECT task_id, depends_on FROM task_deps
WHERE task_id IN (SELECT value FROM json_each(?))
ORDER BY task_id, pos

-- Tasks per stored status, and again as RESERVED the RUNNING ones whose
-- start is not recorded (from the running index: live rows only); the store
-- takes those out of RUNNING.
-- name: counts
SELECT status, count(*) FROM tasks GROUP BY status
UNION ALL
SELECT 'RESERVED', count(*) FROM tasks INDEXED BY tasks_running_expiry
WHERE status = 'RUNNING' AND started_at IS NULL

-- Unfinished tasks per state, each part read from a partial index (never
-- from the finished rows).
-- name: active_counts
SELECT status, count(*) FROM tasks INDEXED BY tasks_queued_run_at
WHERE status IN ('PENDING', 'RETRYING') GROUP BY status
UNION ALL
SELECT CASE WHEN started_at IS NULL THEN 'RESERVED' ELSE 'RUNNING' END, count(*)
FROM tasks INDEXED BY tasks_running_expiry WHERE status = 'RUNNING' GROUP BY 1
UNION ALL
SELECT 'WAITING', count(*) FROM tasks INDEXED BY tasks_waiting WHERE status = 'WAITING'

-- name: queued_count
-- The tasks waiting to run, as a bounded submit counts them under the write
-- lock: from the partial indexes alone (no table row is read, no grouping by
-- status), a few hundredths of a millisecond per thousand queued.
SELECT (SELECT count(*) FROM tasks INDEXED BY tasks_queued_run_at WHERE status IN ('PENDING', 'RETRYING'))
     + (SELECT count(*) FROM tasks INDEXED BY tasks_waiting WHERE status = 'WAITING')

-- name: backlog
-- Queued tasks up to a bound, from the partial index alone (chunks near the
-- end of the queued work).
SELECT count(*) FROM (SELECT 1 FROM tasks INDEXED BY tasks_queued_run_at
                      WHERE status IN ('PENDING', 'RETRYING') LIMIT ?)

-- name: counts_queue
SELECT status, count(*) FROM tasks WHERE queue = ?1 GROUP BY status
UNION ALL
SELECT 'RESERVED', count(*) FROM tasks INDEXED BY tasks_running_expiry
WHERE status = 'RUNNING' AND started_at IS NULL AND queue = ?1

-- ---- claim ---------------------------------------------------------------------

-- Queued, due tasks of one queue in index order; a grouped task only when it
-- is its group's head (nothing ACTIVE or halting-FAILED before it).
-- Claim candidates come in two streams merged by (ord, id), ord being the
-- rank (priority with ageing): free tasks by run_at, and group heads by their
-- place in the round robin (ready_at).
-- name: claim_candidates
SELECT id, priority, run_at, group_key, name, limits, queue, status, (run_at - priority * 60.0) AS ord,
       (expires_at IS NOT NULL AND expires_at <= ?2 AND attempt = 0 AND snoozes = 0) AS expired
FROM tasks INDEXED BY tasks_ready_plain_rank
WHERE status IN ('PENDING', 'RETRYING')
  AND group_key IS NULL
  AND queue = ?1
  AND run_at <= ?2
ORDER BY (run_at - priority * 60.0), id

-- The same candidates again from past a place in the order (?3, ?4: ord, id),
-- leaving out the rows whose limits and name (limits || char(30) || name) are
-- among ?5 (a JSON array): a claim that read past many candidates of full keys,
-- or of keys already served in this pass, reads on without them.
-- name: claim_candidates_past
SELECT id, priority, run_at, group_key, name, limits, queue, status, (run_at - priority * 60.0) AS ord,
       (expires_at IS NOT NULL AND expires_at <= ?2 AND attempt = 0 AND snoozes = 0) AS expired
FROM tasks INDEXED BY tasks_ready_plain_rank
WHERE status IN ('PENDING', 'RETRYING')
  AND group_key IS NULL
  AND queue = ?1
  AND run_at <= ?2
  AND (run_at - priority * 60.0) >= ?3
  AND NOT ((run_at - priority * 60.0) = ?3 AND id <= ?4)
  AND (limits IS NULL OR limits || char(30) || name NOT IN (SELECT value FROM json_each(?5)))
ORDER BY (run_at - priority * 60.0), id

-- name: claim_head_candidates
SELECT id, priority, run_at, group_key, name, limits, queue, status, (ready_at - priority * 60.0) AS ord,
       (expires_at IS NOT NULL AND expires_at <= ?2 AND attempt = 0 AND snoozes = 0) AS expired
FROM tasks INDEXED BY tasks_ready_heads_rank
WHERE status IN ('PENDING', 'RETRYING')
  AND is_head = 1 AND group_key IS NOT NULL
  AND queue = ?1
  AND run_at <= ?2
ORDER BY (ready_at - priority * 60.0), id

-- The retry path's claim candidates (a claim with a retry share).
-- name: claim_retry_candidates
SELECT id, priority, run_at, group_key, name, limits, queue, status, (run_at - priority * 60.0) AS ord
FROM tasks INDEXED BY tasks_retry_ready_rank
WHERE status = 'RETRYING'
  AND (group_key IS NULL OR is_head = 1)
  AND queue = ?
  AND run_at <= ?
ORDER BY (run_at - priority * 60.0), id

-- Keep is_head right for one group after its line changed: the head is the
-- smallest id still ACTIVE or halting-FAILED.
-- The indexes are named: with no statistics the planner took the index of
-- every grouped task, reading the group's finished tasks too.
-- name: head_clear
UPDATE tasks INDEXED BY tasks_group_head SET is_head = 0
WHERE group_key = ? AND is_head = 1
  AND id IS NOT (SELECT min(id) FROM tasks INDEXED BY tasks_group_line
                 WHERE group_key = ?
                   AND group_key IS NOT NULL
                   AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                        OR (status = 'FAILED' AND halt_group_on_failure = 1)))

-- name: groups_with_head
-- Which of these groups has a head now (from the heads' partial index).
SELECT group_key FROM tasks INDEXED BY tasks_group_head
WHERE is_head = 1 AND group_key IN (SELECT value FROM json_each(?))

-- name: heads_of_no_state
-- Groups whose head flag sits on a row whose status names no state (written
-- past the status rule): such a row is never claimed, so the flag must move on.
SELECT group_key FROM tasks INDEXED BY tasks_group_head
WHERE is_head = 1
  AND status NOT IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING', 'SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELED')
LIMIT ?

-- name: head_set
UPDATE tasks
SET is_head = 1,
    ready_at = max(run_at, coalesce((SELECT g.last_claimed_at FROM task_groups AS g WHERE g.group_key = ?1), 0))
WHERE id = (SELECT min(id) FROM tasks INDEXED BY tasks_group_line
            WHERE group_key = ?1
              AND group_key IS NOT NULL
              AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                   OR (status = 'FAILED' AND halt_group_on_failure = 1)))
  AND (is_head = 0
       OR ready_at IS NOT max(run_at, coalesce((SELECT g.last_claimed_at FROM task_groups AS g
                                                 WHERE g.group_key = ?1), 0)))

-- name: group_running
SELECT 1 FROM tasks INDEXED BY tasks_group_running
WHERE group_key = ? AND group_key IS NOT NULL AND status = 'RUNNING'
LIMIT 1

-- The tasks after a head that still occupy its group, in id order (chunks).
-- name: group_followers
SELECT id, priority, run_at, group_key, name, limits, queue, status
FROM tasks INDEXED BY tasks_group_line
WHERE group_key = ?
  AND id > ?
  AND group_key IS NOT NULL
  AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
       OR (status = 'FAILED' AND halt_group_on_failure = 1))
ORDER BY id
LIMIT ?

-- name: group_last_claimed
SELECT last_claimed_at FROM task_groups WHERE group_key = ?

-- name: touch_group
INSERT INTO task_groups (group_key, last_claimed_at) VALUES (?, ?)
ON CONFLICT (group_key) DO UPDATE SET last_claimed_at = excluded.last_claimed_at

-- The head of a claim; a NULL start (?4) is a prefetched head: no start
-- recorded, its attempt unchanged (its outcome records both).
-- name: claim_head
UPDATE tasks
SET status = 'RUNNING', lease_token = ?1, lease_expires_at = ?2, worker_id = ?3,
    started_at = ?4, attempt = attempt + (?4 IS NOT NULL), version = version + 1
WHERE id = ?5 AND status IN ('PENDING', 'RETRYING')
RETURNING id, name, args, status, queue, priority, attempt, max_retries, timeout,
       group_key, batch, idem_key, trace_id, limits, halt_group_on_failure,
       created_at, run_at, started_at, finished_at, result, error, version,
       lease_token, lease_expires_at, worker_id, progress, progress_message,
       checkpoint, cancel_requested, snoozes, expires_at

-- The fast path for plain work (no group, no limit) while nothing else is
-- queued: one statement. Parameters: expires, worker, start (NULL for a
-- prefetch: no start recorded), queue, now, names (JSON array, or NULL for any), n.
-- name: claim_plain
UPDATE tasks
SET status = 'RUNNING', lease_token = lower(hex(randomblob(16))), lease_expires_at = ?,
    worker_id = ?, started_at = ?3, attempt = attempt + (?3 IS NOT NULL), version = version + 1
WHERE id IN (
    SELECT id FROM tasks INDEXED BY tasks_ready_plain_rank
    WHERE status IN ('PENDING', 'RETRYING')
      AND group_key IS NULL AND limits IS NULL
      AND queue = ? AND run_at <= ?5
      AND (?6 IS NULL OR name IN (SELECT value FROM json_each(?6)))
      -- never a task past the deadline of its first start (the sweeper ends it)
      AND (expires_at IS NULL OR expires_at > ?5 OR attempt > 0 OR snoozes > 0)
      AND name NOT IN (SELECT b.name FROM breakers AS b WHERE b.state_name <> 'CLOSED')
      AND NOT EXISTS (SELECT 1 FROM pauses WHERE kind = 'queue' AND pauses.name = ?4)
    ORDER BY (run_at - priority * 60.0), id
    LIMIT ?7)
RETURNING id, name, args, status, queue, priority, attempt, max_retries, timeout,
       group_key, batch, idem_key, trace_id, limits, halt_group_on_failure,
       created_at, run_at, started_at, finished_at, result, error, version,
       lease_token, lease_expires_at, worker_id, progress, progress_message,
       checkpoint, cancel_requested, snoozes, expires_at

-- claim_plain with a retry share: up to n fresh and up to n retry candidates,
-- taken in claim order, but retries past ?8 (the share of n) are left for a
-- later claim unless fresh work runs short, and never more than ?9 of them.
-- Parameters as claim_plain, then ?8, ?9.
-- name: claim_plain_shared
UPDATE tasks
SET status = 'RUNNING', lease_token = lower(hex(randomblob(16))), lease_expires_at = ?1,
    worker_id = ?2, started_at = ?3, attempt = attempt + (?3 IS NOT NULL), version = version + 1
WHERE id IN (
    SELECT id FROM (
        SELECT id, lane, priority, run_at,
               row_number() OVER (PARTITION BY lane ORDER BY (run_at - priority * 60.0), id) AS rn,
               count(*) OVER () - sum(lane) OVER () AS nf
        FROM (
            SELECT * FROM (
                SELECT id, 1 AS lane, priority, run_at FROM tasks INDEXED BY tasks_retry_ready_rank
                WHERE status = 'RETRYING' AND (group_key IS NULL OR is_head = 1)
                  AND group_key IS NULL AND limits IS NULL
                  AND queue = ?4 AND run_at <= ?5
                  AND (?6 IS NULL OR name IN (SELECT value FROM json_each(?6)))
                  AND name NOT IN (SELECT b.name FROM breakers AS b WHERE b.state_name <> 'CLOSED')
                  AND NOT EXISTS (SELECT 1 FROM pauses WHERE kind = 'queue' AND pauses.name = ?4)
                ORDER BY (run_at - priority * 60.0), id
                LIMIT ?7)
            UNION ALL
            SELECT * FROM (
                SELECT id, 0 AS lane, priority, run_at FROM tasks INDEXED BY tasks_ready_plain_rank
                WHERE status IN ('PENDING', 'RETRYING')
                  AND status = 'PENDING'
                  AND group_key IS NULL AND limits IS NULL
                  AND queue = ?4 AND run_at <= ?5
                  AND (expires_at IS NULL OR expires_at > ?5 OR attempt > 0 OR snoozes > 0)
                  AND (?6 IS NULL OR name IN (SELECT value FROM json_each(?6)))
                  AND name NOT IN (SELECT b.name FROM breakers AS b WHERE b.state_name <> 'CLOSED')
                  AND NOT EXISTS (SELECT 1 FROM pauses WHERE kind = 'queue' AND pauses.name = ?4)
                ORDER BY (run_at - priority * 60.0), id
                LIMIT ?7)))
    WHERE lane = 0 OR rn <= min(?9, max(?8, ?7 - nf))
    ORDER BY (run_at - priority * 60.0), id
    LIMIT ?7)
RETURNING id, name, args, status, queue, priority, attempt, max_retries, timeout,
       group_key, batch, idem_key, trace_id, limits, halt_group_on_failure,
       created_at, run_at, started_at, finished_at, result, error, version,
       lease_token, lease_expires_at, worker_id, progress, progress_message,
       checkpoint, cancel_requested, snoozes, expires_at

-- name: due_probe
-- Is anything in queue ?1 due at ?2: a queued ungrouped task or a group's
-- head (the rows the claim's candidates come from)?
SELECT EXISTS (SELECT 1 FROM tasks INDEXED BY tasks_ready_plain_rank
               WHERE status IN ('PENDING', 'RETRYING') AND group_key IS NULL
                 AND queue = ?1 AND run_at <= ?2)
    OR EXISTS (SELECT 1 FROM tasks INDEXED BY tasks_ready_heads_rank
               WHERE status IN ('PENDING', 'RETRYING') AND is_head = 1 AND group_key IS NOT NULL
                 AND queue = ?1 AND run_at <= ?2)

-- Is grouped or limited work queued? (decides whether claim_plain may be used)
-- name: special_ready
SELECT EXISTS (SELECT 1 FROM tasks INDEXED BY tasks_queued_run_at
               WHERE status IN ('PENDING', 'RETRYING')
                 AND (group_key IS NOT NULL OR limits IS NOT NULL))

-- Is a group's head queued (any queue)? While none is, every candidate of a
-- claim comes from the index of ungrouped tasks (claim_keyed may be used).
-- name: heads_ready
SELECT EXISTS (SELECT 1 FROM tasks INDEXED BY tasks_ready_heads_rank
               WHERE status IN ('PENDING', 'RETRYING') AND is_head = 1 AND group_key IS NOT NULL)

-- The fast path for ungrouped work under limits of a concurrency only (plain
-- or keyed): the first ?4 candidates of queue ?1 at ?2 (names ?3: a JSON
-- array, or NULL for any) in claim order, as claim_candidates reads them, for
-- corral.core.keyed_claims.decide. Rows of three kinds:
--   0, id, rank, gate name (NULL: none), the task's name under a breaker not
--      closed: a row per candidate and gate (a keyed limit's gate is
--      limit || char(31) || key);
--   1, NULL, NULL, gate name, NULL, cap (NULL: none), places held, shut for
--      the whole claim (full before it, paused), only the planner decides
--      (a rate, a breaker not closed): each gate once, as the planner's
--      Gates read it (a key's own row overrides its limit's);
--   2: a retry is due (asked with ?5 = 1: a retry share).
-- name: claim_keyed
WITH
w AS MATERIALIZED (
    SELECT id, name, limits, (run_at - priority * 60.0) AS ord
    FROM tasks INDEXED BY tasks_ready_plain_rank
    WHERE status IN ('PENDING', 'RETRYING')
      AND group_key IS NULL
      AND queue = ?1 AND run_at <= ?2
      AND (?3 IS NULL OR name IN (SELECT value FROM json_each(?3)))
      AND (expires_at IS NULL OR expires_at > ?2 OR attempt > 0 OR snoozes > 0)
      AND NOT EXISTS (SELECT 1 FROM pauses WHERE kind = 'queue' AND pauses.name = ?1)
    ORDER BY (run_at - priority * 60.0), id
    LIMIT ?4
),
-- (read once: most stores have no breaker open and no limit paused by hand)
any_open AS MATERIALIZED (SELECT EXISTS (SELECT 1 FROM breakers WHERE state_name <> 'CLOSED') AS yes),
any_paused AS MATERIALIZED (SELECT EXISTS (SELECT 1 FROM pauses WHERE kind = 'limit') AS yes),
g AS MATERIALIZED (
    SELECT w.id, w.ord, w.name, j.value AS lim
    FROM w LEFT JOIN json_each(w.limits) AS j ON j.type = 'text'
),
d AS (
    SELECT lim, CASE WHEN instr(lim, char(31)) > 0 THEN instr(lim, char(31)) - 1 END AS sep
    FROM g WHERE lim IS NOT NULL GROUP BY lim
),
gr AS MATERIALIZED (
    SELECT d.lim,
           p.name IS NOT NULL AS declared,
           CASE WHEN p.name IS NULL THEN NULL
                WHEN d.sep IS NOT NULL THEN coalesce(k.concurrency, p.concurrency) ELSE p.concurrency END AS cap,
           coalesce(CASE WHEN d.sep IS NOT NULL THEN coalesce(k.rate, p.rate) ELSE p.rate END, '') <> '' AS rated,
           coalesce(CASE WHEN d.sep IS NOT NULL THEN k.paused_until ELSE p.paused_until END, 0) > ?2 AS paused_a_while,
           (SELECT yes FROM any_paused)
               AND EXISTS (SELECT 1 FROM pauses AS h WHERE h.kind = 'limit'
                           AND h.name = substr(d.lim, 1, coalesce(d.sep, length(d.lim)))) AS paused,
           (SELECT yes FROM any_open)
               AND EXISTS (SELECT 1 FROM breakers AS b WHERE b.name = d.lim AND b.state_name <> 'CLOSED') AS breaker
    FROM d
    LEFT JOIN named_limits AS p ON p.name = substr(d.lim, 1, coalesce(d.sep, length(d.lim)))
    LEFT JOIN named_limits AS k ON d.sep IS NOT NULL AND k.name = d.lim
),
gate AS MATERIALIZED (
    SELECT gr.*, CASE WHEN cap IS NOT NULL
                      THEN (SELECT count(*) FROM held_places AS hp WHERE hp.name = gr.lim) END AS held
    FROM gr
)
SELECT 0, id, ord, lim,
       (SELECT yes FROM any_open)
           AND EXISTS (SELECT 1 FROM breakers AS b WHERE b.name = g.name AND b.state_name <> 'CLOSED'),
       NULL, NULL, NULL, NULL
FROM g
UNION ALL
SELECT 1, NULL, NULL, lim, NULL, cap, held,
       paused OR (declared AND (paused_a_while OR (cap IS NOT NULL AND held >= cap))),
       (declared AND rated) OR breaker
FROM gate
UNION ALL
SELECT 2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE ?5 AND EXISTS (SELECT 1 FROM tasks INDEXED BY tasks_retry_ready_rank
                     WHERE status = 'RETRYING' AND (group_key IS NULL OR is_head = 1)
                       AND queue = ?1 AND run_at <= ?2)

-- Units of one task each, the ids claim_keyed's answer (a JSON array), each
-- under a lease token of its own. Parameters: expires, worker, start (NULL:
-- none recorded), the ids. RETURNING gives the rows in no set order.
-- name: claim_units
UPDATE tasks
SET status = 'RUNNING', lease_token = lower(hex(randomblob(16))), lease_expires_at = ?1,
    worker_id = ?2, started_at = ?3, attempt = attempt + (?3 IS NOT NULL), version = version + 1
WHERE id IN (SELECT value FROM json_each(?4)) AND status IN ('PENDING', 'RETRYING')
RETURNING id, name, args, status, queue, priority, attempt, max_retries, timeout,
       group_key, batch, idem_key, trace_id, limits, halt_group_on_failure,
       created_at, run_at, started_at, finished_at, result, error, version,
       lease_token, lease_expires_at, worker_id, progress, progress_message,
       checkpoint, cancel_requested, snoozes, expires_at

-- name: expire_queued
-- Queued tasks a claim met past the deadline of their first start (a JSON
-- array of ids): ended CANCELED "expired" in the claim's transaction, so the
-- next claim does not read them again.
UPDATE tasks SET status = 'CANCELED', finished_at = ?1, error = 'expired', version = version + 1
WHERE id IN (SELECT value FROM json_each(?2)) AND status = 'PENDING'
  AND expires_at <= ?1 AND attempt = 0 AND snoozes = 0
RETURNING id, group_key

-- Units of one task each, in one statement: a JSON array of [id, token]
-- (a keyed claim takes many such units; a statement each cost it a trip
-- through the interpreter's lock per unit). Parameters: the array, expires,
-- worker, start (NULL: none recorded). RETURNING gives the rows in no set order.
-- name: claim_heads
UPDATE tasks
SET status = 'RUNNING', lease_token = u.token, lease_expires_at = ?2, worker_id = ?3,
    started_at = ?4, attempt = attempt + (?4 IS NOT NULL), version = version + 1
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token FROM json_each(?1)) AS u
WHERE tasks.id = u.id AND tasks.status IN ('PENDING', 'RETRYING')
RETURNING tasks.id, name, args, status, queue, priority, attempt, max_retries, timeout,
       group_key, batch, idem_key, trace_id, limits, halt_group_on_failure,
       created_at, run_at, started_at, finished_at, result, error, version,
       lease_token, lease_expires_at, worker_id, progress, progress_message,
       checkpoint, cancel_requested, snoozes, expires_at

-- name: claim_members
-- A chunk's members (after its head) in one statement: one per member cost
-- the claim, holding the write lock, a trip through the interpreter's lock
-- each (about twice the members' own writes, measured in a busy worker).
-- RETURNING gives the rows in no set order: the store puts them in line.
UPDATE tasks
SET status = 'RUNNING', lease_token = ?, lease_expires_at = ?, worker_id = ?,
    started_at = NULL, version = version + 1
WHERE id IN (SELECT value FROM json_each(?)) AND status IN ('PENDING', 'RETRYING')
RETURNING id, name, args, status, queue, priority, attempt, max_retries, timeout,
       group_key, batch, idem_key, trace_id, limits, halt_group_on_failure,
       created_at, run_at, started_at, finished_at, result, error, version,
       lease_token, lease_expires_at, worker_id, progress, progress_message,
       checkpoint, cancel_requested, snoozes, expires_at

-- ---- limits --------------------------------------------------------------------

-- name: pauses
SELECT kind, name, paused_at, paused_by FROM pauses

-- name: paused_queues
SELECT name FROM pauses WHERE kind = 'queue'

-- name: pause
INSERT INTO pauses (kind, name, paused_at, paused_by) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING

-- name: resume
DELETE FROM pauses WHERE kind = ? AND name = ?

-- The declared limits, without the rows of keys (named_limits_declared).
-- name: limits
SELECT name, concurrency, rate, burst, paused_until, tokens, counted_at, starts,
       per_key, set_by, declared, changed_at
FROM named_limits INDEXED BY named_limits_declared
WHERE instr(name, char(31)) = 0
ORDER BY name

-- The rows of the keys' budgets among these names (a JSON array), for those
-- that have one (a rate charged it): a claim reads the keys of the candidates
-- it is about to consider in one go.
-- name: limit_key_rows
SELECT name, concurrency, rate, burst, paused_until, tokens, counted_at, starts FROM named_limits
WHERE name IN (SELECT value FROM json_each(?))

-- The next rows of keys after ?1 in name order, at most ?2 (forget_keys).
-- name: key_rows_after
SELECT name, concurrency, rate, burst, paused_until, tokens, counted_at, starts FROM named_limits
WHERE name > ?1 AND instr(name, char(31)) > 0 ORDER BY name LIMIT ?2

-- name: forget_key_rows
DELETE FROM named_limits WHERE name = ? AND instr(name, char(31)) > 0

-- One limit's row, read in the write transaction that changes it.
-- name: limit_row
SELECT name, concurrency, rate, burst, paused_until, tokens, counted_at, starts,
       per_key, set_by, declared, changed_at
FROM named_limits WHERE name = ?

-- The last change of any limit's settings (from its index).
-- name: limits_changed
SELECT max(changed_at) FROM named_limits

-- The names of the limits (not their keys' rows), for an error naming them.
-- name: limit_names
SELECT name FROM named_limits WHERE instr(name, char(31)) = 0 ORDER BY name

-- A limit's settings as core.limits decided them (declared, or changed while
-- running). A changed rate starts with a full bucket; an unchanged one keeps
-- its tokens. The log of recent starts (a sliding window's) is kept either way.
-- The rows of these limits (a JSON array of names; keys' budgets by their gate name).
-- name: limits_named
SELECT name, concurrency, rate, burst, paused_until, tokens, counted_at, starts FROM named_limits
WHERE name IN (SELECT value FROM json_each(:names)) ORDER BY name

-- name: set_limit
INSERT INTO named_limits (name, concurrency, rate, burst, per_key, set_by, declared, changed_at)
VALUES (:name, :concurrency, :rate, :burst, :per_key, :set_by, :declared, :changed_at)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, rate = excluded.rate,
    burst = excluded.burst, per_key = excluded.per_key, set_by = excluded.set_by,
    declared = excluded.declared, changed_at = coalesce(excluded.changed_at, named_limits.changed_at),
    tokens = CASE WHEN named_limits.rate IS excluded.rate THEN named_limits.tokens END,
    counted_at = CASE WHEN named_limits.rate IS excluded.rate THEN named_limits.counted_at END,
    adaptive = NULL, controller = NULL

-- A claim took tokens or logged starts: the bucket as counted now, the window's log.
-- A key's budget (a keyed limit's) gets its row here, on first use.
-- name: limit_charge
INSERT INTO named_limits (tokens, counted_at, starts, name) VALUES (?, ?, ?, ?)
ON CONFLICT (name) DO UPDATE SET tokens = excluded.tokens, counted_at = excluded.counted_at,
    starts = excluded.starts

-- ---- adaptive limits (corral.core.adaptive) ----------------------------------

-- name: adaptive_limits
SELECT name, adaptive, concurrency, rate, controller FROM named_limits
WHERE adaptive IS NOT NULL ORDER BY name

-- An adaptive limit declared: its spec and effective values (the controller's
-- state is kept; a changed rate starts with a full bucket).
-- name: declare_adaptive
INSERT INTO named_limits (name, concurrency, rate, burst, adaptive, per_key)
VALUES (:name, :concurrency, :rate, :burst, :adaptive, :per_key)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, rate = excluded.rate,
    burst = excluded.burst, adaptive = excluded.adaptive, per_key = excluded.per_key,
    tokens = CASE WHEN named_limits.rate IS excluded.rate THEN named_limits.tokens END,
    counted_at = CASE WHEN named_limits.rate IS excluded.rate THEN named_limits.counted_at END

-- Does :holder lead :role now? (a write fenced by leadership checks it in its transaction)
-- name: leads_now
SELECT 1 FROM leadership WHERE role = :role AND holder = :holder AND expires_at >= :now

-- The keys of a keyed adaptive limit that hold a controller state (the limit's name and the separator: :prefix).
-- name: adaptive_keys
SELECT substr(name, length(:prefix) + 1), controller FROM named_limits
WHERE name > :prefix AND name < :prefix || char(1114111) AND instr(name, char(31)) > 0 AND controller IS NOT NULL

-- A key's decided values and controller state, into its row (made if it has none);
-- a changed rate starts the key with a full bucket.
-- name: save_adaptive_key
INSERT INTO named_limits (name, concurrency, rate, controller)
VALUES (:name, :concurrency, :rate, :state)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, rate = excluded.rate,
    controller = excluded.controller,
    tokens = CASE WHEN named_limits.rate IS excluded.rate THEN named_limits.tokens END,
    counted_at = CASE WHEN named_limits.rate IS excluded.rate THEN named_limits.counted_at END

-- A keyed limit given fixed values: its keys' learned values and states go (they run under the limit's).
-- name: clear_adaptive_keys
UPDATE named_limits SET concurrency = NULL, rate = NULL, controller = NULL, tokens = NULL, counted_at = NULL
WHERE name > :prefix AND name < :prefix || char(1114111) AND instr(name, char(31)) > 0 AND controller IS NOT NULL

-- The controller states of the key rows :names (JSON array): forget_keys keeps a recently used key's.
-- name: key_controllers
SELECT name, controller FROM named_limits
WHERE name IN (SELECT value FROM json_each(:names)) AND controller IS NOT NULL

-- The controller's decision, written only while :holder leads :role.
-- name: save_adaptive
UPDATE named_limits SET controller = :state,
    concurrency = coalesce(:concurrency, concurrency), rate = coalesce(:rate, rate),
    tokens = CASE WHEN :rate IS NULL OR rate IS :rate THEN tokens END,
    counted_at = CASE WHEN :rate IS NULL OR rate IS :rate THEN counted_at END
WHERE name = :name AND adaptive IS NOT NULL
  AND EXISTS (SELECT 1 FROM leadership WHERE role = :role AND holder = :holder AND expires_at >= :now)

-- name: put_limit_report
INSERT INTO limit_reports (worker, at, reports) VALUES (:worker, :at, :reports)

-- name: trim_limit_reports
DELETE FROM limit_reports WHERE worker = :worker AND at < :before

-- name: take_limit_reports
DELETE FROM limit_reports RETURNING id, worker, reports

-- Which of the limits :names (JSON) queued work due now waits under.
-- name: limits_waiting
SELECT n.value FROM json_each(:names) AS n
WHERE EXISTS (SELECT 1 FROM tasks t
              WHERE t.status IN ('PENDING', 'RETRYING') AND t.limits IS NOT NULL AND t.run_at <= :now
                AND EXISTS (SELECT 1 FROM json_each(t.limits) AS j WHERE j.value = n.value))

-- Those of the keys :names (a keyed limit's gates) that queued work due now waits under: one
-- pass over the queued limited tasks (a key per EXISTS would read a long backlog once per key).
-- name: keys_waiting
SELECT DISTINCT j.value FROM tasks t, json_each(t.limits) AS j
WHERE t.status IN ('PENDING', 'RETRYING') AND t.limits IS NOT NULL AND t.run_at <= :now
  AND j.value IN (SELECT value FROM json_each(:names))

-- A 429 with Retry-After pauses each limit of the task until then.
-- name: limit_pause
UPDATE named_limits SET paused_until = max(coalesce(paused_until, 0), ?)
WHERE name IN (SELECT value FROM json_each(?))

-- ---- circuit breakers ----------------------------------------------------------

-- name: breakers
SELECT name, config, state FROM breakers ORDER BY name

-- name: set_breaker
INSERT INTO breakers (name, config) VALUES (?, ?)
ON CONFLICT (name) DO UPDATE SET config = excluded.config

-- name: breaker_save
UPDATE breakers SET state_name = ?, state = ? WHERE name = ?

-- name: breaker_event
INSERT INTO breaker_events (at, name, before, after, reason, calls, failures) VALUES (?, ?, ?, ?, ?, ?, ?)

-- name: breaker_events
SELECT at, name, before, after, reason, calls, failures FROM breaker_events
WHERE (?1 IS NULL OR name = ?1) ORDER BY id DESC LIMIT ?2

-- name: report_worker
-- A worker's report: its row written whole, its first start kept.
INSERT INTO workers (id, host, pid, queues, slots, in_use, version, beat_every, started_at, heartbeat_at)
VALUES (:id, :host, :pid, :queues, :slots, :in_use, :version, :beat_every, :now, :now)
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, queues = excluded.queues, slots = excluded.slots,
    in_use = excluded.in_use, version = excluded.version, beat_every = excluded.beat_every,
    heartbeat_at = excluded.heartbeat_at

-- name: remove_worker
DELETE FROM workers WHERE id = ?

-- name: workers
SELECT id, host, pid, queues, slots, in_use, version, beat_every, started_at, heartbeat_at
FROM workers ORDER BY started_at, id

-- name: forget_workers
-- Silent workers that hold no task any more: the sweeper took their leases back.
DELETE FROM workers
WHERE heartbeat_at < :before
  AND NOT EXISTS (SELECT 1 FROM tasks AS t WHERE t.status = 'RUNNING' AND t.worker_id = workers.id)

-- What a claim that found its work only behind a full limit depends on,
-- besides the limits' usage: the newest task, the ready heads of its
-- queues (their number and the sum of their ids), and the last change of a
-- limit's settings (a raised limit frees places no count shows).
-- name: gated_signature
-- (The ids of the tasks holding limits' places: a place freed and taken
-- again at once, by another worker of the limit, leaves every count as it
-- was, and a worker that took that for "nothing changed" sat out the race
-- for the next place, a run of 45 places in a row going to the other.)
SELECT (SELECT max(id) FROM tasks), count(*), total(id),
       (SELECT total(id) FROM tasks INDEXED BY tasks_running_limits
        WHERE status = 'RUNNING' AND limits IS NOT NULL),
       (SELECT max(changed_at) FROM named_limits)
FROM tasks INDEXED BY tasks_ready_heads_rank
WHERE queue IN (SELECT value FROM json_each(?))
  AND status IN ('PENDING', 'RETRYING') AND is_head = 1 AND group_key IS NOT NULL

-- Distinct lease tokens among RUNNING tasks, per limit name (held_places).
-- name: limit_usage
SELECT name, count(*) FROM held_places GROUP BY name

-- The places held under each of these names (a JSON array) that holds one:
-- a claim counts the keys of the candidates it is about to consider in one go.
-- name: keys_held
SELECT name, count(*) FROM held_places WHERE name IN (SELECT value FROM json_each(?)) GROUP BY name

-- The places held under one limit (a claim asks for the limits it meets).
-- name: limit_held
SELECT count(*) FROM held_places WHERE name = ?

-- ---- workers -------------------------------------------------------------------

-- name: heartbeat_extend
UPDATE tasks SET lease_expires_at = ?
WHERE status = 'RUNNING' AND lease_token IN (SELECT value FROM json_each(?))

-- name: heartbeat_held
SELECT id, lease_token, cancel_requested FROM tasks
WHERE status = 'RUNNING' AND lease_token IN (SELECT value FROM json_each(?))

-- The starts of held tasks whose bodies run now (one JSON array of
-- [id, token, attempt, started_at] rows): applied only while RUNNING under
-- the token with no start recorded; the version stays (the outcome applies).
-- name: record_starts
UPDATE tasks
SET started_at = s.started_at, attempt = s.attempt
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token,
             json_extract(value, '$[2]') AS attempt, json_extract(value, '$[3]') AS started_at
      FROM json_each(?)) AS s
WHERE tasks.id = s.id AND tasks.status = 'RUNNING' AND tasks.lease_token = s.token
  AND tasks.started_at IS NULL

-- name: cancel_requested
SELECT id FROM tasks WHERE id IN (SELECT value FROM json_each(?)) AND cancel_requested = 1

-- name: set_progress
UPDATE tasks SET progress = ?, progress_message = ?
WHERE id = ? AND status = 'RUNNING' AND lease_token = ?

-- name: get_checkpoint
SELECT checkpoint FROM tasks WHERE id = ? AND status = 'RUNNING' AND lease_token = ?

-- name: set_checkpoint
UPDATE tasks SET checkpoint = ?
WHERE id = ? AND status = 'RUNNING' AND lease_token = ?

-- Outcome of a final state (finished_at set, result/error as given).
-- Parameters: status, result, error(flag, value), traceback(flag, value),
-- finished_at, started_at, attempt, give_back, id, token, version.
-- name: complete_final
UPDATE tasks
SET status = ?, result = coalesce(?, result),
    error = CASE WHEN ? AND cancel_requested = 1 AND cancel_reason IS NOT NULL THEN cancel_reason
                 WHEN ? THEN ? ELSE error END,
    traceback = CASE WHEN ? THEN ? ELSE traceback END,
    finished_at = ?, started_at = coalesce(started_at, ?),
    attempt = coalesce(?, max(0, attempt - ?)),
    lease_token = NULL, lease_expires_at = NULL, version = version + 1
WHERE id = ? AND status = 'RUNNING' AND lease_token = ? AND version = ?
RETURNING group_key, name, limits

-- Many final outcomes in one statement (one JSON array of
-- [id, token, version, status, result, set_error, error, finished_at,
--  started_at, attempt, give_back, traceback] rows; ids distinct): a batch of
-- completions holds the write lock for one statement, not one per task.
-- name: complete_final_many
UPDATE tasks
SET status = o.status, result = coalesce(o.result, tasks.result),
    error = CASE WHEN o.status = 'CANCELED' AND tasks.cancel_requested = 1 AND tasks.cancel_reason IS NOT NULL
                 THEN tasks.cancel_reason
                 WHEN o.set_error THEN o.error ELSE tasks.error END,
    traceback = CASE WHEN o.set_error THEN o.traceback ELSE tasks.traceback END,
    finished_at = o.finished_at, started_at = coalesce(tasks.started_at, o.started_at),
    attempt = coalesce(o.attempt, max(0, tasks.attempt - o.give_back)),
    lease_token = NULL, lease_expires_at = NULL, version = tasks.version + 1
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token,
             json_extract(value, '$[2]') AS version, json_extract(value, '$[3]') AS status,
             json_extract(value, '$[4]') AS result, json_extract(value, '$[5]') AS set_error,
             json_extract(value, '$[6]') AS error, json_extract(value, '$[7]') AS finished_at,
             json_extract(value, '$[8]') AS started_at, json_extract(value, '$[9]') AS attempt,
             json_extract(value, '$[10]') AS give_back, json_extract(value, '$[11]') AS traceback
      FROM json_each(?)) AS o
WHERE tasks.id = o.id AND tasks.status = 'RUNNING' AND tasks.lease_token = o.token
  AND tasks.version = o.version
RETURNING tasks.id, tasks.group_key, tasks.name, tasks.limits

-- Outcome that queues the task again (RETRYING, or PENDING when handed back;
-- a snooze gives the attempt back and counts a snooze).
-- Parameters: status, result, error(flag, value), traceback(flag, value),
-- run_at, started_at, attempt, give_back, snoozed, id, token, version.
-- name: complete_requeue
UPDATE tasks
SET status = ?, result = coalesce(?, result),
    error = CASE WHEN ? THEN ? ELSE error END,
    traceback = CASE WHEN ? THEN ? ELSE traceback END,
    run_at = ?, started_at = coalesce(started_at, ?),
    attempt = coalesce(?, max(0, attempt - ?)), snoozes = snoozes + ?, worker_id = NULL,
    lease_token = NULL, lease_expires_at = NULL, version = version + 1
WHERE id = ? AND status = 'RUNNING' AND lease_token = ? AND version = ?
RETURNING name, limits

-- ---- dependencies --------------------------------------------------------------

-- name: has_dependents
SELECT DISTINCT depends_on FROM task_deps
WHERE depends_on IN (SELECT value FROM json_each(?))

-- WAITING dependents of task ? that may run now: every upstream succeeded,
-- or, under on_upstream_failure = 'run', every upstream ended.
-- name: promote_dependents
UPDATE tasks SET status = 'PENDING', version = version + 1
WHERE status = 'WAITING'
  AND id IN (SELECT task_id FROM task_deps WHERE depends_on = ?)
  AND NOT EXISTS (
        SELECT 1 FROM task_deps AS d JOIN tasks AS u ON u.id = d.depends_on
        WHERE d.task_id = tasks.id AND u.status <> 'SUCCESS'
          AND (tasks.on_upstream_failure <> 'run'
               OR u.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')))

-- WAITING dependents of task ? (which ended badly) that cancel on an upstream's failure.
-- name: cancel_dependents
UPDATE tasks SET status = 'CANCELED', error = ?, finished_at = ?, version = version + 1
WHERE status = 'WAITING' AND on_upstream_failure = 'cancel'
  AND id IN (SELECT task_id FROM task_deps WHERE depends_on = ?)
RETURNING id, group_key

-- ---- operators -----------------------------------------------------------------

-- name: status_of
SELECT status, version, group_key FROM tasks WHERE id = ?

-- name: cancel_queued
UPDATE tasks SET status = 'CANCELED', finished_at = ?, error = 'canceled', version = version + 1
WHERE id = ? AND status IN ('WAITING', 'PENDING', 'RETRYING')

-- name: cancel_running
UPDATE tasks SET cancel_requested = 1, cancel_reason = NULL WHERE id = ? AND status = 'RUNNING'

-- name: retry
UPDATE tasks
SET status = 'PENDING', attempt = 0, snoozes = 0, crashes = 0, run_at = ?, finished_at = NULL,
    cancel_requested = 0, lease_token = NULL, lease_expires_at = NULL,
    version = version + 1
WHERE id = ?  -- FAILED, TIMEOUT, CANCELED, or a status that names no state
  AND status NOT IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING', 'SUCCESS')
RETURNING group_key

-- (RESERVED again apart, as in counts)
-- name: batch_counts
SELECT status, count(*), min(created_at), max(finished_at)
FROM tasks WHERE batch = :batch GROUP BY status
UNION ALL
SELECT 'RESERVED', count(*), NULL, NULL FROM tasks INDEXED BY tasks_batch_status
WHERE batch = :batch AND status = 'RUNNING' AND started_at IS NULL

-- The newest finished tasks of a name (the capacity planner's sample), among
-- the newest :scan tasks: the read is bounded however long the history.
-- name: history_of_name
SELECT status, started_at, finished_at, attempt FROM tasks
WHERE name = :name AND status IN ('SUCCESS', 'FAILED', 'TIMEOUT')
  AND id > (SELECT coalesce(max(id), 0) FROM tasks) - :scan
ORDER BY id DESC LIMIT :limit

-- The same for a batch (of one name when one is given), from the batch index.
-- name: history_of_batch
SELECT status, started_at, finished_at, attempt FROM tasks INDEXED BY tasks_batch
WHERE batch = :batch AND (:name IS NULL OR name = :name) AND status IN ('SUCCESS', 'FAILED', 'TIMEOUT')
ORDER BY id DESC LIMIT :limit

-- ---- batch settings ------------------------------------------------------------

-- name: set_batch
INSERT INTO batches (name, on_complete) VALUES (?, ?)
ON CONFLICT (name) DO UPDATE SET on_complete = excluded.on_complete

-- Batches with a callback not yet submitted (of a JSON array of names, or all).
-- name: batches_unsettled
SELECT name, on_complete FROM batches
WHERE on_complete IS NOT NULL AND settled_at IS NULL
  AND (?1 IS NULL OR name IN (SELECT value FROM json_each(?1)))
ORDER BY name LIMIT ?2

-- name: batch_active
SELECT 1 FROM tasks
WHERE batch = ? AND status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
LIMIT 1

-- name: batch_settle
UPDATE batches SET settled_at = ?, callback_id = ?
WHERE name = ? AND settled_at IS NULL

-- name: batch_durations
SELECT finished_at - started_at FROM tasks
WHERE batch = :batch AND finished_at IS NOT NULL AND started_at IS NOT NULL
ORDER BY 1

-- ---- maintenance ---------------------------------------------------------------

-- name: find_stuck
-- RUNNING tasks whose lease was lost (see corral.maintenance.recovery).
SELECT id, version, attempt, max_retries, started_at, timeout, lease_expires_at, crashes
FROM tasks INDEXED BY tasks_running_expiry
WHERE status = 'RUNNING' AND lease_expires_at < :now
ORDER BY id
LIMIT :limit

-- name: find_stale_pending
-- PENDING tasks a worker could have taken since :before and none did:
-- due since then, and ungrouped or their group's head with the group idle
-- (nothing earlier still in line, nothing of it running, no claim of it)
-- since then. A task waiting its turn in a group is never stale.
SELECT t.id, t.version, t.attempt, t.max_retries, t.started_at, t.timeout, t.lease_expires_at
FROM tasks AS t INDEXED BY tasks_queued_run_at
WHERE t.status IN ('PENDING', 'RETRYING') AND t.status = 'PENDING' AND t.run_at < :before
  AND (t.group_key IS NULL
       OR (NOT EXISTS (SELECT 1 FROM tasks AS p INDEXED BY tasks_group_line
                       WHERE p.group_key = t.group_key AND p.id <> t.id
                         AND (p.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                              OR (p.status = 'FAILED' AND p.halt_group_on_failure = 1))
                         AND (p.id < t.id OR p.status = 'RUNNING'))
           AND coalesce((SELECT g.last_claimed_at FROM task_groups AS g WHERE g.group_key = t.group_key), 0)
               < :before))
ORDER BY t.id
LIMIT :limit

-- name: find_expired
-- PENDING tasks never started whose deadline is at or before :now, from the
-- index of tasks with a deadline (empty unless some have one).
SELECT t.id, t.version, t.attempt, t.max_retries, t.started_at, t.timeout, t.lease_expires_at
FROM tasks AS t INDEXED BY tasks_expires
WHERE t.expires_at IS NOT NULL AND t.expires_at <= :now
  AND t.status = 'PENDING' AND t.attempt = 0 AND t.snoozes = 0
ORDER BY t.expires_at, t.id
LIMIT :limit

-- name: rescue
-- One sweep decision, guarded by status and version, and by the lease still
-- being over (a renewal since the read wins): queued again now (RETRYING,
-- PENDING) or ended now (FAILED, CANCELED); a crash counted, and for a crash
-- re-run its attempt given back.
UPDATE tasks
SET status = :to, error = coalesce(:error, error),
    crashes = crashes + :crashed, attempt = max(0, attempt - :give_back),
    run_at = CASE WHEN :to IN ('PENDING', 'RETRYING') THEN :now ELSE run_at END,
    finished_at = CASE WHEN :to IN ('PENDING', 'RETRYING') THEN finished_at ELSE :now END,
    worker_id = CASE WHEN :to IN ('PENDING', 'RETRYING') THEN NULL ELSE worker_id END,
    lease_token = NULL, lease_expires_at = NULL, version = version + 1
WHERE id = :id AND status = :expected AND version = :version AND coalesce(lease_expires_at, 0) < :now
RETURNING group_key

-- name: try_lead
INSERT INTO leadership (role, holder, expires_at) VALUES (?, ?, ?)
ON CONFLICT (role) DO UPDATE
SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE leadership.holder = excluded.holder OR leadership.expires_at < ?


-- ---- dead letters ----------------------------------------------------------------

-- Paged by keyset: the ids above :after (0 for the first page), so a deep
-- page reads what the first does.
-- name: dead_letters
SELECT * FROM tasks INDEXED BY tasks_dead
WHERE status IN ('FAILED', 'TIMEOUT') AND (:batch IS NULL OR batch = :batch) AND id > :after
ORDER BY id LIMIT :limit OFFSET :offset

-- One batch's dead letters, from the batch index: the cost follows the batch,
-- not every dead letter of the store.
-- name: dead_letters_batch
SELECT * FROM tasks INDEXED BY tasks_batch_status
WHERE batch = :batch AND status IN ('FAILED', 'TIMEOUT') AND id > :after
ORDER BY id LIMIT :limit OFFSET :offset

-- name: dead_ids_batch
SELECT id FROM tasks INDEXED BY tasks_batch_status
WHERE batch = :batch AND status IN ('FAILED', 'TIMEOUT')
ORDER BY id LIMIT :limit

-- name: dead_ids
SELECT id FROM tasks INDEXED BY tasks_dead
WHERE status IN ('FAILED', 'TIMEOUT') AND (:batch IS NULL OR batch = :batch)
ORDER BY id LIMIT :limit

-- Task kinds whose newest failures since :since come :n in a row: the n-th
-- newest failure of the name (among the :scan newest failures) with no
-- success of the name after it.
-- name: failing_kinds
WITH bad AS (
    SELECT id, name FROM tasks INDEXED BY tasks_dead
    WHERE status IN ('FAILED', 'TIMEOUT') AND finished_at >= :since
    ORDER BY id DESC LIMIT :scan
), ranked AS (
    SELECT name, id, row_number() OVER (PARTITION BY name ORDER BY id DESC) AS rn FROM bad
)
SELECT r.name FROM ranked r
WHERE r.rn = :n
  AND NOT EXISTS (SELECT 1 FROM tasks s WHERE s.id > r.id AND s.name = r.name AND s.status = 'SUCCESS')
ORDER BY r.name

-- ---- fleet control ---------------------------------------------------------------

-- name: fleet_level
SELECT level, manual, calm_since, reason, changed_at FROM fleet_control WHERE id = 1

-- Parameters: level, manual, calm_since, reason, now, auto (1: only while not manual).
-- name: set_fleet_level
INSERT INTO fleet_control (id, level, manual, calm_since, reason, changed_at)
VALUES (1, :level, :manual, :calm_since, :reason, :now)
ON CONFLICT (id) DO UPDATE SET
    level = excluded.level, manual = excluded.manual, calm_since = excluded.calm_since,
    reason = excluded.reason,
    changed_at = CASE WHEN fleet_control.level = excluded.level AND fleet_control.changed_at IS NOT NULL
                      THEN fleet_control.changed_at ELSE excluded.changed_at END
WHERE NOT (:auto AND fleet_control.manual)

-- name: add_event
INSERT INTO events (at, kind, subject, data) VALUES (?, ?, ?, ?)

-- name: events
SELECT id, at, kind, subject, data FROM events_read
WHERE (:kind IS NULL OR kind = :kind)
ORDER BY id DESC LIMIT :limit

-- name: read_events
SELECT id, at, kind, subject, data FROM events_read WHERE id > ? ORDER BY id LIMIT ?

-- name: last_event_id
SELECT coalesce(max(id), 0) FROM events

-- name: set_clock
INSERT OR REPLACE INTO corral_clock (rowid, now) VALUES (1, ?)

-- name: clear_clock
DELETE FROM corral_clock

-- name: trim_events
-- The oldest events, by id (ids follow time): those before the first one
-- stamped at or after :before, and all but the newest :keep; at most :max of
-- them, so one statement never holds the write lock long.
DELETE FROM events WHERE id IN (
    SELECT id FROM events
    WHERE id <= max(
        coalesce((SELECT id FROM events WHERE at >= :before ORDER BY id LIMIT 1) - 1,
                 (SELECT max(id) FROM events)),
        coalesce((SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET :keep), 0))
    ORDER BY id LIMIT :max)

-- name: prune
-- Retention: up to :max finished tasks, oldest finish first, each in a state
-- given a cut-off (NULL: not pruned) and finished before it, read from the
-- index of finish times. Kept whatever their age: an upstream of a task not
-- ended or ended FAILED/TIMEOUT (a retry runs it with its upstream's results);
-- every task of a batch not finished, or whose callback is not submitted; a
-- halting failure with tasks of its group behind it.
DELETE FROM tasks WHERE id IN (
    SELECT t.id FROM tasks t
    WHERE t.finished_at < :oldest
      AND t.finished_at < CASE t.status WHEN 'SUCCESS' THEN :success WHEN 'CANCELED' THEN :canceled
                                        WHEN 'FAILED' THEN :failed WHEN 'TIMEOUT' THEN :timeout END
      AND NOT EXISTS (
          SELECT 1 FROM task_deps d JOIN tasks w ON w.id = d.task_id
          WHERE d.depends_on = t.id
            AND w.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING', 'FAILED', 'TIMEOUT'))
      AND (t.batch IS NULL OR (
          NOT EXISTS (SELECT 1 FROM tasks b
                      WHERE b.batch = t.batch AND b.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING'))
          AND NOT EXISTS (SELECT 1 FROM batches s
                          WHERE s.name = t.batch AND s.on_complete IS NOT NULL AND s.settled_at IS NULL)))
      AND NOT (t.status = 'FAILED' AND t.halt_group_on_failure = 1 AND t.group_key IS NOT NULL
               AND EXISTS (SELECT 1 FROM tasks g
                           WHERE g.group_key = t.group_key AND g.id > t.id
                             AND g.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')))
    ORDER BY t.finished_at LIMIT :max)
RETURNING id

-- name: prune_deps
-- The dependency rows of pruned tasks (:ids, a JSON array).
DELETE FROM task_deps WHERE task_id IN (SELECT value FROM json_each(:ids))

-- ---- the dashboard's reads --------------------------------------------------------

-- Unfinished tasks per queue and state, each part read from the partial index
-- active_counts reads (live rows only; the queue from each row): no index of
-- its own, so no write pays for it.
-- name: queue_counts
SELECT queue, status, count(*) FROM tasks INDEXED BY tasks_queued_run_at
WHERE status IN ('PENDING', 'RETRYING') GROUP BY queue, status
UNION ALL
SELECT queue, CASE WHEN started_at IS NULL THEN 'RESERVED' ELSE 'RUNNING' END, count(*)
FROM tasks INDEXED BY tasks_running_expiry WHERE status = 'RUNNING' GROUP BY 1, 2
UNION ALL
SELECT queue, 'WAITING', count(*) FROM tasks INDEXED BY tasks_waiting WHERE status = 'WAITING' GROUP BY queue

-- Groups with a live line (the line index), blocked heads first. The head is
-- the line's smallest id.
-- name: group_lines
SELECT l.group_key AS "group", l.n AS backlog, h.id AS head_id, h.name AS head_name,
       CASE WHEN h.status = 'RUNNING' AND h.started_at IS NULL THEN 'RESERVED' ELSE h.status END AS head_status,
       h.worker_id AS head_worker, h.error AS head_error
FROM (SELECT group_key, count(*) AS n, min(id) AS head FROM tasks INDEXED BY tasks_group_line
      WHERE group_key IS NOT NULL
        AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
             OR (status = 'FAILED' AND halt_group_on_failure = 1))
      GROUP BY group_key) AS l
JOIN tasks AS h ON h.id = l.head
ORDER BY h.status IN ('FAILED', 'RETRYING', 'TIMEOUT') DESC, l.group_key
LIMIT ? OFFSET ?

-- The next batch names after ?1, one index seek each (a loose index scan),
-- so a page costs the same however many tasks the batches hold.
-- name: batch_names
WITH RECURSIVE b(name, k) AS (
    SELECT (SELECT min(batch) FROM tasks INDEXED BY tasks_batch_status WHERE batch > ?1), 1
    UNION ALL
    SELECT (SELECT min(batch) FROM tasks INDEXED BY tasks_batch_status WHERE batch > b.name), k + 1
    FROM b WHERE b.name IS NOT NULL AND k < ?2
)
SELECT name FROM b WHERE name IS NOT NULL

-- name: batch_empty_name
SELECT 1 FROM tasks INDEXED BY tasks_batch_status WHERE batch = ''

-- name: batch_status_counts
SELECT status, count(*) FROM tasks INDEXED BY tasks_batch_status WHERE batch = ?1 GROUP BY status
UNION ALL
SELECT 'RESERVED', count(*) FROM tasks INDEXED BY tasks_batch_status
WHERE batch = ?1 AND status = 'RUNNING' AND started_at IS NULL

-- name: recent_finished
SELECT id, name, queue, status, started_at, finished_at FROM tasks INDEXED BY tasks_finished
WHERE finished_at >= ? ORDER BY finished_at, id LIMIT ?

-- name: recent_finished_desc
SELECT id, name, queue, status, started_at, finished_at FROM tasks INDEXED BY tasks_finished
WHERE finished_at >= ? ORDER BY finished_at DESC, id DESC LIMIT ?

-- name: finished_counts
-- The dashboard's sampler once a minute keeps no more durations: counts, no rows.
SELECT CAST(finished_at / 60 AS INTEGER) * 60.0 AS minute, status, count(*) FROM tasks INDEXED BY tasks_finished
WHERE finished_at >= ? AND finished_at < ? GROUP BY 1, 2

-- name: finished_runs
SELECT id, name, queue, status, run_at, started_at, finished_at FROM tasks INDEXED BY tasks_finished
WHERE finished_at >= ? AND finished_at < ? ORDER BY finished_at, id LIMIT ?

-- name: save_minute_stat
INSERT OR REPLACE INTO minute_stats (minute, queue, name, done, failed, depth, dur_p50, dur_p99, wait_p50, wait_p99)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: trim_minute_stats
DELETE FROM minute_stats WHERE minute < ?

-- name: minute_stats
SELECT minute, queue, name, done, failed, depth, dur_p50, dur_p99, wait_p50, wait_p99
FROM minute_stats WHERE minute >= ? ORDER BY minute, queue, name

-- ---- periodic schedules ------------------------------------------------------------

-- name: save_schedule
INSERT INTO schedules (name, task, expr, timezone, queue, group_key, overlap, catch_up, max_delay,
                       created_at, updated_at)
VALUES (:name, :task, :expr, :timezone, :queue, :group_key, :overlap, :catch_up, :max_delay, :now, :now)
ON CONFLICT (name) DO UPDATE SET
    task = excluded.task, expr = excluded.expr, timezone = excluded.timezone, queue = excluded.queue,
    group_key = excluded.group_key, overlap = excluded.overlap, catch_up = excluded.catch_up,
    max_delay = excluded.max_delay, updated_at = excluded.updated_at

-- name: schedules
SELECT s.name, s.task, s.expr, s.timezone, s.queue, s.group_key, s.overlap, s.catch_up, s.max_delay,
       s.created_at, s.last_tick, s.last_outcome, s.last_task_id, t.status AS last_task_status
FROM schedules s LEFT JOIN tasks t ON t.id = s.last_task_id
ORDER BY s.name

-- The status of the task the schedule's last enqueued tick made (NULL: none, or gone).
-- name: schedule_last_run
SELECT s.last_task_id, t.status
FROM schedules s LEFT JOIN tasks t ON t.id = s.last_task_id
WHERE s.name = ?

-- name: tick_claim
INSERT INTO schedule_ticks (schedule, tick, outcome, task_id, at) VALUES (?, ?, ?, NULL, ?)
ON CONFLICT (schedule, tick) DO NOTHING

-- name: tick_skipped
UPDATE schedule_ticks SET outcome = 'skipped' WHERE schedule = ? AND tick = ?

-- name: tick_set_task
UPDATE schedule_ticks SET task_id = ? WHERE schedule = ? AND tick = ?

-- Parameters: name, tick, outcome, task_id (NULL when skipped: the last enqueued one stays).
-- name: schedule_ticked
UPDATE schedules SET
    last_tick = :tick, last_outcome = :outcome,
    last_task_id = coalesce(:task_id, last_task_id)
WHERE name = :name AND (last_tick IS NULL OR last_tick <= :tick)

-- Ticks far older than the one just written can never be tried again.
-- name: trim_ticks
DELETE FROM schedule_ticks WHERE schedule = ? AND tick < ?

-- name: schedule_ticks
SELECT schedule, tick, outcome, task_id, at FROM schedule_ticks
WHERE schedule = ? ORDER BY tick DESC LIMIT ?

-- name: first_waiter
-- The queue and task name of the first work waiting under limit ?: a place
-- of it passes from an ended unit to its successor only when that work is
-- the handing worker's, so a worker of other queues under the same limit is
-- not shut out. ?3 and ?4: the name as JSON, as this store writes it and with
-- non-ASCII characters escaped: a row whose limits name it holds one of them
-- (looking for them in the text first passes over a row far quicker than
-- reading its limits as JSON: a key's first waiter may be a thousand rows in).
SELECT queue, name FROM tasks INDEXED BY tasks_queued_run_at
WHERE status IN ('PENDING', 'RETRYING') AND limits IS NOT NULL AND run_at <= ?1
  AND (instr(limits, ?3) > 0 OR instr(limits, ?4) > 0)
  AND EXISTS (SELECT 1 FROM json_each(tasks.limits) WHERE value = ?2)
ORDER BY run_at, id LIMIT 1;

-- name: limits_tight
-- Which of these gate names (a JSON array) a hand-over of ?2 places could
-- keep from another worker: its limit (or its key's own row) has a rate, or
-- a cap with at most ?2 places free. A name no limit declares gates nothing.
SELECT d.lim FROM (
    SELECT value AS lim,
           CASE WHEN instr(value, char(31)) > 0 THEN instr(value, char(31)) - 1 END AS sep
    FROM json_each(?1)) AS d
JOIN named_limits AS p ON p.name = substr(d.lim, 1, coalesce(d.sep, length(d.lim)))
LEFT JOIN named_limits AS k ON d.sep IS NOT NULL AND k.name = d.lim
WHERE coalesce(CASE WHEN d.sep IS NOT NULL THEN coalesce(k.rate, p.rate) ELSE p.rate END, '') <> ''
   OR (SELECT count(*) FROM held_places AS hp WHERE hp.name = d.lim) + ?2
      >= CASE WHEN d.sep IS NOT NULL THEN coalesce(k.concurrency, p.concurrency) ELSE p.concurrency END

-- name: relay_fits
-- How many of the limits ? may pass a place to a relay: capped, no rate, not
-- paused at ?, no breaker (a rate would owe a token, a breaker its probes).
SELECT count(*) FROM named_limits
WHERE name IN (SELECT value FROM json_each(?)) AND concurrency IS NOT NULL AND rate IS NULL
  AND coalesce(paused_until, 0) <= ?
  AND name NOT IN (SELECT name FROM breakers)
