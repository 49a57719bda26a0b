-- PostgreSQL dialect of the corral store.
--
-- Times are double precision epoch seconds taken from the database clock.
-- Task states are text; the partial indexes below only hold the rows a claim,
-- a heartbeat or a group check can need, so their cost does not grow with the
-- number of finished tasks.
--
-- A guard written `(status || '') = ...` is checked on a row found by id:
-- the expression keeps the planner from answering it with a scan of a partial
-- index whose size it guesses from statistics, which a queue makes stale all
-- the time (they may say "no PENDING rows" while there are a million).

-- name: schema_version_table
CREATE TABLE IF NOT EXISTS corral_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

-- name: schema_version
SELECT value::int FROM corral_meta WHERE key = 'schema_version';

-- name: set_schema_version
INSERT INTO corral_meta (key, value) VALUES ('schema_version', %(v)s::text)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: migration_0001
CREATE TABLE corral_tasks (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                  text NOT NULL,
    args                  text NOT NULL,
    status                text NOT NULL,
    queue                 text NOT NULL DEFAULT 'default',
    priority              integer NOT NULL DEFAULT 0,
    attempt               integer NOT NULL DEFAULT 0,
    max_retries           integer NOT NULL DEFAULT 0,
    timeout               double precision,
    group_key             text,
    batch                 text,
    idem_key              text,
    trace_id              text,
    limits                text[] NOT NULL DEFAULT '{}',
    depends_on            bigint[] NOT NULL DEFAULT '{}',
    halt_group_on_failure boolean NOT NULL DEFAULT false,
    created_at            double precision NOT NULL,
    run_at                double precision NOT NULL,
    started_at            double precision,
    finished_at           double precision,
    result                text,
    error                 text,
    version               integer NOT NULL DEFAULT 0,
    lease_token           text,
    lease_expires_at      double precision,
    worker_id             text,
    progress              double precision,
    progress_message      text,
    checkpoint            text,
    cancel_requested      boolean NOT NULL DEFAULT false,
    -- set (under the row lock) by a submit naming this task in depends_on, so
    -- a completion knows from its own row whether dependents need settling
    has_dependents        boolean NOT NULL DEFAULT false
) WITH (fillfactor = 85);

-- ungrouped claim candidates, in claim order
CREATE INDEX corral_tasks_ready_free ON corral_tasks (priority DESC, run_at, id)
    WHERE status IN ('PENDING', 'RETRYING') AND group_key IS NULL;
-- groups that have queued tasks (walked with a loose index scan), lowest id first
CREATE INDEX corral_tasks_ready_group ON corral_tasks (group_key, id)
    WHERE status IN ('PENDING', 'RETRYING') AND group_key IS NOT NULL;
-- everything that holds a group's place: decides the group head
CREATE INDEX corral_tasks_group_block ON corral_tasks (group_key, id)
    WHERE status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
       OR (status = 'FAILED' AND halt_group_on_failure);
-- queued tasks under a named limit (the probe that decides on the limited path)
CREATE INDEX corral_tasks_ready_limited ON corral_tasks (priority DESC, run_at, id)
    WHERE status IN ('PENDING', 'RETRYING') AND cardinality(limits) > 0;
-- running tasks by lease (heartbeat, limit usage, sweep)
CREATE INDEX corral_tasks_running ON corral_tasks (lease_token)
    WHERE status = 'RUNNING';
CREATE INDEX corral_tasks_waiting ON corral_tasks (id) WHERE status = 'WAITING';
CREATE INDEX corral_tasks_ready_unlimited ON corral_tasks (queue, run_at)
    WHERE status IN ('PENDING', 'RETRYING') AND cardinality(limits) = 0;
CREATE INDEX corral_tasks_running_group ON corral_tasks (group_key)
    WHERE status = 'RUNNING' AND group_key IS NOT NULL;
CREATE UNIQUE INDEX corral_tasks_idem_key ON corral_tasks (idem_key) WHERE idem_key IS NOT NULL;
CREATE INDEX corral_tasks_batch ON corral_tasks (batch) WHERE batch IS NOT NULL;

CREATE TABLE corral_deps (
    task_id bigint NOT NULL,
    dep_id  bigint NOT NULL,
    PRIMARY KEY (task_id, dep_id)
);
CREATE INDEX corral_deps_dep ON corral_deps (dep_id);

CREATE TABLE corral_groups (
    group_key       text PRIMARY KEY,
    last_claimed_at double precision NOT NULL DEFAULT 0
);

CREATE TABLE corral_limits (
    name        text PRIMARY KEY,
    concurrency integer,
    rate        text
);

CREATE TABLE corral_leaders (
    role       text PRIMARY KEY,
    holder     text NOT NULL,
    expires_at double precision NOT NULL
);

-- name: migration_0002
-- Group heads kept in the rows, so a claim reads ready heads from an index in
-- claim order instead of visiting every group with queued work.
--
-- is_head marks the first task still holding its group's place when that
-- task is queued (on other rows the flag means nothing); ready_at is its
-- place in the round-robin: greatest(run_at, the group's last claim).
-- Triggers keep both right after every statement that changes a grouped
-- task's status or run_at (claims excepted: a claimed head stays the head),
-- whatever path the change took. A claim still checks the exact head rule
-- itself, so a stale flag can cost a wasted probe, never a second task of a
-- group in flight.
ALTER TABLE corral_tasks
    ADD COLUMN is_head  boolean NOT NULL DEFAULT false,
    ADD COLUMN ready_at double precision;

CREATE FUNCTION corral_refresh_heads() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    gs text[];
    g text;
    lca double precision;
    head bigint;
    queued boolean;
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;  -- the refresh's own updates (is_head, ready_at)
    END IF;
    IF NOT EXISTS (SELECT 1 FROM new_rows WHERE group_key IS NOT NULL) THEN
        RETURN NULL;  -- plain work: the common case, decided in one look
    END IF;
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(DISTINCT n.group_key ORDER BY n.group_key) INTO gs
        FROM new_rows n WHERE n.group_key IS NOT NULL;
    ELSE
        SELECT array_agg(DISTINCT n.group_key ORDER BY n.group_key) INTO gs
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.group_key IS NOT NULL
          AND NOT (n.status = 'RUNNING' AND o.status IN ('PENDING', 'RETRYING'))
          AND (n.status IS DISTINCT FROM o.status OR n.run_at IS DISTINCT FROM o.run_at);
    END IF;
    IF gs IS NULL THEN
        RETURN NULL;
    END IF;
    -- One refresher per group at a time (groups locked in name order). Each
    -- statement below takes a fresh snapshot, so the last refresher of a
    -- group sees every change made before it. Small statements, one group at
    -- a time: their plans stay cached, where one statement for all groups
    -- would be planned again on every call.
    FOREACH g IN ARRAY gs LOOP
        SELECT last_claimed_at INTO lca FROM corral_groups WHERE group_key = g FOR UPDATE;
        lca := coalesce(lca, 0);
        SELECT x.id, x.status IN ('PENDING', 'RETRYING') INTO head, queued FROM corral_tasks x
        WHERE x.group_key = g AND (x.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING') OR (x.status = 'FAILED' AND x.halt_group_on_failure))
        ORDER BY x.id LIMIT 1;
        IF NOT coalesce(queued, false) THEN
            head := NULL;  -- the first task runs, waits or halts the group: no ready head
        END IF;
        -- Only queued rows need a right flag (the claim index holds no
        -- other); a flag left on a running or finished row is never read.
        -- A stale flag another transaction holds is left for later (the
        -- claim's own head check makes it harmless); the head's flag waits.
        IF EXISTS (SELECT 1 FROM corral_tasks s
                   WHERE s.group_key = g AND s.is_head AND s.status IN ('PENDING', 'RETRYING')
                     AND s.id IS DISTINCT FROM head) THEN
            UPDATE corral_tasks t SET is_head = false
            WHERE t.id IN (SELECT s.id FROM corral_tasks s
                           WHERE s.group_key = g AND s.is_head AND s.status IN ('PENDING', 'RETRYING')
                             AND s.id IS DISTINCT FROM head
                           FOR UPDATE SKIP LOCKED);
        END IF;
        IF head IS NOT NULL AND EXISTS (
                SELECT 1 FROM corral_tasks t
                WHERE t.id = head AND (NOT t.is_head OR t.ready_at IS DISTINCT FROM greatest(t.run_at, lca))) THEN
            UPDATE corral_tasks t SET is_head = true, ready_at = greatest(t.run_at, lca)
            WHERE t.id = head;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER corral_heads_after_insert AFTER INSERT ON corral_tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION corral_refresh_heads();
CREATE TRIGGER corral_heads_after_update AFTER UPDATE ON corral_tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION corral_refresh_heads();

UPDATE corral_tasks t SET is_head = true, ready_at = greatest(t.run_at, coalesce(g.last_claimed_at, 0))
FROM (SELECT DISTINCT ON (x.group_key) x.id, x.group_key FROM corral_tasks x
      WHERE x.group_key IS NOT NULL AND (x.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING') OR (x.status = 'FAILED' AND x.halt_group_on_failure))
      ORDER BY x.group_key, x.id) h
LEFT JOIN corral_groups g ON g.group_key = h.group_key
WHERE t.id = h.id AND t.status IN ('PENDING', 'RETRYING');

-- ready group heads, in claim order
CREATE INDEX corral_tasks_ready_heads ON corral_tasks (priority DESC, ready_at, id)
    WHERE status IN ('PENDING', 'RETRYING') AND is_head;
-- a group's flagged queued rows (a refresh clears the ones no longer first)
CREATE INDEX corral_tasks_heads ON corral_tasks (group_key)
    WHERE is_head AND status IN ('PENDING', 'RETRYING');

-- name: migration_0003
-- The index that decides group heads held every active task, grouped or not:
-- each claim and completion of plain work wrote an entry for nothing.
DROP INDEX corral_tasks_group_block;
CREATE INDEX corral_tasks_group_block ON corral_tasks (group_key, id)
    WHERE group_key IS NOT NULL
      AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
           OR (status = 'FAILED' AND halt_group_on_failure));

-- name: migration_0004
-- A status must name a state. NOT VALID adds the rule for every new write at
-- once without scanning the table; rows already there are checked (and the
-- constraint marked valid) only when none breaks it: such a row is kept and
-- reads as FAILED, saying what it holds, until an operator retries it.
ALTER TABLE corral_tasks ADD CONSTRAINT corral_tasks_status_known
    CHECK (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING', 'SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELED'))
    NOT VALID;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM corral_tasks
                   WHERE status NOT IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING',
                                        'SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELED')) THEN
        ALTER TABLE corral_tasks VALIDATE CONSTRAINT corral_tasks_status_known;
    END IF;
END
$$;

-- name: migration_0005
-- Flow control: a limit's token bucket (tokens as counted at counted_at) and
-- its pause after a 429; a task's snoozes (runs it asked to postpone, which
-- burn no attempt); circuit breakers on a limit or a task name, and the log
-- of their changes.
ALTER TABLE corral_tasks ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
ALTER TABLE corral_limits
    ADD COLUMN burst        integer,
    ADD COLUMN tokens       double precision,
    ADD COLUMN counted_at   double precision,
    ADD COLUMN paused_until double precision;
CREATE TABLE corral_breakers (
    name       text PRIMARY KEY,
    config     text NOT NULL,
    state_name text NOT NULL DEFAULT 'CLOSED',
    state      text
);
CREATE TABLE corral_breaker_events (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       double precision NOT NULL,
    name     text NOT NULL,
    before   text NOT NULL,
    after    text NOT NULL,
    reason   text NOT NULL,
    calls    integer NOT NULL,
    failures integer NOT NULL
);

-- name: migration_0006
-- Dead letters, the fleet-wide degradation level and the event log. Only
-- failures hold an entry in the dead-letter index, so a success costs nothing
-- there; the leader also reads the newest failures from it.
CREATE INDEX IF NOT EXISTS corral_tasks_dead ON corral_tasks (id)
    WHERE status IN ('FAILED', 'TIMEOUT');
CREATE TABLE IF NOT EXISTS corral_fleet (
    id          integer PRIMARY KEY CHECK (id = 1),
    level       integer NOT NULL DEFAULT 0,
    manual      boolean NOT NULL DEFAULT false,
    calm_since  double precision,
    reason      text NOT NULL DEFAULT '',
    changed_at  double precision
);
CREATE TABLE IF NOT EXISTS corral_events (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      double precision NOT NULL,
    kind    text NOT NULL,
    subject text NOT NULL,
    data    text NOT NULL
);

-- name: migration_0007
-- The retry path: tasks waiting to be retried, in claim order. A claim with a
-- retry share reads them apart from fresh work; the index stays empty while
-- nothing fails, so looking costs nothing then.
CREATE INDEX IF NOT EXISTS corral_tasks_ready_retry ON corral_tasks (priority DESC, run_at, id)
    WHERE status = 'RETRYING';

-- name: migration_0008
-- Periodic schedules: the definitions workers store when they start (so
-- `corral periodic` lists them without the app) and what their last tick did;
-- one row per tick, written in the transaction that enqueues the tick's task,
-- whose primary key lets exactly one worker of the fleet win each tick.
CREATE TABLE IF NOT EXISTS corral_schedules (
    name         text PRIMARY KEY,
    task         text NOT NULL,
    expr         text NOT NULL,
    timezone     text NOT NULL,
    queue        text NOT NULL,
    group_key    text,
    overlap      boolean NOT NULL,
    catch_up     text NOT NULL,
    max_delay    double precision,
    created_at   double precision NOT NULL,
    updated_at   double precision NOT NULL,
    last_tick    bigint,
    last_outcome text,
    last_task_id bigint
);
CREATE TABLE IF NOT EXISTS corral_schedule_ticks (
    schedule text NOT NULL,
    tick     bigint NOT NULL,
    outcome  text NOT NULL,
    task_id  bigint,
    at       double precision NOT NULL,
    PRIMARY KEY (schedule, tick)
);

-- name: migration_0013
-- Batch settings: a batch's on_complete callback (a task template, JSON) and
-- when it was settled, i.e. its callback submitted; a settled batch never gets
-- a second one. Its concurrency is the named limit 'batch:<name>'. The index
-- holds a batch's unfinished tasks: whether it ended is one probe.
CREATE TABLE IF NOT EXISTS corral_batches (
    name        text PRIMARY KEY,
    on_complete text,
    settled_at  float8,
    callback_id bigint
);
CREATE INDEX IF NOT EXISTS corral_tasks_batch_active ON corral_tasks (batch)
    WHERE batch IS NOT NULL AND status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING');

-- name: migration_0014
-- The dashboard's reads: tasks by finish time (the charts read the last
-- minutes); search by trace id and by group in any state; a batch's tasks per
-- state counted from the index alone.
CREATE INDEX IF NOT EXISTS corral_tasks_finished ON corral_tasks (finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS corral_tasks_trace ON corral_tasks (trace_id)
    WHERE trace_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS corral_tasks_group_all ON corral_tasks (group_key, id)
    WHERE group_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS corral_tasks_batch_status ON corral_tasks (batch, status)
    WHERE batch IS NOT NULL;

-- name: migration_0018
-- Priorities with ageing: ready tasks are claimed by their rank, run_at (a
-- group head: ready_at) less priority x 60 s, so one priority level is worth a
-- minute of waiting and low priority still moves (core/priorities.py). The
-- claim-order indexes hold the rank, so a claim still reads them in order.
DROP INDEX IF EXISTS corral_tasks_ready_free;
CREATE INDEX corral_tasks_ready_free ON corral_tasks ((run_at - priority * 60::float8), id)
    WHERE status IN ('PENDING', 'RETRYING') AND group_key IS NULL;
DROP INDEX IF EXISTS corral_tasks_ready_heads;
CREATE INDEX corral_tasks_ready_heads ON corral_tasks ((ready_at - priority * 60::float8), id)
    WHERE status IN ('PENDING', 'RETRYING') AND is_head;
DROP INDEX IF EXISTS corral_tasks_ready_retry;
CREATE INDEX corral_tasks_ready_retry ON corral_tasks ((run_at - priority * 60::float8), id)
    WHERE status = 'RETRYING';

-- name: migration_0019
-- Task graphs: a task's local name in the graph it was submitted with, and
-- what an upstream's bad end does to it ('cancel', or 'run' anyway).
ALTER TABLE corral_tasks ADD COLUMN IF NOT EXISTS ref text;
ALTER TABLE corral_tasks ADD COLUMN IF NOT EXISTS on_upstream_failure text NOT NULL DEFAULT 'cancel';

-- name: migration_0020
-- One claim path, one index, by exact status: fresh ungrouped work (PENDING)
-- and retries (RETRYING) each have their own. An index holding both made the
-- planner read the retry path from the fresh one when the table had no
-- statistics yet (a queue just filled), walking every queued row per claim.
DROP INDEX IF EXISTS corral_tasks_ready_free;
CREATE INDEX IF NOT EXISTS corral_tasks_ready_fresh ON corral_tasks ((run_at - priority * 60::float8), id)
    WHERE status = 'PENDING' AND group_key IS NULL;
DROP INDEX IF EXISTS corral_tasks_ready_unlimited;
CREATE INDEX corral_tasks_ready_unlimited ON corral_tasks (queue, run_at)
    WHERE status = 'PENDING' AND cardinality(limits) = 0;

-- name: migration_0021
-- Vacuum the task table once 1 % of its rows changed, not PostgreSQL's
-- default 20 %: every claim and every completion leaves a dead row version
-- with its index entries, which the claim's index reads step over until a
-- vacuum removes them; at a million queued tasks the default waits for
-- 200 000 of them. Statistics follow sooner too (the claim plans read them).
ALTER TABLE corral_tasks SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);

-- name: migration_0022
-- A search by group reads a group's line (corral_tasks_group_block) and the
-- tasks that left it (this index): between them every grouped task, each in
-- one. The index of every grouped task took each submit's rows at as many
-- places as the batch had groups, and every claim's and outcome's new row
-- version again; these rows come in when a unit's tasks end, side by side.
DROP INDEX IF EXISTS corral_tasks_group_all;
CREATE INDEX IF NOT EXISTS corral_tasks_group_done ON corral_tasks (group_key, id)
    WHERE group_key IS NOT NULL
      AND (status IN ('SUCCESS', 'TIMEOUT', 'CANCELED')
           OR (status = 'FAILED' AND NOT halt_group_on_failure));

-- name: migration_0023
-- The event stream. Task events are written by statement triggers in the
-- statement that changed the tasks (one multi-row insert per claim or batch of
-- completions; every path is covered, a rolled-back write leaves no event).
-- Identity ids are handed out before commit, so a later id can commit first:
-- a reader remembers the ids it has not seen below the highest it delivered
-- and reads them again until the transactions that could still commit them
-- have ended (see read_events), so no event is ever skipped. The kinds are
-- those of corral.core.events.
--
-- Followers are woken by NOTIFY corral_events from the writes that are not on
-- the claim/complete path (breakers, levels, add_event) and by the
-- corral_work notifications submits already send; otherwise they look every
-- 0.1 s. A NOTIFY in every claim and completion would serialise their commits
-- (PostgreSQL takes one lock for the notification queue at commit): it cost
-- a third of the claim/complete rate when measured.
--
-- Safe to run again (it replaces what it made), so it may be renumbered.

CREATE OR REPLACE FUNCTION corral_task_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;  -- the group-head refresh's own updates change no state
    END IF;
    IF TG_OP = 'INSERT' THEN
        -- a task handed to a waiting worker in its submit is inserted RUNNING:
        -- it was queued and started, as a claimed one is
        INSERT INTO corral_events (at, kind, subject, data)
        SELECT extract(epoch FROM now())::float8, e.kind, 'task:' || e.id, e.data FROM (
            SELECT n.id, 0 AS step, 'submitted' AS kind,
                   json_build_object(
                       'id', n.id, 'name', n.name, 'queue', n.queue,
                       'status', CASE WHEN n.status = 'RUNNING' THEN 'PENDING' ELSE n.status END, 'from', NULL,
                       'attempt', n.attempt, 'group', n.group_key, 'batch', n.batch, 'trace_id', n.trace_id,
                       'error', left(n.error, 500))::text AS data
            FROM new_rows n WHERE n.status <> 'SUCCESS'
            UNION ALL
            SELECT n.id, 1, 'started',
                   json_build_object(
                       'id', n.id, 'name', n.name, 'queue', n.queue, 'status', n.status, 'from', 'PENDING',
                       'attempt', n.attempt, 'group', n.group_key, 'batch', n.batch, 'trace_id', n.trace_id,
                       'error', NULL)::text
            FROM new_rows n WHERE n.status = 'RUNNING'
        ) e ORDER BY e.id, e.step;
    ELSE
        INSERT INTO corral_events (at, kind, subject, data)
        SELECT extract(epoch FROM now())::float8,
               CASE WHEN n.status IS NOT DISTINCT FROM o.status THEN 'progress'
                    WHEN n.status = 'RUNNING' THEN 'started' WHEN n.status = 'SUCCESS' THEN 'succeeded'
                    WHEN n.status = 'FAILED' THEN 'failed' WHEN n.status = 'RETRYING' THEN 'retrying'
                    WHEN n.status = 'PENDING' THEN 'queued' WHEN n.status = 'TIMEOUT' THEN 'timed_out'
                    WHEN n.status = 'CANCELED' THEN 'canceled' WHEN n.status = 'WAITING' THEN 'waiting'
                    ELSE lower(n.status) END,
               'task:' || n.id,
               CASE WHEN n.status IS NOT DISTINCT FROM o.status THEN
                   json_build_object('id', n.id, 'name', n.name, 'fraction', n.progress,
                                     'message', n.progress_message)::text
               ELSE json_build_object(
                   'id', n.id, 'name', n.name, 'queue', n.queue, 'status', n.status, 'from', o.status,
                   'attempt', n.attempt, 'group', n.group_key, 'batch', n.batch, 'trace_id', n.trace_id,
                   'error', left(n.error, 500))::text END
        FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE n.status IS DISTINCT FROM o.status
           OR (n.status = 'RUNNING' AND (n.progress IS DISTINCT FROM o.progress
                                         OR n.progress_message IS DISTINCT FROM o.progress_message))
        ORDER BY n.id;
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS corral_tasks_events_insert ON corral_tasks;
CREATE TRIGGER corral_tasks_events_insert AFTER INSERT ON corral_tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION corral_task_events();
DROP TRIGGER IF EXISTS corral_tasks_events_update ON corral_tasks;
CREATE TRIGGER corral_tasks_events_update AFTER UPDATE ON corral_tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION corral_task_events();

CREATE OR REPLACE FUNCTION corral_breaker_events_stream() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO corral_events (at, kind, subject, data)
    SELECT b.at, 'breaker', 'breaker:' || b.name,
           json_build_object('name', b.name, 'from', b.before, 'to', b.after, 'reason', b.reason)::text
    FROM new_rows b ORDER BY b.id;
    IF FOUND THEN
        PERFORM pg_notify('corral_events', '');
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS corral_breaker_events_stream ON corral_breaker_events;
CREATE TRIGGER corral_breaker_events_stream AFTER INSERT ON corral_breaker_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION corral_breaker_events_stream();

-- name: migration_0024
-- Offers: an idle worker's free slots while it waits for work on its
-- listening connection. A submit of one plain task (no group, no limit, due
-- now) takes an offer that fits and inserts the task already RUNNING under
-- the worker's new lease, with no start recorded (as a prefetch claim): one
-- durable commit instead of a submit's and a claim's. The worker withdraws
-- its offer when its wait ends and picks up the tasks it was given. Unlogged:
-- an offer lives for one wait, and writing one waits for no WAL flush.
CREATE UNLOGGED TABLE IF NOT EXISTS corral_offers (
    worker_id  text PRIMARY KEY,
    channel    text NOT NULL,
    queues     text[] NOT NULL,
    all_names  boolean NOT NULL,
    names      text[] NOT NULL,
    free       integer NOT NULL,
    lease      float8 NOT NULL,
    made_at    float8 NOT NULL,
    expires_at float8 NOT NULL,
    given      bigint[] NOT NULL DEFAULT '{}'
);

-- name: migration_0025
-- No statistics on status. A queue's statuses change all the time, and the
-- claim statements are generic plans that cannot know their LIMIT (the
-- planner assumes a tenth of the rows). After autovacuum analyzed a full
-- queue ("all 20 000 rows PENDING"), claim_plain became a sequential scan of
-- the whole table and a sort, every claim, where it walks the claim-order
-- index for n rows: a W1 run went from 2.7 s to 5-8 s. With no statistics
-- on the column the planner keeps its default estimate and the index walk.
-- (Statistics an older ANALYZE left for the column stay until the column's
-- statistics are cleared by a superuser; a new database has none.)
ALTER TABLE corral_tasks ALTER COLUMN status SET STATISTICS 0;

-- name: migration_0027
-- Runs a task lost with its worker (a lease that expired after its start):
-- a crash re-run gives the attempt back, so crashes are counted apart.
ALTER TABLE corral_tasks ADD COLUMN IF NOT EXISTS crashes integer NOT NULL DEFAULT 0;

-- name: migration_0028
-- A failed attempt keeps its traceback (bounded by the worker, see
-- corral/core/texts.py), beside its error.
ALTER TABLE corral_tasks ADD COLUMN IF NOT EXISTS traceback text;

-- name: migration_0033
-- A limit's log of recent starts: a sliding window's (JSON, see
-- corral.core.rates.Window). "N/s" holds at most N starts in any second.
ALTER TABLE corral_limits ADD COLUMN IF NOT EXISTS starts text;

-- name: migration_0034
-- Worker processes: each writes its row every few seconds (heartbeat_at) and
-- deletes it when it stops cleanly; a row gone silent is a dead worker's,
-- listed with the tasks it still holds until the sweeper has taken their
-- leases back and clears it.
CREATE TABLE IF NOT EXISTS corral_workers (
    id           text PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    queues       text[] NOT NULL,
    slots        integer NOT NULL,
    in_use       integer NOT NULL,
    version      text NOT NULL,
    beat_every   double precision NOT NULL,
    started_at   double precision NOT NULL,
    heartbeat_at double precision NOT NULL
);

-- name: migration_0035
-- An index of held rows by worker was tried here for Store.held_tasks and cost
-- every claim an index insert (no-op W1 about 10 % slower on PostgreSQL): the
-- held rows are bounded by the fleet's slots and read through
-- corral_tasks_running instead.
DROP INDEX IF EXISTS corral_tasks_held_by_worker;

-- name: migration_0036
-- Each minute's figures per queue and task name, written by the sweeper's
-- leader and kept a day (corral.core.minutes): what the dashboard's Over
-- time page draws.
CREATE TABLE IF NOT EXISTS corral_minute_stats (
    minute   bigint NOT NULL,
    queue    text   NOT NULL,
    name     text   NOT NULL,
    done     integer NOT NULL,
    failed   integer NOT NULL,
    depth    integer NOT NULL,
    dur_p50  double precision,
    dur_p99  double precision,
    wait_p50 double precision,
    wait_p99 double precision,
    PRIMARY KEY (minute, queue, name)
);

-- name: migration_0037
-- Debounce and supersede keys (docs/keys.md). The debounce index is not
-- unique: submits of one key take a transaction's advisory lock on it
-- (debounce_lock), and a task handed back to PENDING after a newer submit of
-- its key must not fail.
ALTER TABLE corral_tasks ADD COLUMN IF NOT EXISTS debounce_key text;
ALTER TABLE corral_tasks ADD COLUMN IF NOT EXISTS supersede_key text;
CREATE INDEX IF NOT EXISTS corral_tasks_debounce ON corral_tasks (name, debounce_key)
    WHERE debounce_key IS NOT NULL AND status = 'PENDING';
CREATE INDEX IF NOT EXISTS corral_tasks_supersede ON corral_tasks (name, supersede_key)
    WHERE supersede_key IS NOT NULL AND status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING');

-- name: migration_0040
-- Keyed limits' keys in a table of their own: a key's row holds its own
-- bucket, log of starts and pause (its settings are its limit's), made when a
-- rate first charges it or a 429 pauses it, and deleted when the key is idle
-- with its budget whole. A submit makes no row; a claim reads the rows of its
-- candidates' keys only. Rows of keys made in corral_limits before move here.
CREATE TABLE IF NOT EXISTS corral_limit_keys (
    name         text PRIMARY KEY,
    tokens       double precision,
    counted_at   double precision,
    starts       text,
    paused_until double precision
);
INSERT INTO corral_limit_keys (name, tokens, counted_at, starts, paused_until)
SELECT name, tokens, counted_at, starts, paused_until FROM corral_limits WHERE strpos(name, chr(31)) > 0
ON CONFLICT (name) DO NOTHING;
DELETE FROM corral_limits WHERE strpos(name, chr(31)) > 0;
-- name: migration_0038
-- A deadline for a task's first start (docs/keys.md) and why a running task
-- was asked to stop. The index holds only tasks with a deadline: a task
-- without one writes no entry, and the column never changes (HOT updates stay).
ALTER TABLE corral_tasks ADD COLUMN IF NOT EXISTS expires_at float8;
ALTER TABLE corral_tasks ADD COLUMN IF NOT EXISTS cancel_reason text;
CREATE INDEX IF NOT EXISTS corral_tasks_expires ON corral_tasks (expires_at)
    WHERE expires_at IS NOT NULL;
-- name: migration_0039
-- Pauses by hand (core/pauses.py): a queue, a group or a limit no claim takes
-- work of while its row is here. Every claim reads them in its own snapshot
-- (the claim statement's "paused"); apart from a limit's paused_until (a
-- 429's pause), so neither ends the other.
CREATE TABLE IF NOT EXISTS corral_pauses (
    kind      text NOT NULL CHECK (kind IN ('queue', 'group', 'limit')),
    name      text NOT NULL,
    paused_at double precision NOT NULL,
    paused_by text NOT NULL DEFAULT '',
    PRIMARY KEY (kind, name)
);
-- name: migration_0041
-- Limits changed while running (docs/flow-control.md): whether a limit is
-- keyed, who changed its settings in force (NULL: as declared), the declared
-- settings kept aside meanwhile (JSON), and when its settings last changed.
ALTER TABLE corral_limits ADD COLUMN IF NOT EXISTS per_key boolean NOT NULL DEFAULT false;
ALTER TABLE corral_limits ADD COLUMN IF NOT EXISTS set_by text;
ALTER TABLE corral_limits ADD COLUMN IF NOT EXISTS declared text;
ALTER TABLE corral_limits ADD COLUMN IF NOT EXISTS changed_at double precision;
-- name: migration_0043
-- Adaptive limits (corral.core.adaptive): the spec (which knobs adapt, the
-- bounds) and the controller's state in the limit's row, whose concurrency
-- and rate hold the effective values the claims obey; the workers' reports,
-- one row per worker and second, taken by the sweeper's leader.
ALTER TABLE corral_limits ADD COLUMN IF NOT EXISTS adaptive text;
ALTER TABLE corral_limits ADD COLUMN IF NOT EXISTS controller text;
CREATE TABLE IF NOT EXISTS corral_limit_reports (
    id      bigserial PRIMARY KEY,
    worker  text NOT NULL,
    at      double precision NOT NULL,
    reports text NOT NULL
);
CREATE INDEX IF NOT EXISTS corral_limit_reports_worker ON corral_limit_reports (worker, at);
-- name: migration_0047
-- A keyed adaptive limit's keys learn their own values: a key's row holds
-- the concurrency and rate its controller decided (NULL: the limit's) and
-- the controller's state (JSON, with when the key last had a call).
ALTER TABLE corral_limit_keys ADD COLUMN IF NOT EXISTS concurrency integer;
ALTER TABLE corral_limit_keys ADD COLUMN IF NOT EXISTS rate text;
ALTER TABLE corral_limit_keys ADD COLUMN IF NOT EXISTS controller text;

-- name: migration_0048
-- Offers move to a table keyed by the worker and the wait (each wait's offer
-- a row of its own). Keyed by the worker alone, every offer of a worker was
-- one key: each wait deletes its row and the next inserts it again, and with
-- one transaction left open (xmin horizon pinned) none of those row versions
-- or their index entries can be removed, so each lookup of the offer (the
-- next offer, its withdraw, a submit handing a task over) stepped over all
-- of them (1 400 index entries a lookup 90 s into a pin at 200 tasks/s).
-- The old table stays for a corral of before this migration still running:
-- its workers' offers are not seen by submits of this one (their work comes
-- by claims), nor this one's by theirs.
CREATE UNLOGGED TABLE IF NOT EXISTS corral_open_offers (
    worker_id  text NOT NULL,
    n          bigint NOT NULL,
    channel    text NOT NULL,
    queues     text[] NOT NULL,
    all_names  boolean NOT NULL,
    names      text[] NOT NULL,
    free       integer NOT NULL,
    lease      float8 NOT NULL,
    made_at    float8 NOT NULL,
    expires_at float8 NOT NULL,
    given      bigint[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (worker_id, n)
);

-- name: migration_0050
-- The gates of a one-statement claim, read after it has taken their locks.
-- A statement sees the database as of its start, so a count of places made
-- in the statement that waited for a limit's lock would miss the places the
-- claim that held it took and committed meanwhile (over the cap); the
-- queries of a VOLATILE function each see a fresh snapshot, taken after the
-- locks (pg_advisory_xact_lock, released at the holder's commit, once its
-- rows are visible). Per name (a limit, or a keyed limit's key): the places
-- held (one per lease token), the cap (the key's own concurrency, written by
-- an adaptive limit, else the limit's; NULL: none) and whether the cap is its
-- only gate (no rate, no pause in force, no breaker but CLOSED). Its plan is
-- kept for the session's life: planned while the tables were small it read
-- every place held for each name (12 ms at 10 000 held), so it reads by
-- index whatever their size then.
CREATE OR REPLACE FUNCTION corral_gate_places(names text[])
RETURNS TABLE (name text, held bigint, cap integer, simple boolean)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT n.name,
           (SELECT count(DISTINCT h.lease_token) FROM corral_held_places h WHERE h.name = n.name),
           coalesce(k.concurrency, l.concurrency),
           (l.name IS NULL OR (l.rate IS NULL AND coalesce(l.paused_until, 0) <= extract(epoch FROM now())::float8))
           AND (k.name IS NULL OR (k.rate IS NULL AND coalesce(k.paused_until, 0) <= extract(epoch FROM now())::float8))
           AND NOT EXISTS (SELECT 1 FROM corral_pauses p WHERE p.kind = 'limit' AND p.name = split_part(n.name, chr(31), 1))
           AND NOT EXISTS (SELECT 1 FROM corral_breakers b
                           WHERE b.state_name <> 'CLOSED' AND b.name IN (n.name, split_part(n.name, chr(31), 1)))
    FROM unnest(names) AS n(name)
    LEFT JOIN corral_limits l ON l.name = split_part(n.name, chr(31), 1)
    LEFT JOIN LATERAL (SELECT c.* FROM corral_limit_keys c
                       WHERE strpos(n.name, chr(31)) > 0 AND c.name = n.name LIMIT 1) k ON true;
END $$;

-- name: migration_0046
-- The places held under each limit: a row per running task and limit it
-- names, with its lease token (a place is a claim: the distinct tokens of a
-- limit's rows), kept by triggers in the transaction that changed the task,
-- so every path that starts or ends a running task (claim, completion,
-- hand-back, sweep, cancel, retention) keeps it exact. A claim counts a
-- limit's places from this table's rows of that name; counting the running
-- rows' limits read every running limited task. A row per task, not a count
-- per token: a task's trigger writes its own rows only, so two transactions
-- ending tasks of one token never wait on each other's row.
CREATE TABLE IF NOT EXISTS corral_held_places (
    task_id     bigint NOT NULL,
    name        text NOT NULL,
    lease_token text NOT NULL,
    PRIMARY KEY (task_id, name)
);
CREATE INDEX IF NOT EXISTS corral_held_places_name ON corral_held_places (name, lease_token);
CREATE OR REPLACE FUNCTION corral_held_places() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.status = 'RUNNING' AND cardinality(OLD.limits) > 0 THEN
        IF TG_OP = 'UPDATE' AND NEW.status = 'RUNNING' AND NEW.lease_token IS NOT DISTINCT FROM OLD.lease_token
           AND NEW.limits IS NOT DISTINCT FROM OLD.limits THEN
            RETURN NULL;  -- held on as it was
        END IF;
        DELETE FROM corral_held_places WHERE task_id = OLD.id;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status = 'RUNNING' AND cardinality(NEW.limits) > 0 THEN
        INSERT INTO corral_held_places (task_id, name, lease_token)
        SELECT DISTINCT NEW.id, n, coalesce(NEW.lease_token, '') FROM unnest(NEW.limits) AS n
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
-- The triggers first: they lock the table against writes until the rows
-- below are in and this commits.
DROP TRIGGER IF EXISTS corral_held_places_insert ON corral_tasks;
CREATE TRIGGER corral_held_places_insert AFTER INSERT ON corral_tasks
    FOR EACH ROW WHEN (NEW.status = 'RUNNING' AND cardinality(NEW.limits) > 0)
    EXECUTE FUNCTION corral_held_places();
DROP TRIGGER IF EXISTS corral_held_places_update ON corral_tasks;
CREATE TRIGGER corral_held_places_update AFTER UPDATE OF status, lease_token, limits ON corral_tasks
    FOR EACH ROW WHEN ((OLD.status = 'RUNNING' AND cardinality(OLD.limits) > 0)
                       OR (NEW.status = 'RUNNING' AND cardinality(NEW.limits) > 0))
    EXECUTE FUNCTION corral_held_places();
DROP TRIGGER IF EXISTS corral_held_places_delete ON corral_tasks;
CREATE TRIGGER corral_held_places_delete AFTER DELETE ON corral_tasks
    FOR EACH ROW WHEN (OLD.status = 'RUNNING' AND cardinality(OLD.limits) > 0)
    EXECUTE FUNCTION corral_held_places();
DELETE FROM corral_held_places;
INSERT INTO corral_held_places (task_id, name, lease_token)
SELECT DISTINCT t.id, n, coalesce(t.lease_token, '')
FROM corral_tasks t, unnest(t.limits) AS n
WHERE t.status = 'RUNNING' AND cardinality(t.limits) > 0;

-- name: migration_0045
-- Task events kept narrow: the task's id, the state it reached, the one it
-- left and the attempt, with the JSON made when the event is read (the view
-- corral_events_read joins the task's row for its name, queue, group, batch,
-- trace id and error), as the SQLite store does. Building a JSON text per
-- event inside every claim's and completion's statement cost their commits
-- time and made each event row several times wider. Events written before
-- keep their JSON in data (task_id NULL). Safe to run again.
ALTER TABLE corral_events ADD COLUMN IF NOT EXISTS task_id bigint;
ALTER TABLE corral_events ADD COLUMN IF NOT EXISTS status text;
ALTER TABLE corral_events ADD COLUMN IF NOT EXISTS prior text;
ALTER TABLE corral_events ADD COLUMN IF NOT EXISTS attempt integer;
CREATE OR REPLACE VIEW corral_events_read AS
SELECT e.id, e.at, e.kind,
       CASE WHEN e.task_id IS NULL THEN e.subject ELSE 'task:' || e.task_id END AS subject,
       CASE WHEN e.task_id IS NULL THEN e.data ELSE json_build_object(
           'id', e.task_id, 'name', t.name, 'queue', t.queue, 'status', e.status, 'from', e.prior,
           'attempt', e.attempt, 'group', t.group_key, 'batch', t.batch, 'trace_id', t.trace_id,
           'error', CASE WHEN e.status IN ('FAILED', 'RETRYING', 'TIMEOUT', 'CANCELED')
                         THEN left(t.error, 500) END)::text END AS data
FROM corral_events e LEFT JOIN corral_tasks t ON t.id = e.task_id;

CREATE OR REPLACE FUNCTION corral_task_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;  -- the group-head refresh's own updates change no state
    END IF;
    IF TG_OP = 'INSERT' THEN
        -- a task handed to a waiting worker in its submit is inserted RUNNING:
        -- it was queued and started, as a claimed one is
        INSERT INTO corral_events (at, kind, subject, data, task_id, status, prior, attempt)
        SELECT extract(epoch FROM now())::float8, e.kind, '', '', e.id, e.status, e.prior, e.attempt FROM (
            SELECT n.id, 0 AS step, 'submitted' AS kind,
                   CASE WHEN n.status = 'RUNNING' THEN 'PENDING' ELSE n.status END AS status,
                   NULL::text AS prior, n.attempt
            FROM new_rows n WHERE n.status <> 'SUCCESS'
            UNION ALL
            SELECT n.id, 1, 'started', n.status, 'PENDING', n.attempt
            FROM new_rows n WHERE n.status = 'RUNNING'
        ) e ORDER BY e.id, e.step;
    ELSE
        INSERT INTO corral_events (at, kind, subject, data, task_id, status, prior, attempt)
        SELECT extract(epoch FROM now())::float8, x.kind, x.subject, x.data, x.task_id, x.status, x.prior, x.attempt
        FROM (
            SELECT n.id AS tid,
                   CASE WHEN n.status = 'RUNNING' THEN 'started' WHEN n.status = 'SUCCESS' THEN 'succeeded'
                        WHEN n.status = 'FAILED' THEN 'failed' WHEN n.status = 'RETRYING' THEN 'retrying'
                        WHEN n.status = 'PENDING' THEN 'queued' WHEN n.status = 'TIMEOUT' THEN 'timed_out'
                        WHEN n.status = 'CANCELED' THEN 'canceled' WHEN n.status = 'WAITING' THEN 'waiting'
                        ELSE lower(n.status) END AS kind,
                   '' AS subject, '' AS data, n.id AS task_id, n.status, o.status AS prior, n.attempt
            FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE n.status IS DISTINCT FROM o.status
            UNION ALL
            -- progress keeps its JSON: it says what the task reported then
            SELECT n.id, 'progress', 'task:' || n.id,
                   json_build_object('id', n.id, 'name', n.name, 'fraction', n.progress,
                                     'message', n.progress_message)::text,
                   NULL, NULL, NULL, NULL
            FROM new_rows n JOIN old_rows o ON o.id = n.id
            WHERE n.status = 'RUNNING' AND n.status IS NOT DISTINCT FROM o.status
              AND (n.progress IS DISTINCT FROM o.progress OR n.progress_message IS DISTINCT FROM o.progress_message)
        ) x ORDER BY x.tid;
    END IF;
    RETURN NULL;
END
$$;

-- name: migration_0049
-- The event stream without a dead row per event. Trimming by DELETE left
-- every trimmed event a dead row, and with one transaction left open (xmin
-- horizon pinned) none can be removed: the table and its index grow by what
-- is trimmed, and the readers step over it. corral_events is now a ring of
-- 16 partitions by id (ids n * 65536 .. n * 65536 + 65535 go to partition
-- n mod 16), and trimming is in two steps that delete no row:
-- * the floor (the sequence corral_events_floor: a value changed in place,
--   no row version per change) moves up to the last trimmed id, exactly as
--   the rules say (newest N, none older than the cut); corral_events_read
--   and the stream's start show only ids above it;
-- * a partition whose every row is at or below the floor is emptied by
--   TRUNCATE (corral_events_truncate), which hands its files back at once.
--   TRUNCATE needs the partition to itself: it waits a moment at most (the
--   caller's lock_timeout) and is tried again at the next trim. Inserts lock
--   only the partition their rows go to (not the spent ones), so writers
--   never wait behind it; a reader of the stream may wait that moment.
-- A spent partition is emptied before ids come round to it again unless a
-- session holds it for all of the ring's 1 M ids; then new ids share it with
-- hidden ones until both are below the floor (storage grows, no event shown
-- is lost). Ids still come from one sequence, in order (partitioned tables
-- have no identity columns in PostgreSQL 15). A corral of before this
-- migration still running writes and reads the new table by name; its
-- trimming deletes rows as before. The copy of the events kept holds the
-- table meanwhile (inserts wait for it: about a second for 100 000 events).
DO $$
DECLARE
    last bigint;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'corral_events'::regclass) = 'p' THEN
        RETURN;  -- done already
    END IF;
    LOCK TABLE corral_events IN ACCESS EXCLUSIVE MODE;
    DROP VIEW IF EXISTS corral_events_read;
    ALTER TABLE corral_events RENAME TO corral_events_v48;
    last := greatest(
        coalesce(pg_sequence_last_value(pg_get_serial_sequence('corral_events_v48', 'id')::regclass), 0),
        coalesce((SELECT max(id) FROM corral_events_v48), 0));
    CREATE SEQUENCE corral_events_ids;
    PERFORM setval('corral_events_ids', greatest(last, 1), last > 0);
    CREATE TABLE corral_events (
        id      bigint NOT NULL DEFAULT nextval('corral_events_ids'),
        at      double precision NOT NULL,
        kind    text NOT NULL,
        subject text NOT NULL,
        data    text NOT NULL,
        task_id bigint,
        status  text,
        prior   text,
        attempt integer
    ) PARTITION BY LIST (((id / 65536) % 16));
    ALTER SEQUENCE corral_events_ids OWNED BY corral_events.id;
    FOR n IN 0..15 LOOP
        EXECUTE format('CREATE TABLE corral_events_p%s PARTITION OF corral_events FOR VALUES IN (%s)',
                       lpad(n::text, 2, '0'), n);
    END LOOP;
    CREATE INDEX corral_events_id ON corral_events (id);
    INSERT INTO corral_events (id, at, kind, subject, data, task_id, status, prior, attempt)
    SELECT id, at, kind, subject, data, task_id, status, prior, attempt FROM corral_events_v48 ORDER BY id;
    DROP TABLE corral_events_v48;
END
$$;
CREATE SEQUENCE IF NOT EXISTS corral_events_floor MINVALUE 0 START 0;
CREATE OR REPLACE VIEW corral_events_read AS
SELECT e.id, e.at, e.kind,
       CASE WHEN e.task_id IS NULL THEN e.subject ELSE 'task:' || e.task_id END AS subject,
       CASE WHEN e.task_id IS NULL THEN e.data ELSE json_build_object(
           'id', e.task_id, 'name', t.name, 'queue', t.queue, 'status', e.status, 'from', e.prior,
           'attempt', e.attempt, 'group', t.group_key, 'batch', t.batch, 'trace_id', t.trace_id,
           'error', CASE WHEN e.status IN ('FAILED', 'RETRYING', 'TIMEOUT', 'CANCELED')
                         THEN left(t.error, 500) END)::text END AS data
FROM corral_events e LEFT JOIN corral_tasks t ON t.id = e.task_id
WHERE e.id > (SELECT last_value FROM corral_events_floor);

-- The partitions holding rows, all of them at or below the floor.
CREATE OR REPLACE FUNCTION corral_events_spent() RETURNS SETOF regclass LANGUAGE plpgsql AS $$
DECLARE
    part regclass;
    hi bigint;
BEGIN
    FOR part IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'corral_events'::regclass
                ORDER BY inhrelid::regclass::text LOOP
        EXECUTE format('SELECT max(id) FROM %s', part) INTO hi;
        IF hi <= (SELECT last_value FROM corral_events_floor) THEN
            RETURN NEXT part;
        END IF;
    END LOOP;
END
$$;

-- Empty a spent partition: its lock is waited for wait_ms at most (then
-- lock_not_available is raised); under it (no insert can be under way in it
-- then) its rows are read again, and it is emptied only if none is above the
-- floor. Returns whether it was. Run it in a transaction of its own, so the
-- lock is held no longer than the TRUNCATE. It runs as the role that made
-- the tables (TRUNCATE is a privilege of its own: workers granted only
-- INSERT, UPDATE, DELETE and SELECT may still empty a spent partition).
CREATE OR REPLACE FUNCTION corral_events_truncate(part regclass, wait_ms integer) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    hi bigint;
BEGIN
    PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
    IF NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = 'corral_events'::regclass AND inhrelid = part) THEN
        RAISE EXCEPTION '% is not a partition of corral_events', part;
    END IF;
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', part);
    EXECUTE format('SELECT max(id) FROM %s', part) INTO hi;
    IF hi IS NULL OR hi > (SELECT last_value FROM corral_events_floor) THEN
        RETURN false;
    END IF;
    EXECUTE format('TRUNCATE %s', part);
    RETURN true;
END
$$;

-- name: status_statistics
-- Planner statistics on corral_tasks.status that an ANALYZE took before
-- migration_0025 (which stops new ones): with them a claim may read the whole
-- table. Only a superuser can remove them.
SELECT EXISTS (SELECT 1 FROM pg_stats
               WHERE schemaname = current_schema() AND tablename = 'corral_tasks'
                 AND attname = 'status');

-- Which server and database a connection is on, and whether it sees corral's
-- tables: a caller's connection given to a transactional submit must match.
-- name: whereami
SELECT current_database(), to_regclass('corral_tasks')::oid::bigint, pg_postmaster_start_time();

-- name: offer
-- Open a waiting worker's offer: a row of its own (the worker and the wait's
-- number %(n)s), in place of the worker's last one if still there (%(old)s):
-- spent (every task given under it came to the worker in its notification),
-- or left by a withdraw the server was away for (the tasks given under it
-- come back when their leases end). One number, not "= ANY(array)": with
-- that the planner looked the worker's rows up by the worker alone.
WITH old AS (
    DELETE FROM corral_open_offers WHERE worker_id = %(worker)s AND n = %(old)s::bigint
)
INSERT INTO corral_open_offers (worker_id, n, channel, queues, all_names, names, free, lease, made_at, expires_at)
SELECT %(worker)s, %(n)s, %(channel)s, %(queues)s::text[], %(all_names)s, %(names)s::text[], %(free)s,
       %(lease)s, c.now, c.now + %(ttl)s::float8
FROM (SELECT extract(epoch FROM now())::float8 AS now) c;

-- name: offer_withdraw
-- End the offer (waiting for a submit that is handing a task over under it
-- right now) and read the tasks given under it that the worker has not
-- received in their notifications: the ids given, with one row per such task
-- found. A task canceled meanwhile is not RUNNING any more and is left out;
-- one whose submit committed after this statement's snapshot (the one it
-- waited for) is read again by offer_given.
WITH gone AS (DELETE FROM corral_open_offers WHERE worker_id = %(worker)s AND n = %(n)s RETURNING given)
SELECT g.given AS offer_given, t.*
FROM gone g LEFT JOIN corral_tasks t
  ON t.id = ANY(g.given) AND t.id <> ALL(%(taken)s::bigint[])
 AND t.worker_id = %(worker)s AND (t.status || '') = 'RUNNING'
ORDER BY t.id;

-- name: offer_given
SELECT * FROM corral_tasks
WHERE id = ANY(%(ids)s::bigint[]) AND worker_id = %(worker)s AND (status || '') = 'RUNNING'
ORDER BY id;

-- name: now
SELECT extract(epoch FROM clock_timestamp())::float8;

-- name: tx_now
-- The transaction's clock: the time a claim charges tokens at.
SELECT extract(epoch FROM now())::float8;

-- name: dep_states
-- Mark (and so lock) the dependencies: a completion racing this submit either
-- ends first (and this sees its outcome) or waits for this commit and then
-- reads has_dependents = true from the row it updates.
WITH d AS (SELECT id FROM corral_tasks WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR UPDATE)
UPDATE corral_tasks t SET has_dependents = true FROM d WHERE t.id = d.id
RETURNING t.id, t.status;

-- name: submit
-- The new rows arrive as one JSON array (cheap to send: one parameter, no
-- per-column array encoding); their order is kept.
WITH clk AS (SELECT extract(epoch FROM now())::float8 AS now),
src AS (
    SELECT * FROM ROWS FROM (json_to_recordset(%(rows)s::json)
        AS (name text, args text, status text, queue text, priority int, max_retries int,
            timeout float8, grp text, batch text, key text, trace_id text, run_at float8,
            limits json, deps json, halt bool, error text, ref text, policy text, expires float8))
    WITH ORDINALITY AS s(name, args, status, queue, priority, max_retries, timeout,
                         grp, batch, key, trace_id, run_at, limits, deps, halt, error, ref, policy, expires, ord)
),
ins AS (
    INSERT INTO corral_tasks (name, args, status, queue, priority, max_retries, timeout,
                              group_key, batch, idem_key, trace_id, limits, depends_on,
                              halt_group_on_failure, created_at, run_at, error, finished_at,
                              ref, on_upstream_failure, expires_at)
    SELECT s.name, s.args, s.status, s.queue, s.priority, s.max_retries, s.timeout,
           s.grp, s.batch, s.key, s.trace_id,
           CASE WHEN s.limits IS NULL THEN '{}'::text[]
                ELSE ARRAY(SELECT json_array_elements_text(s.limits)) END,
           CASE WHEN s.deps IS NULL THEN '{}'::bigint[]
                ELSE ARRAY(SELECT json_array_elements_text(s.deps)::bigint) END,
           s.halt, clk.now, coalesce(s.run_at, clk.now), s.error,
           CASE WHEN s.status IN ('FAILED', 'CANCELED') THEN clk.now END,
           s.ref, coalesce(s.policy, 'cancel'), s.expires
    FROM src s, clk
    ORDER BY s.ord
    ON CONFLICT (idem_key) WHERE idem_key IS NOT NULL DO NOTHING
    RETURNING id, idem_key, depends_on, group_key, queue, status, limits
),
edges AS (
    INSERT INTO corral_deps (task_id, dep_id)
    SELECT DISTINCT i.id, d FROM ins i, unnest(i.depends_on) AS d
    ON CONFLICT DO NOTHING
),
grps AS (
    INSERT INTO corral_groups (group_key)
    SELECT DISTINCT group_key FROM ins WHERE group_key IS NOT NULL
    ON CONFLICT DO NOTHING
),
note AS (
    -- payload "queue" or "queue:g" when the new work is grouped or limited
    -- (workers then leave their fast path for plain tasks)
    SELECT pg_notify('corral_work', q.queue || CASE WHEN q.special THEN ':g' ELSE '' END)
    FROM (SELECT queue, bool_or(group_key IS NOT NULL OR cardinality(limits) > 0) AS special
          FROM ins WHERE status = 'PENDING' GROUP BY queue) q
)
SELECT id, idem_key, (SELECT count(*) FROM note) AS notified FROM ins ORDER BY id;

-- name: submit_one
-- One plain task due now (no group, no limit, no dependency), the way an
-- application submits as things happen: the same insert as submit's, without
-- its JSON decode and its statements for dependencies and groups (0.17 ms
-- less on the server, measured after 25 ms of quiet). It goes to a waiting
-- worker's offer when one fits, as in submit. Same result shape as submit.
WITH clk AS (SELECT extract(epoch FROM now())::float8 AS now),
offer AS MATERIALIZED (
    SELECT o.worker_id, o.n, o.channel, o.lease, replace(gen_random_uuid()::text, '-', '') AS token
    FROM corral_open_offers o, clk
    WHERE o.free > 0 AND o.expires_at > clk.now
      AND %(queue)s::text = ANY(o.queues)
      AND (o.all_names OR %(name)s::text = ANY(o.names))
      AND NOT EXISTS (SELECT 1 FROM corral_breakers b
                      WHERE b.name = %(name)s::text AND b.state_name <> 'CLOSED')
      AND NOT EXISTS (SELECT 1 FROM corral_pauses p WHERE p.kind = 'queue' AND p.name = %(queue)s::text)
    ORDER BY o.made_at, o.worker_id
    LIMIT 1
    FOR UPDATE OF o SKIP LOCKED
),
ins AS (
    INSERT INTO corral_tasks (name, args, status, queue, priority, max_retries, timeout, batch,
                              idem_key, trace_id, halt_group_on_failure, created_at, run_at, ref,
                              on_upstream_failure, lease_token, lease_expires_at, worker_id)
    SELECT %(name)s, %(args)s, CASE WHEN f.worker_id IS NULL THEN 'PENDING' ELSE 'RUNNING' END,
           %(queue)s, %(priority)s, %(max_retries)s, %(timeout)s, %(batch)s, %(key)s, %(trace_id)s,
           %(halt)s, clk.now, clk.now, %(ref)s, coalesce(%(policy)s, 'cancel'),
           f.token, clk.now + f.lease, f.worker_id
    FROM clk LEFT JOIN offer f ON true
    ON CONFLICT (idem_key) WHERE idem_key IS NOT NULL DO NOTHING
    RETURNING id, idem_key, status, worker_id, row_to_json(corral_tasks)::text AS row
),
took AS (
    -- the offer's own row, by its key (not the worker's alone: under a pinned
    -- xmin horizon that would step over every row its earlier offers left)
    UPDATE corral_open_offers o SET free = o.free - 1, given = o.given || i.id
    FROM ins i, offer f
    WHERE i.status = 'RUNNING' AND o.worker_id = f.worker_id AND o.n = f.n
)
-- the task itself rides in the worker's notification (the worker starts it
-- without reading it back); one too big for a notification is read back
SELECT i.id, i.idem_key,
       CASE WHEN i.status = 'RUNNING'
            THEN pg_notify(f.channel, CASE WHEN octet_length(i.row) <= %(max_note)s THEN i.row
                                           ELSE f.worker_id END)
            ELSE pg_notify('corral_work', %(queue)s::text) END AS notified
FROM ins i LEFT JOIN offer f ON true;

-- name: ids_by_key
SELECT idem_key, id FROM corral_tasks WHERE idem_key = ANY(%(keys)s::text[]);

-- fragment: gates
-- The gates in force, one row each: limits with a cap, a rate or a pause not
-- yet over, and breakers not CLOSED (on a limit or a task name). A claim
-- passes one only while holding its lock, and charges it (stores/postgres.py,
-- core/gates.py); the claim, its probe and the hand-over of a place read the
-- gates here. ``breaker``: a breaker's row; ``cap_only``: a limit whose one
-- gate is its cap (no rate, no pause in force).
SELECT l.name, false AS breaker,
       (l.rate IS NULL AND coalesce(l.paused_until, 0) <= extract(epoch FROM now())::float8) AS cap_only
FROM corral_limits l
WHERE l.concurrency IS NOT NULL OR l.rate IS NOT NULL OR l.paused_until > extract(epoch FROM now())::float8
UNION ALL
SELECT b.name, true, false FROM corral_breakers b WHERE b.state_name <> 'CLOSED'

-- fragment: key_full
-- Is a key the task ``t`` names full (all its places held)? Asked of the
-- candidates read only: the places of the keys they name, from
-- corral_held_places (finding every full key first read every running
-- keyed task's place).
EXISTS (SELECT 1 FROM unnest(t.limits) AS kn
        JOIN corral_limits kl ON kl.name = split_part(kn, chr(31), 1)
        WHERE strpos(kn, chr(31)) > 0 AND kl.concurrency IS NOT NULL
          AND (SELECT count(DISTINCT h.lease_token) FROM corral_held_places h WHERE h.name = kn) >= kl.concurrency)

-- fragment: places_held
-- The places held under the limit ``l``: one per claim (lease token) running
-- under it, whatever its tasks, but those of the tokens %(own)s.
-- (corral_held_places: the rows of that name only)
SELECT count(DISTINCT h.lease_token) FROM corral_held_places h
WHERE h.name = l.name AND NOT (h.lease_token = ANY(%(own)s::text[]))

-- name: claim_probe
-- Which gates have a ready task waiting? Empty for ungated work. (Two
-- branches, not one EXISTS (...) OR EXISTS (...): each stays a semi-join on
-- the queued rows' index; the OR made it a scan per gate, 10x slower.)
SELECT coalesce(array_agg(DISTINCT w.name ORDER BY w.name), '{}') FROM (
    SELECT g.name FROM ({{gates}}) g
    -- a keyed limit (%(keyed)s) gates its keys, never a task by its own name:
    -- looking for one would read every queued limited task
    WHERE NOT (g.name = ANY(%(keyed)s::text[])) AND EXISTS (
        SELECT 1 FROM corral_tasks t
        WHERE t.status IN ('PENDING', 'RETRYING') AND cardinality(t.limits) > 0
          AND g.name = ANY(t.limits)
          AND t.run_at <= extract(epoch FROM now())::float8
          AND t.queue = ANY(%(queues)s::text[]))
    UNION ALL
    SELECT g.name FROM ({{gates}}) g
    WHERE g.breaker AND EXISTS (
        SELECT 1 FROM corral_tasks t
        WHERE t.status IN ('PENDING', 'RETRYING') AND t.name = g.name
          AND t.run_at <= extract(epoch FROM now())::float8
          AND t.queue = ANY(%(queues)s::text[]))
) w;

-- name: key_probe
-- The keys (keyed limits' budgets, "<limit>\x1f<key>") of the first
-- %(m)s ready candidates of each path, in claim order, passing over keys
-- whose places are all held and the keys %(skip)s (found by a look before
-- this one: a hot key's backlog is passed over to find the keys after it):
-- the only keys a claim locks and reads. A key
-- with no row and no running task has its whole budget. Each part walks its
-- own path's claim-order index: the heads' and the retries' name no limit
-- count (any form of it let the planner read the index of every queued
-- limited task whole and sort it, 20 ms at 30 000), and the fresh part says
-- "cardinality >= 1", not the "> 0" of that index.)
WITH clk AS MATERIALIZED (SELECT extract(epoch FROM now())::float8 AS now)
SELECT coalesce(array_agg(DISTINCT n ORDER BY n), '{}') FROM (
    (SELECT t.limits FROM corral_tasks t
     WHERE t.status = 'PENDING' AND t.group_key IS NULL
       AND t.run_at <= (SELECT now FROM clk)
       AND t.queue = ANY(%(queues)s::text[])
       AND cardinality(t.limits) >= 1 AND NOT ({{key_full}})
       AND NOT (t.limits && %(skip)s::text[])
     ORDER BY (t.run_at - t.priority * 60::float8), t.id
     LIMIT %(m)s)
    UNION ALL
    (SELECT t.limits FROM corral_tasks t
     WHERE t.status IN ('PENDING', 'RETRYING') AND t.is_head
       AND t.ready_at <= (SELECT now FROM clk) AND t.run_at <= (SELECT now FROM clk)
       AND t.queue = ANY(%(queues)s::text[])
       AND NOT ({{key_full}})
       AND NOT (t.limits && %(skip)s::text[])
     ORDER BY (t.ready_at - t.priority * 60::float8), t.id
     LIMIT %(m)s)
    UNION ALL
    (SELECT t.limits FROM corral_tasks t
     WHERE t.status = 'RETRYING' AND t.group_key IS NULL
       AND t.run_at <= (SELECT now FROM clk)
       AND t.queue = ANY(%(queues)s::text[])
       AND NOT ({{key_full}})
       AND NOT (t.limits && %(skip)s::text[])
     ORDER BY (t.run_at - t.priority * 60::float8), t.id
     LIMIT %(m)s)
) c, unnest(c.limits) AS n
WHERE strpos(n, chr(31)) > 0;

-- name: unlimited_ready
-- Is there queued, due work under no limit? When every capped limit is full
-- this decides whether a claim can find anything at all.
SELECT EXISTS (
    SELECT 1 FROM corral_tasks
    WHERE status = 'PENDING' AND cardinality(limits) = 0
      AND queue = ANY(%(queues)s::text[])
      AND run_at <= extract(epoch FROM now())::float8
) OR EXISTS (
    SELECT 1 FROM corral_tasks
    WHERE status = 'RETRYING' AND cardinality(limits) = 0
      AND queue = ANY(%(queues)s::text[])
      AND run_at <= extract(epoch FROM now())::float8
);

-- name: limit_lock
SELECT pg_advisory_xact_lock(7429001, hashtext(n)) FROM unnest(%(names)s::text[]) AS n ORDER BY n;

-- name: handoff_allowed
-- Of the capped limits %(names)s an ended unit held a place of, those that
-- may pass it to a successor without their lock: a cap its one gate (no rate:
-- a claim charges a token; no pause), no breaker (its outcomes are counted
-- after this), %(n)s places free once the ended units' outcomes are written
-- (not over a cap lowered meanwhile), and the first work waiting under the
-- limit is work of this worker's queues and tasks: otherwise the place is
-- freed for every worker, so one that runs other queues under the same limit
-- is not shut out. A relay's place is still held by its running predecessor
-- (%(own)s, its token): it counts as free for its successor.
SELECT l.name FROM corral_limits l JOIN ({{gates}}) g ON g.name = l.name AND NOT g.breaker
WHERE l.name = ANY(%(names)s::text[]) AND l.concurrency IS NOT NULL AND g.cap_only
  AND NOT EXISTS (SELECT 1 FROM corral_breakers b WHERE b.name = l.name)
  AND l.concurrency - ({{places_held}}) >= %(n)s
  AND coalesce((SELECT w.queue = ANY(%(queues)s::text[]) AND (%(all_names)s::bool OR w.name = ANY(%(task_names)s::text[]))
                FROM corral_tasks w
                WHERE w.status IN ('PENDING', 'RETRYING') AND cardinality(w.limits) > 0
                  AND l.name = ANY(w.limits) AND w.run_at <= extract(epoch FROM now())::float8
                ORDER BY w.priority DESC, w.run_at, w.id LIMIT 1), true);

-- name: limit_free
-- The places free under the capped limits %(names)s (%(own)s: none).
SELECT l.name, l.concurrency - ({{places_held}}) AS free
FROM corral_limits l
WHERE l.concurrency IS NOT NULL AND l.name = ANY(%(names)s::text[]);

-- name: claim
-- One statement: lock up to n ungrouped candidates and up to n group heads
-- (SKIP LOCKED, in claim order), keep the best n, add chunk followers, and
-- move them all to RUNNING. A task under a capped limit not in %(allowed)s
-- is never a candidate; a prefetch takes no task naming a
-- limit and records no start.
WITH RECURSIVE
-- A claim commits durably, like submits and completions: a claim the
-- database forgot in a crash would make its task claimable again while its
-- first run still goes on (two in flight, in a group too).
clk AS MATERIALIZED (SELECT extract(epoch FROM now())::float8 AS now),
-- pauses by hand: no task of a paused queue or group, or naming a paused
-- limit (any key of a keyed one), is a candidate or a chunk member
paused AS MATERIALIZED (
    SELECT coalesce(array_agg(p.name) FILTER (WHERE p.kind = 'queue'), '{}')::text[] AS queues,
           coalesce(array_agg(p.name) FILTER (WHERE p.kind = 'group'), '{}')::text[] AS groups,
           coalesce(array_agg(p.name) FILTER (WHERE p.kind = 'limit'), '{}')::text[] AS limits
    FROM corral_pauses p
),
-- the gates in force (the fragment "gates") this claim may not pass unless
-- the caller, holding their locks, allows them
barred AS MATERIALIZED (
    SELECT coalesce(array_agg(DISTINCT g.name), '{}')::text[] AS names FROM ({{gates}}) g
    WHERE NOT (g.name = ANY(%(allowed)s::text[]))
),
-- the same names as rows, for an anti-join: with few task names the planner
-- takes "name <> ALL(array)" for "no row" and sorts every candidate
barred_names AS MATERIALIZED (SELECT unnest(names) AS name FROM barred),
free_locked AS MATERIALIZED (
    SELECT t.id, t.priority, t.run_at AS elig, t.group_key, t.limits, t.name
    FROM corral_tasks t
    WHERE t.status = 'PENDING' AND t.group_key IS NULL AND NOT %(only_retries)s::bool
      AND t.run_at <= (SELECT now FROM clk)
      AND t.queue = ANY(%(queues)s::text[])
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))
      AND NOT (t.limits && (SELECT names FROM barred))
      -- a filter (OFFSET 0 keeps it from becoming a join): the walk of the
      -- claim-order index stops after n rows. As a hash anti-join, chosen
      -- once ANALYZE had sized the table, every queued row was read and
      -- sorted on each claim (9 -> 45 ms at 20 000 queued)
      AND NOT EXISTS (SELECT 1 FROM barred_names bn WHERE bn.name = t.name OFFSET 0)
      AND NOT (%(prefetch)s::bool AND cardinality(t.limits) > 0)
      -- a key (a keyed limit's budget) only when the caller, holding its lock, allows it
      AND NOT EXISTS (SELECT 1 FROM unnest(t.limits) AS kn
                      WHERE strpos(kn, chr(31)) > 0 AND NOT (kn = ANY(%(keys)s::text[])))
      -- never a task past the deadline of its first start (the sweeper ends it)
      AND (t.expires_at IS NULL OR t.expires_at > (SELECT now FROM clk) OR t.attempt > 0 OR t.snoozes > 0)
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))
      AND (cardinality(t.limits) = 0 OR cardinality((SELECT limits FROM paused)) = 0
           OR NOT EXISTS (SELECT 1 FROM unnest(t.limits) AS x
                          WHERE split_part(x, chr(31), 1) = ANY((SELECT limits FROM paused)::text[])))
      AND ((t.run_at - t.priority * 60::float8), t.id) >= (%(lo_rank)s::float8, %(lo_id)s::bigint)  -- marked
    ORDER BY (t.run_at - t.priority * 60::float8), t.id
    LIMIT %(n)s
    FOR UPDATE OF t SKIP LOCKED
),
free_new AS MATERIALIZED (  -- marked
    SELECT t.id, t.priority, t.run_at AS elig, t.group_key, t.limits, t.name  -- marked
    FROM corral_tasks t  -- marked
    -- from the ready rows' (queue, run_at) index: "num_nulls" (not "group_key  -- marked
    -- IS NULL") keeps the planner off the claim-order index, whose walk  -- marked
    -- (the dead rows before the mark) this is here to avoid  -- marked
    WHERE t.status = 'PENDING' AND num_nulls(t.group_key) = 1 AND NOT %(only_retries)s::bool  -- marked
      AND cardinality(t.limits) = 0  -- marked
      AND t.queue = ANY(%(queues)s::text[])  -- marked
      AND t.run_at > %(since)s::float8 AND t.run_at <= (SELECT now FROM clk)  -- marked
      AND NOT (((t.run_at - t.priority * 60::float8) + 0, t.id) >= (%(lo_rank)s::float8, %(lo_id)s::bigint))  -- marked
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))  -- marked
      AND NOT EXISTS (SELECT 1 FROM barred_names bn WHERE bn.name = t.name OFFSET 0)  -- marked
      AND (t.expires_at IS NULL OR t.expires_at > (SELECT now FROM clk) OR t.attempt > 0 OR t.snoozes > 0)  -- marked
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))  -- marked
    ORDER BY (t.run_at - t.priority * 60::float8) + 0, t.id  -- marked
    LIMIT %(n)s  -- marked
    FOR UPDATE OF t SKIP LOCKED  -- marked
),  -- marked
-- Ready group heads straight from their index, in claim order (priority, then
-- round-robin ready_at). The flag only finds candidates: the exact rule is
-- checked again here (no earlier task holds the group's place, nothing of the
-- group runs), so two claimers can never hold two tasks of one group.
heads_locked AS MATERIALIZED (
    SELECT t.id, t.priority, t.ready_at AS elig, t.group_key, t.limits, t.name
    FROM corral_tasks t
    WHERE t.status IN ('PENDING', 'RETRYING') AND t.is_head
      AND t.ready_at <= (SELECT now FROM clk)
      AND t.run_at <= (SELECT now FROM clk)
      AND t.queue = ANY(%(queues)s::text[])
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))
      AND (NOT %(only_retries)s::bool OR t.status = 'RETRYING')
      AND (%(share)s::float8 IS NULL OR t.status = 'PENDING')
      AND NOT (t.limits && (SELECT names FROM barred))
      AND NOT EXISTS (SELECT 1 FROM barred_names bn WHERE bn.name = t.name)
      AND NOT (%(prefetch)s::bool AND cardinality(t.limits) > 0)
      -- a key (a keyed limit's budget) only when the caller, holding its lock, allows it
      AND NOT EXISTS (SELECT 1 FROM unnest(t.limits) AS kn
                      WHERE strpos(kn, chr(31)) > 0 AND NOT (kn = ANY(%(keys)s::text[])))
      -- never a task past the deadline of its first start (the sweeper ends it)
      AND (t.expires_at IS NULL OR t.expires_at > (SELECT now FROM clk) OR t.attempt > 0 OR t.snoozes > 0)
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))
      AND (cardinality(t.limits) = 0 OR cardinality((SELECT limits FROM paused)) = 0
           OR NOT EXISTS (SELECT 1 FROM unnest(t.limits) AS x
                          WHERE split_part(x, chr(31), 1) = ANY((SELECT limits FROM paused)::text[])))
      AND (t.group_key IS NULL OR NOT (t.group_key = ANY((SELECT groups FROM paused)::text[])))
      AND NOT EXISTS (
            SELECT 1 FROM corral_tasks x
            WHERE x.group_key = t.group_key AND x.id < t.id
              AND (x.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                   OR (x.status = 'FAILED' AND x.halt_group_on_failure))
            OFFSET 0)
      -- an operator may retry an old task while a later one of its group runs
      AND NOT EXISTS (
            SELECT 1 FROM corral_tasks r
            WHERE r.group_key = t.group_key AND r.status = 'RUNNING' AND r.group_key IS NOT NULL
            OFFSET 0)
    ORDER BY (t.ready_at - t.priority * 60::float8), t.id
    LIMIT %(n)s
    FOR UPDATE OF t SKIP LOCKED
),
-- The retry path, read apart from its own index: ungrouped retries, and with
-- a retry share retrying group heads too (the same head rule; without one
-- they come with the other heads).
retry_locked AS MATERIALIZED (
    SELECT t.id, t.priority, CASE WHEN t.group_key IS NULL THEN t.run_at ELSE t.ready_at END AS elig,
           t.group_key, t.limits, t.name
    FROM corral_tasks t
    WHERE t.status = 'RETRYING'
      AND t.run_at <= (SELECT now FROM clk)
      AND t.queue = ANY(%(queues)s::text[])
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))
      AND NOT (t.limits && (SELECT names FROM barred))
      AND NOT EXISTS (SELECT 1 FROM barred_names bn WHERE bn.name = t.name)
      AND NOT (%(prefetch)s::bool AND cardinality(t.limits) > 0)
      -- a key (a keyed limit's budget) only when the caller, holding its lock, allows it
      AND NOT EXISTS (SELECT 1 FROM unnest(t.limits) AS kn
                      WHERE strpos(kn, chr(31)) > 0 AND NOT (kn = ANY(%(keys)s::text[])))
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))
      AND (cardinality(t.limits) = 0 OR cardinality((SELECT limits FROM paused)) = 0
           OR NOT EXISTS (SELECT 1 FROM unnest(t.limits) AS x
                          WHERE split_part(x, chr(31), 1) = ANY((SELECT limits FROM paused)::text[])))
      AND (t.group_key IS NULL OR NOT (t.group_key = ANY((SELECT groups FROM paused)::text[])))
      AND (t.group_key IS NULL OR (
            %(share)s::float8 IS NOT NULL AND t.is_head AND t.ready_at <= (SELECT now FROM clk)
            AND NOT EXISTS (
                SELECT 1 FROM corral_tasks x
                WHERE x.group_key = t.group_key AND x.id < t.id
                  AND (x.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                       OR (x.status = 'FAILED' AND x.halt_group_on_failure))
                OFFSET 0)
            AND NOT EXISTS (
                SELECT 1 FROM corral_tasks r
                WHERE r.group_key = t.group_key AND r.status = 'RUNNING' AND r.group_key IS NOT NULL
                OFFSET 0)))
    ORDER BY (t.run_at - t.priority * 60::float8), t.id
    LIMIT %(n)s
    FOR UPDATE OF t SKIP LOCKED
),
-- every candidate with its place on its path (lane 1: retries) and the
-- number on each path
lanes AS MATERIALIZED (
    SELECT u.*,
           row_number() OVER (PARTITION BY u.lane ORDER BY (u.elig - u.priority * 60::float8), u.id) AS ln,
           count(*) FILTER (WHERE u.lane = 0) OVER () AS nf
    FROM (SELECT *, 0 AS lane FROM free_locked
          UNION ALL SELECT *, 0 FROM free_new  -- marked
          UNION ALL SELECT *, 0 FROM heads_locked
          UNION ALL SELECT *, 1 FROM retry_locked) u
),
-- each candidate's place among the candidates of each of its keys: past its
-- key's room (%(rooms)s, beside %(keys)s) it is left for a later claim
key_places AS MATERIALIZED (
    SELECT u.id,
           row_number() OVER (PARTITION BY kn ORDER BY (u.elig - u.priority * 60::float8), u.id) AS rn,
           k.room
    FROM lanes u CROSS JOIN LATERAL unnest(u.limits) AS kn
    JOIN unnest(%(keys)s::text[], %(rooms)s::int[]) AS k(name, room) ON k.name = kn
),
-- claim order, but retries past their share of n are left for a later claim
-- (unless fresh work runs short)
picked AS MATERIALIZED (
    -- a relay (one unit, %(relay)s its predecessor's token) takes over the place
    -- that token holds: the limits count one place for both
    SELECT u.id, u.group_key, u.limits, u.name,
           coalesce(%(relay)s::text, replace(gen_random_uuid()::text, '-', '')) AS token,
           row_number() OVER (ORDER BY (u.elig - u.priority * 60::float8), u.id) AS rk
    FROM lanes u, (SELECT coalesce(%(cap)s::int, greatest(1, ceil(%(n)s * %(share)s::float8 - 1e-9))::int) AS cap) c
    WHERE (%(share)s::float8 IS NULL OR u.lane = 0 OR u.ln <= least(%(most)s::int, greatest(c.cap, %(n)s - u.nf)))
      AND NOT EXISTS (SELECT 1 FROM key_places kp WHERE kp.id = u.id AND kp.rn > kp.room)
    ORDER BY (u.elig - u.priority * 60::float8), u.id
    LIMIT %(n)s
),
followers AS MATERIALIZED (
    SELECT f.id, p.token, p.rk
    FROM picked p
    CROSS JOIN LATERAL (
        SELECT z.id, bool_and(z.ok) OVER (ORDER BY z.id) AS run_ok,
               row_number() OVER (ORDER BY z.id) AS pos, count(*) OVER () AS line
        FROM (
            SELECT x.id,
                   (x.status IN ('PENDING', 'RETRYING')
                    AND x.run_at <= (SELECT now FROM clk)
                    AND x.queue = ANY(%(queues)s::text[])
                    AND (%(all_names)s::bool OR x.name = ANY(%(names)s::text[]))
                    AND (NOT %(only_retries)s::bool OR x.status = 'RETRYING')
                    AND NOT (x.limits && (SELECT names FROM barred))
                    AND NOT (x.name = ANY((SELECT names FROM barred)::text[]))
                    AND NOT (x.limits && %(solo)s::text[])
                    AND NOT (x.name = ANY(%(solo)s::text[]))
                    AND NOT (%(prefetch)s::bool AND cardinality(x.limits) > 0)
                    -- a key not the head's would need a place of its own
                    AND NOT EXISTS (SELECT 1 FROM unnest(x.limits) AS kn
                                    WHERE strpos(kn, chr(31)) > 0 AND NOT (kn = ANY(p.limits)))
                    AND NOT (x.group_key = ANY((SELECT groups FROM paused)::text[]))
                    AND (cardinality(x.limits) = 0 OR cardinality((SELECT limits FROM paused)) = 0
                         OR NOT EXISTS (SELECT 1 FROM unnest(x.limits) AS y
                                        WHERE split_part(y, chr(31), 1) = ANY((SELECT limits FROM paused)::text[])))) AS ok
            FROM corral_tasks x
            WHERE x.group_key = p.group_key AND x.id > p.id
              AND (x.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                   OR (x.status = 'FAILED' AND x.halt_group_on_failure))
            ORDER BY x.id
            LIMIT greatest(%(reach)s::int, %(long)s::int)
        ) z
    ) f
    -- near the end of the queued work a line shorter than "long" takes a chunk of "short"
    CROSS JOIN LATERAL (
        SELECT CASE WHEN f.line + 1 < %(long)s::int THEN least(%(chunk)s::int, %(short)s::int)
                    ELSE %(chunk)s::int END AS chunk
    ) c
    -- a unit under a rate or a probing breaker is one task: each start is charged
    -- (a group whose whole line fits in the reach goes in one chunk)
    WHERE p.group_key IS NOT NULL AND f.run_ok AND (f.pos < c.chunk OR f.line < c.chunk + c.chunk / 4)
      AND NOT (p.limits && %(solo)s::text[]) AND NOT (p.name = ANY(%(solo)s::text[]))
),
members AS (
    SELECT id, token, rk, true AS is_head FROM picked
    UNION ALL
    SELECT id, token, rk, false FROM followers
),
-- The members as one value, made once: the update finds its rows by id (the
-- primary key) and each row's token, place and part in this map, with no
-- join. A join of the members to the table could be planned with the table
-- outside: after an ANALYZE that saw the table empty (autovacuum's, while a
-- big submit was not yet committed) the planner takes it for one row, and
-- the members were read again for every row of the table (2 000 claimed of
-- 2 003: 6 s, minutes on a busy machine).
member_map AS MATERIALIZED (
    SELECT coalesce(array_agg(id), '{}') AS ids,
           coalesce(jsonb_object_agg(id::text, jsonb_build_array(token, rk, is_head)), '{}') AS m
    FROM members
),
upd AS (
    UPDATE corral_tasks t
    SET status = 'RUNNING',
        lease_token = (SELECT m FROM member_map) -> t.id::text ->> 0,
        lease_expires_at = (SELECT now FROM clk) + %(lease)s::float8,
        worker_id = %(worker)s,
        version = t.version + 1,
        -- a prefetched or relayed head records no start, like a chunk member
        started_at = CASE WHEN ((SELECT m FROM member_map) -> t.id::text ->> 2)::bool
                               AND NOT %(prefetch)s::bool AND %(relay)s::text IS NULL
                          THEN (SELECT now FROM clk) END,
        attempt = t.attempt + CASE WHEN ((SELECT m FROM member_map) -> t.id::text ->> 2)::bool
                                        AND NOT %(prefetch)s::bool AND %(relay)s::text IS NULL
                                   THEN 1 ELSE 0 END,
        finished_at = NULL
    WHERE t.id = ANY((SELECT ids FROM member_map)::bigint[]) AND (t.status || '') IN ('PENDING', 'RETRYING')
    RETURNING t.*, ((SELECT m FROM member_map) -> t.id::text ->> 1)::bigint AS rk
),
-- The round-robin mark. A head refresh locks the group row and then its tasks;
-- a claim holds the tasks already, so waiting here for a refresher could
-- deadlock the two (seen with two workers: each stalled a second until
-- PostgreSQL broke the cycle). A locked group keeps its old mark instead: its
-- next head may come round a turn early, never a second task in flight.
-- The keys go as arrays, each made once: as "IN (subquery)" joins, with
-- statistics that took the groups for none, the row locks' subquery ran
-- again for every group, each a scan of all groups joined to the claimed
-- rows (2 000 groups: minutes).
touch AS (
    UPDATE corral_groups g SET last_claimed_at = (SELECT now FROM clk)
    WHERE g.group_key = ANY(ARRAY(
        SELECT k.group_key FROM corral_groups k
        WHERE k.group_key = ANY(ARRAY(SELECT group_key FROM upd WHERE group_key IS NOT NULL))
        FOR UPDATE SKIP LOCKED))
)
SELECT * FROM upd ORDER BY rk, id;

-- name: claim_simple
-- One statement for ungrouped work under simple limits (each a cap at most:
-- no rate, no pause, no breaker), deciding in SQL. It locks (SKIP LOCKED)
-- the first %(look)s ready ungrouped candidates in claim order, takes the
-- advisory lock of every name they name (the limit_lock of the other paths,
-- in name order), reads those gates' places and caps after the locks
-- (corral_gate_places: a fresh snapshot, so exact across claimers), and
-- keeps a candidate when, for each of its names, the places held plus its
-- place among the candidates of that name fit the cap. Keys in turn: a
-- key's first candidate comes before any key's second. It stops before the
-- first candidate it cannot judge (a gate more than a cap, a task under an
-- open breaker) and before the first ready group head: those stay for the
-- other path. It takes its units only when that is what the other path
-- would take: n units each its key's first, or the whole of the ready
-- ungrouped work seen with nothing stopping it; otherwise it takes nothing
-- and says so (``more``), and the caller claims on the other path. One row
-- with ``more`` and no task when it takes nothing.
WITH
clk AS MATERIALIZED (SELECT extract(epoch FROM now())::float8 AS now),
paused AS MATERIALIZED (
    SELECT coalesce(array_agg(p.name) FILTER (WHERE p.kind = 'queue'), '{}')::text[] AS queues,
           coalesce(array_agg(p.name) FILTER (WHERE p.kind = 'group'), '{}')::text[] AS groups,
           coalesce(array_agg(p.name) FILTER (WHERE p.kind = 'limit'), '{}')::text[] AS limits
    FROM corral_pauses p
),
fresh AS MATERIALIZED (
    SELECT t.id, t.priority, t.run_at AS elig, t.limits, t.name
    FROM corral_tasks t
    WHERE t.status = 'PENDING' AND t.group_key IS NULL
      AND t.run_at <= (SELECT now FROM clk)
      AND t.queue = ANY(%(queues)s::text[])
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))
      -- never a task past the deadline of its first start (the sweeper ends it)
      AND (t.expires_at IS NULL OR t.expires_at > (SELECT now FROM clk) OR t.attempt > 0 OR t.snoozes > 0)
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))
      AND (cardinality(t.limits) = 0 OR cardinality((SELECT limits FROM paused)) = 0
           OR NOT EXISTS (SELECT 1 FROM unnest(t.limits) AS x
                          WHERE split_part(x, chr(31), 1) = ANY((SELECT limits FROM paused)::text[])))
    ORDER BY (t.run_at - t.priority * 60::float8), t.id
    LIMIT %(look)s
    FOR UPDATE OF t SKIP LOCKED
),
retry AS MATERIALIZED (
    SELECT t.id, t.priority, t.run_at AS elig, t.limits, t.name
    FROM corral_tasks t
    WHERE t.status = 'RETRYING' AND t.group_key IS NULL
      AND t.run_at <= (SELECT now FROM clk)
      AND t.queue = ANY(%(queues)s::text[])
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))
      AND (cardinality(t.limits) = 0 OR cardinality((SELECT limits FROM paused)) = 0
           OR NOT EXISTS (SELECT 1 FROM unnest(t.limits) AS x
                          WHERE split_part(x, chr(31), 1) = ANY((SELECT limits FROM paused)::text[])))
    ORDER BY (t.run_at - t.priority * 60::float8), t.id
    LIMIT %(look)s
    FOR UPDATE OF t SKIP LOCKED
),
ahead AS MATERIALIZED (
    SELECT u.id, u.limits, u.name, (u.elig - u.priority * 60::float8) AS rank, u.lane
    FROM (SELECT *, 0 AS lane FROM fresh UNION ALL SELECT *, 1 FROM retry) u
    ORDER BY 4, 1
    LIMIT %(look)s
),
-- retries past their share of n are left for a later claim (unless fresh
-- work runs short), as in claim
shared AS MATERIALIZED (
    SELECT u.id FROM (
        SELECT a.id, a.lane, row_number() OVER (PARTITION BY a.lane ORDER BY a.rank, a.id) AS ln,
               count(*) FILTER (WHERE a.lane = 0) OVER () AS nf
        FROM ahead a) u,
        (SELECT coalesce(%(cap)s::int, greatest(1, ceil(%(n)s * %(share)s::float8 - 1e-9))::int) AS cap) c
    WHERE %(share)s::float8 IS NULL OR u.lane = 0 OR u.ln <= least(%(most)s::int, greatest(c.cap, %(n)s - u.nf))
),
-- the first ready group head (its exact rule is the other path's): nothing
-- after it in claim order is taken here
head AS MATERIALIZED (
    SELECT (t.ready_at - t.priority * 60::float8) AS rank, t.id
    FROM corral_tasks t
    WHERE t.status IN ('PENDING', 'RETRYING') AND t.is_head
      AND t.ready_at <= (SELECT now FROM clk)
      AND t.run_at <= (SELECT now FROM clk)
      AND t.queue = ANY(%(queues)s::text[])
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))
      AND NOT (t.group_key = ANY((SELECT groups FROM paused)::text[]))
    ORDER BY (t.ready_at - t.priority * 60::float8), t.id
    LIMIT 1
),
gate_names AS MATERIALIZED (SELECT DISTINCT n FROM ahead a, unnest(a.limits) AS n),
locked AS MATERIALIZED (
    SELECT n, pg_advisory_xact_lock(7429001, hashtext(n)) FROM gate_names ORDER BY n
),
gates AS MATERIALIZED (
    SELECT g.* FROM corral_gate_places((SELECT coalesce(array_agg(n ORDER BY n), '{}') FROM locked)) g
),
-- each (candidate, name) with its place among the candidates of that name
pairs AS MATERIALIZED (
    SELECT a.id, d.n AS gname, strpos(d.n, chr(31)) > 0 AS keyed, g.held, g.cap, g.simple,
           row_number() OVER (PARTITION BY d.n ORDER BY a.rank, a.id) AS rn
    FROM ahead a CROSS JOIN LATERAL (SELECT DISTINCT x FROM unnest(a.limits) AS x) AS d(n)
    JOIN gates g ON g.name = d.n
),
verdicts AS MATERIALIZED (
    SELECT a.id, a.rank,
           coalesce(bool_and(p.simple), true)
           AND NOT EXISTS (SELECT 1 FROM corral_breakers b WHERE b.state_name <> 'CLOSED' AND b.name = a.name)
           AS simple,
           -- its turn: its place among its key's candidates (1: the key's first)
           coalesce(max(p.rn) FILTER (WHERE p.keyed), 1) AS turn,
           coalesce(bool_and(p.cap IS NULL OR p.held + p.rn <= p.cap) FILTER (WHERE p.keyed), true) AS key_room
    FROM ahead a LEFT JOIN pairs p ON p.id = a.id
    GROUP BY a.id, a.rank, a.name
),
stop AS MATERIALIZED (
    SELECT s.rank, s.id FROM (SELECT v.rank, v.id FROM verdicts v WHERE NOT v.simple
                              UNION ALL SELECT h.rank, h.id FROM head h) s
    ORDER BY 1, 2
    LIMIT 1
),
fit AS MATERIALIZED (
    SELECT v.id, v.rank, v.turn FROM verdicts v
    -- shared's ids as one object read once: a join of two CTEs (no statistics) may loop over both
    WHERE (SELECT jsonb_object_agg(id::text, true) FROM shared) ? v.id::text
      AND v.simple AND v.key_room
      AND NOT EXISTS (SELECT 1 FROM stop s WHERE (v.rank, v.id) >= (s.rank, s.id))
),
-- a plain limit's places among the candidates kept, in the order taken
plain_places AS MATERIALIZED (
    SELECT f.id, p.held, p.cap,
           row_number() OVER (PARTITION BY p.gname ORDER BY f.turn, f.rank, f.id) AS rn
    FROM fit f JOIN pairs p ON p.id = f.id AND NOT p.keyed
),
picked AS MATERIALIZED (
    SELECT f.id, f.turn, row_number() OVER (ORDER BY f.turn, f.rank, f.id) AS rk
    FROM fit f
    WHERE NOT EXISTS (SELECT 1 FROM plain_places r WHERE r.id = f.id AND r.cap IS NOT NULL AND r.held + r.rn > r.cap)
    ORDER BY f.turn, f.rank, f.id
    LIMIT %(n)s
),
verdict AS MATERIALIZED (
    SELECT NOT (((SELECT count(*) FROM ahead) < %(look)s AND NOT EXISTS (SELECT 1 FROM stop))
                OR ((SELECT count(*) FROM picked) = %(n)s AND NOT EXISTS (SELECT 1 FROM picked WHERE turn > 1)))
           AS more
),
upd AS (
    UPDATE corral_tasks t
    SET status = 'RUNNING',
        lease_token = replace(gen_random_uuid()::text, '-', ''),
        lease_expires_at = clk.now + %(lease)s::float8,
        worker_id = %(worker)s,
        version = t.version + 1,
        started_at = clk.now,
        attempt = t.attempt + 1,
        finished_at = NULL
    FROM clk, verdict v
    -- the ids read once (a join to picked could loop over the table under statistics that saw no row)
    WHERE t.id = ANY(ARRAY(SELECT id FROM picked)) AND NOT v.more AND (t.status || '') IN ('PENDING', 'RETRYING')
    RETURNING t.*
)
SELECT v.more, u.*, ((SELECT jsonb_object_agg(id::text, rk) FROM picked) ->> u.id::text)::bigint AS rk
FROM verdict v LEFT JOIN upd u ON true ORDER BY rk, u.id;

-- name: claim_plain
-- The fast path for plain work (no group, no limit): what most claims are
-- when no grouped or limited work waits. Same row shape as claim.
WITH -- A claim commits durably, like submits and completions: a claim the
-- database forgot in a crash would make its task claimable again while its
-- first run still goes on (two in flight, in a group too).
clk AS MATERIALIZED (SELECT extract(epoch FROM now())::float8 AS now),
-- task names under a breaker not CLOSED, as rows for an anti-join: with one
-- task name the planner takes "name <> ALL(array)" for "no row" and sorts the
-- whole queue instead of walking its index in claim order
barred AS MATERIALIZED (SELECT name FROM corral_breakers WHERE state_name <> 'CLOSED'),
-- queues paused by hand (plain work has no group and no limit to pause)
paused AS MATERIALIZED (
    SELECT coalesce(array_agg(p.name), '{}')::text[] AS queues FROM corral_pauses p WHERE p.kind = 'queue'
),
fresh AS MATERIALIZED (
    SELECT t.id, t.priority, t.run_at FROM corral_tasks t
    WHERE t.status = 'PENDING' AND t.group_key IS NULL AND NOT %(only_retries)s::bool
      -- "no limit" written so, not as cardinality(...) = 0: that form would
      -- let the planner read (and sort) the unordered ready_unlimited index,
      -- and the column's statistics estimate this one well
      AND t.limits = '{}'::text[]
      AND t.run_at <= (SELECT now FROM clk)
      AND t.queue = ANY(%(queues)s::text[])
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))
      AND NOT EXISTS (SELECT 1 FROM barred b WHERE b.name = t.name)
      -- never a task past the deadline of its first start (the sweeper ends it)
      AND (t.expires_at IS NULL OR t.expires_at > (SELECT now FROM clk) OR t.attempt > 0 OR t.snoozes > 0)
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))
      AND ((t.run_at - t.priority * 60::float8), t.id) >= (%(lo_rank)s::float8, %(lo_id)s::bigint)  -- marked
    ORDER BY (t.run_at - t.priority * 60::float8), t.id
    LIMIT %(n)s
    FOR UPDATE OF t SKIP LOCKED
),
fresh_new AS MATERIALIZED (  -- marked
    SELECT t.id, t.priority, t.run_at FROM corral_tasks t  -- marked
    -- from the ready rows' (queue, run_at) index: "num_nulls" (not "group_key  -- marked
    -- IS NULL") keeps the planner off the claim-order index, whose walk  -- marked
    -- (the dead rows before the mark) this is here to avoid  -- marked
    WHERE t.status = 'PENDING' AND num_nulls(t.group_key) = 1 AND NOT %(only_retries)s::bool  -- marked
      AND cardinality(t.limits) = 0  -- marked
      AND t.queue = ANY(%(queues)s::text[])  -- marked
      AND t.run_at > %(since)s::float8 AND t.run_at <= (SELECT now FROM clk)  -- marked
      AND NOT (((t.run_at - t.priority * 60::float8) + 0, t.id) >= (%(lo_rank)s::float8, %(lo_id)s::bigint))  -- marked
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))  -- marked
      AND NOT EXISTS (SELECT 1 FROM barred b WHERE b.name = t.name)  -- marked
      AND (t.expires_at IS NULL OR t.expires_at > (SELECT now FROM clk) OR t.attempt > 0 OR t.snoozes > 0)  -- marked
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))  -- marked
    ORDER BY (t.run_at - t.priority * 60::float8) + 0, t.id  -- marked
    LIMIT %(n)s  -- marked
    FOR UPDATE OF t SKIP LOCKED  -- marked
),  -- marked
-- the retry path, read apart from its own index
retry AS MATERIALIZED (
    SELECT t.id, t.priority, t.run_at FROM corral_tasks t
    WHERE t.status = 'RETRYING' AND t.group_key IS NULL
      AND t.limits = '{}'::text[]
      AND t.run_at <= (SELECT now FROM clk)
      AND t.queue = ANY(%(queues)s::text[])
      AND (%(all_names)s::bool OR t.name = ANY(%(names)s::text[]))
      AND NOT EXISTS (SELECT 1 FROM barred b WHERE b.name = t.name)
      AND NOT (t.queue = ANY((SELECT queues FROM paused)::text[]))
    ORDER BY (t.run_at - t.priority * 60::float8), t.id
    LIMIT %(n)s
    FOR UPDATE OF t SKIP LOCKED
),
-- claim order, but retries past their share of n are left for a later claim
-- (unless fresh work runs short)
picked AS (
    SELECT u.id FROM (
        SELECT l.*, row_number() OVER (PARTITION BY l.lane ORDER BY (l.run_at - l.priority * 60::float8), l.id) AS ln,
               count(*) FILTER (WHERE l.lane = 0) OVER () AS nf
        FROM (SELECT f.*, 0 AS lane FROM fresh f UNION ALL SELECT r.*, 1 FROM retry r
              UNION ALL SELECT b.*, 0 FROM fresh_new b  -- marked
        ) l
    ) u, (SELECT coalesce(%(cap)s::int, greatest(1, ceil(%(n)s * %(share)s::float8 - 1e-9))::int) AS cap) c
    WHERE %(share)s::float8 IS NULL OR u.lane = 0 OR u.ln <= least(%(most)s::int, greatest(c.cap, %(n)s - u.nf))
    ORDER BY (u.run_at - u.priority * 60::float8), u.id
    LIMIT %(n)s
)
UPDATE corral_tasks t
SET status = 'RUNNING',
    lease_token = replace(gen_random_uuid()::text, '-', ''),
    lease_expires_at = clk.now + %(lease)s::float8,
    worker_id = %(worker)s,
    version = t.version + 1,
    started_at = CASE WHEN %(prefetch)s::bool THEN NULL ELSE clk.now END,
    attempt = t.attempt + CASE WHEN %(prefetch)s::bool THEN 0 ELSE 1 END,
    finished_at = NULL
FROM clk
-- by id, with no join of picked to the table (see claim's member_map)
WHERE t.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING t.*;

-- name: special_ready
-- Is grouped or limited work queued? (decides whether the fast path may be used)
SELECT EXISTS (SELECT 1 FROM corral_tasks
               WHERE status IN ('PENDING', 'RETRYING') AND group_key IS NOT NULL)
    OR EXISTS (SELECT 1 FROM corral_tasks
               WHERE status IN ('PENDING', 'RETRYING') AND cardinality(limits) > 0);

-- name: heartbeat
-- Rows are locked in id order, as complete() locks them, so the two never deadlock.
WITH locked AS (
    SELECT id FROM corral_tasks
    WHERE status = 'RUNNING' AND lease_token = ANY(%(tokens)s::text[])
    ORDER BY id
    FOR UPDATE
)
UPDATE corral_tasks t
SET lease_expires_at = extract(epoch FROM now())::float8 + %(lease)s::float8
FROM locked
WHERE t.id = locked.id AND t.status = 'RUNNING'
RETURNING t.id, t.lease_token, t.cancel_requested;

-- name: complete
-- The outcomes come as one JSON array of rows (cheap to send: a driver
-- dumps thirteen arrays element by element, which cost more than the update).
WITH clk AS (SELECT extract(epoch FROM now())::float8 AS now),
o AS (
    SELECT (r.v->>0)::bigint AS id, r.v->>1 AS token, (r.v->>2)::int AS version, r.v->>3 AS status,
           r.v->>4 AS result, r.v->>5 AS error, (r.v->>6)::float8 AS run_at, (r.v->>7)::bool AS burn,
           (r.v->>8)::float8 AS started_at, (r.v->>9)::float8 AS finished_at, (r.v->>10)::int AS attempt,
           (r.v->>11)::bool AS snooze, (r.v->>12)::float8 AS pause, r.v->>13 AS traceback, r.ord
    FROM json_array_elements(%(rows)s::json) WITH ORDINALITY AS r(v, ord)
),
locked AS (
    -- lock in id order, as heartbeat does, so the two never deadlock
    SELECT t.id FROM corral_tasks t
    WHERE t.id = ANY(%(ids)s::bigint[])
    ORDER BY t.id
    FOR UPDATE
),
upd AS (
    UPDATE corral_tasks t
    SET status = o.status,
        result = o.result,
        -- a running task a newer submit asked to stop says why it ended
        error = CASE WHEN o.status = 'CANCELED' AND t.cancel_requested AND t.cancel_reason IS NOT NULL
                     THEN t.cancel_reason ELSE o.error END,
        traceback = o.traceback,
        run_at = CASE WHEN o.status = 'RETRYING' THEN coalesce(o.run_at, clk.now)
                      WHEN o.status = 'PENDING' THEN coalesce(o.run_at, clk.now)
                      ELSE t.run_at END,
        started_at = coalesce(t.started_at, o.started_at),
        finished_at = CASE WHEN o.status IN ('SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELED')
                           THEN coalesce(o.finished_at, clk.now) END,
        attempt = coalesce(o.attempt, t.attempt - CASE WHEN o.burn AND NOT o.snooze THEN 0 ELSE 1 END),
        snoozes = t.snoozes + CASE WHEN o.snooze THEN 1 ELSE 0 END,
        lease_token = NULL,
        lease_expires_at = NULL,
        version = t.version + 1
    FROM o, clk, locked
    WHERE t.id = o.id AND locked.id = o.id
      AND t.status = 'RUNNING' AND t.lease_token = o.token AND t.version = o.version
    RETURNING o.ord, o.token, o.pause, t.queue, t.group_key, t.limits, t.name, t.status, t.has_dependents,
              t.run_at
),
paused AS (
    -- a 429 with Retry-After pauses every limit of its task until then
    UPDATE corral_limits l SET paused_until = greatest(coalesce(l.paused_until, 0), p.until)
    FROM (SELECT n, max((SELECT now FROM clk) + u.pause) AS until
          FROM upd u, unnest(u.limits) AS n WHERE u.pause IS NOT NULL GROUP BY n) p
    WHERE l.name = p.n
),
paused_keys AS (
    -- and a keyed limit's key, in its own row (made if the key has none)
    INSERT INTO corral_limit_keys AS k (name, paused_until)
    SELECT n, max((SELECT now FROM clk) + u.pause)
    FROM upd u, unnest(u.limits) AS n WHERE u.pause IS NOT NULL AND strpos(n, chr(31)) > 0 GROUP BY n
    ON CONFLICT (name) DO UPDATE SET paused_until = greatest(coalesce(k.paused_until, 0), excluded.paused_until)
),
note AS (
    -- Wake workers only when something became claimable: a task queued again
    -- and due now (a retry after a backoff is found by the workers' polls;
    -- waking every worker for it only has them claim nothing), or the last
    -- running task of a claim under a group or a limit finished (its group's
    -- next task and its limit slot are free now; with %(hush)s its limit
    -- slot passes to a successor in this transaction, and only its group's
    -- next task is news). The subquery reads the rows as they were before
    -- this statement.
    SELECT pg_notify('corral_work', q.queue || ':g')
    FROM (SELECT DISTINCT u.queue FROM upd u
          WHERE (u.status IN ('PENDING', 'RETRYING') AND u.run_at <= (SELECT now FROM clk))
             -- (a successor relayed the place shares the token: it holds
             -- the limits it names, never the group)
             OR (u.group_key IS NOT NULL
                 AND NOT EXISTS (
                     SELECT 1 FROM corral_tasks r
                     WHERE r.lease_token = u.token AND r.status = 'RUNNING'
                       AND r.group_key = u.group_key
                       AND NOT (r.id = ANY(%(ids)s::bigint[]))))
             OR (cardinality(u.limits) > 0 AND NOT %(hush)s::bool
                 AND NOT EXISTS (
                     SELECT 1 FROM corral_tasks r
                     WHERE r.lease_token = u.token AND r.status = 'RUNNING'
                       AND r.limits @> u.limits
                       AND NOT (r.id = ANY(%(ids)s::bigint[])))
                 -- and only a place under a cap that was full: below its cap
                 -- the work under it was claimable already, and a limit that
                 -- never binds would wake every worker at each completion
                 -- (each NOTIFY also serialises the commits that send one)
                 AND EXISTS (
                     SELECT 1 FROM unnest(u.limits) AS n
                     LEFT JOIN corral_limits l ON l.name = split_part(n, chr(31), 1)
                     LEFT JOIN LATERAL (SELECT c.concurrency FROM corral_limit_keys c
                                        WHERE strpos(n, chr(31)) > 0 AND c.name = n LIMIT 1) k ON true
                     WHERE coalesce(k.concurrency, l.concurrency) IS NOT NULL
                       AND (SELECT count(DISTINCT h.lease_token) FROM corral_held_places h WHERE h.name = n)
                           >= coalesce(k.concurrency, l.concurrency)))) q
)
SELECT ord, has_dependents AND status IN ('SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELED'),
       (SELECT count(*) FROM note) AS notified, name, limits
FROM upd;

-- name: settle_dependents
-- After tasks in %(ids)s ended: cancel the WAITING tasks that (transitively)
-- depend on one that ended badly, unless they run anyway
-- (on_upstream_failure = 'run'), and promote WAITING dependents of %(ids)s
-- whose upstream tasks all succeeded (under 'run': all ended). Returns the ids
-- it canceled: the caller settles them in turn (their dependents that run
-- anyway), in a statement that sees them ended. Runs as its own statement, so
-- it sees tasks submitted while the completion waited for their dependency
-- locks.
WITH RECURSIVE
clk AS (SELECT extract(epoch FROM now())::float8 AS now),
bad(id, via, via_status) AS (
    SELECT d.task_id, t.id, t.status
    FROM corral_tasks t
    JOIN corral_deps d ON d.dep_id = t.id
    JOIN corral_tasks w ON w.id = d.task_id AND w.status = 'WAITING' AND w.on_upstream_failure = 'cancel'
    WHERE t.id = ANY(%(ids)s::bigint[]) AND t.status IN ('FAILED', 'TIMEOUT', 'CANCELED')
    UNION
    SELECT d.task_id, b.id, 'CANCELED'
    FROM bad b
    JOIN corral_deps d ON d.dep_id = b.id
    JOIN corral_tasks w ON w.id = d.task_id AND w.status = 'WAITING' AND w.on_upstream_failure = 'cancel'
),
canceled AS (
    UPDATE corral_tasks w
    SET status = 'CANCELED', error = 'upstream ' || b.via || ' ended ' || b.via_status,
        finished_at = clk.now, version = w.version + 1
    FROM (SELECT DISTINCT ON (id) id, via, via_status FROM bad ORDER BY id, via) b, clk
    WHERE w.id = b.id AND w.status = 'WAITING'
    RETURNING w.id, w.queue, w.group_key
),
promoted AS (
    UPDATE corral_tasks w
    SET status = 'PENDING', version = w.version + 1
    WHERE w.status = 'WAITING'
      AND w.id IN (SELECT d.task_id FROM corral_deps d WHERE d.dep_id = ANY(%(ids)s::bigint[]))
      AND NOT EXISTS (SELECT 1 FROM corral_deps d2 JOIN corral_tasks u ON u.id = d2.dep_id
                      WHERE d2.task_id = w.id AND u.status <> 'SUCCESS'
                        AND (w.on_upstream_failure <> 'run'
                             OR u.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')))
    RETURNING w.id, w.queue
),
note AS (
    SELECT pg_notify('corral_work', q.queue || ':g')
    FROM (SELECT queue FROM promoted
          UNION SELECT queue FROM canceled WHERE group_key IS NOT NULL) q
)
SELECT ARRAY(SELECT id FROM canceled) AS canceled, (SELECT count(*) FROM promoted) AS promoted,
       (SELECT count(*) FROM note) AS notified;

-- name: upstream
-- The tasks one task depends on, in its depends_on order (ctx.upstream).
SELECT u.* FROM corral_tasks t
CROSS JOIN LATERAL unnest(t.depends_on) WITH ORDINALITY AS d(id, pos)
JOIN corral_tasks u ON u.id = d.id
WHERE t.id = %(id)s
ORDER BY d.pos;

-- name: set_progress
UPDATE corral_tasks SET progress = %(fraction)s, progress_message = %(message)s
WHERE id = %(id)s AND status = 'RUNNING' AND lease_token = %(token)s;

-- name: get_checkpoint
SELECT checkpoint FROM corral_tasks
WHERE id = %(id)s AND status = 'RUNNING' AND lease_token = %(token)s
FOR UPDATE;

-- name: set_checkpoint
UPDATE corral_tasks SET checkpoint = %(checkpoint)s
WHERE id = %(id)s AND status = 'RUNNING' AND lease_token = %(token)s;

-- name: get
SELECT * FROM corral_tasks WHERE id = %(id)s;

-- The head of a group's line: its smallest id still ACTIVE or halting-FAILED
-- (one seek of the group-block index; `corral why`).
-- name: line_head
SELECT * FROM corral_tasks
WHERE id = (SELECT min(id) FROM corral_tasks
            WHERE group_key = %(group)s AND group_key IS NOT NULL
              AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                   OR (status = 'FAILED' AND halt_group_on_failure)));

-- The starts of held tasks whose bodies run now ([id, token, attempt,
-- started_at] rows as JSON): applied only while RUNNING under the token with
-- no start recorded; the version stays (the outcome still applies).
-- name: record_starts
UPDATE corral_tasks AS t
SET started_at = s.started_at, attempt = s.attempt
FROM (SELECT (r->>0)::bigint AS id, r->>1 AS token, (r->>2)::int AS attempt, (r->>3)::float8 AS started_at
      FROM jsonb_array_elements(%(rows)s::jsonb) AS r) AS s
WHERE t.id = s.id AND t.status = 'RUNNING' AND t.lease_token = s.token AND t.started_at IS NULL;

-- name: cancel_requested
SELECT id FROM corral_tasks WHERE id = ANY(%(ids)s::bigint[]) AND cancel_requested;

-- Tasks per stored status, and again as RESERVED the RUNNING ones whose
-- start is not recorded (live rows only); the store takes those out of RUNNING.
-- name: counts
SELECT status, count(*) FROM corral_tasks GROUP BY status
UNION ALL
SELECT 'RESERVED', count(*) FROM corral_tasks WHERE status = 'RUNNING' AND started_at IS NULL;

-- name: lock_queue_bound
-- A bounded submit (App(max_queued=...)) that found the queue near its bound
-- takes this transaction lock: near the bound they count and insert one at a time.
SELECT pg_advisory_xact_lock(7302318442001);

-- name: mark_bounded_submit
-- A bounded submit marks itself in flight until it ends: a shared transaction
-- lock whose second key is the number of tasks it adds (see bounded_in_flight).
SELECT pg_advisory_xact_lock_shared(730231844, %(n)s::int);

-- name: bounded_in_flight
-- The tasks other bounded submits of this database are adding right now (their
-- marks): not visible to this one's count yet, so counted apart.
SELECT coalesce(sum(objid::bigint), 0)::bigint FROM pg_locks
WHERE locktype = 'advisory' AND classid = 730231844 AND objsubid = 2 AND granted
  AND pid <> pg_backend_pid()
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database());

-- name: queued_upto
-- The queued tasks (waiting, pending, retrying), counted up to %(n)s: enough
-- to decide a bound of n - 1; each part matches a partial index.
SELECT (SELECT count(*) FROM (SELECT 1 FROM corral_tasks
                              WHERE status = 'PENDING' AND group_key IS NULL LIMIT %(n)s) a)
     + (SELECT count(*) FROM (SELECT 1 FROM corral_tasks
                              WHERE status = 'PENDING' AND group_key IS NOT NULL LIMIT %(n)s) b)
     + (SELECT count(*) FROM (SELECT 1 FROM corral_tasks WHERE status = 'RETRYING' LIMIT %(n)s) c)
     + (SELECT count(*) FROM (SELECT 1 FROM corral_tasks WHERE status = 'WAITING' LIMIT %(n)s) d);

-- name: backlog
-- Queued tasks up to a bound (chunks near the end of the queued work); each
-- part matches a partial index, as in active_counts.
SELECT least(%(n)s::bigint,
    (SELECT count(*) FROM (SELECT 1 FROM corral_tasks
                           WHERE status = 'PENDING' AND group_key IS NULL LIMIT %(n)s) a)
  + (SELECT count(*) FROM (SELECT 1 FROM corral_tasks
                           WHERE status = 'PENDING' AND group_key IS NOT NULL LIMIT %(n)s) b)
  + (SELECT count(*) FROM (SELECT 1 FROM corral_tasks WHERE status = 'RETRYING' LIMIT %(n)s) c))

-- name: active_counts
-- Unfinished tasks per state; each part matches a partial index, so the
-- cost follows the live work, never the finished rows.
SELECT status, sum(n)::bigint FROM (
    SELECT 'PENDING' AS status, count(*) AS n FROM corral_tasks WHERE status = 'PENDING' AND group_key IS NULL
    UNION ALL
    SELECT 'PENDING', count(*) FROM corral_tasks WHERE status = 'PENDING' AND group_key IS NOT NULL
    UNION ALL
    SELECT 'RETRYING', count(*) FROM corral_tasks WHERE status = 'RETRYING'
    UNION ALL
    SELECT CASE WHEN started_at IS NULL THEN 'RESERVED' ELSE 'RUNNING' END, count(*)
    FROM corral_tasks WHERE status = 'RUNNING' GROUP BY 1
    UNION ALL
    SELECT 'WAITING', count(*) FROM corral_tasks WHERE status = 'WAITING'
) c GROUP BY status;

-- name: counts_queue
SELECT status, count(*) FROM corral_tasks WHERE queue = %(queue)s GROUP BY status
UNION ALL
SELECT 'RESERVED', count(*) FROM corral_tasks
WHERE status = 'RUNNING' AND started_at IS NULL AND queue = %(queue)s;

-- name: lock_group_of
-- Operators' changes take their task's group lock first, as the head refresh
-- does, so the two queue instead of deadlocking.
SELECT 1 FROM corral_groups
WHERE group_key = (SELECT group_key FROM corral_tasks WHERE id = %(id)s)
FOR UPDATE;

-- name: cancel_queued
UPDATE corral_tasks
SET status = 'CANCELED', finished_at = extract(epoch FROM now())::float8, version = version + 1,
    lease_token = NULL, lease_expires_at = NULL
WHERE id = %(id)s AND (status || '') IN ('WAITING', 'PENDING', 'RETRYING')
RETURNING id, queue, group_key;

-- name: debounce_lock
-- Submits of one task name and debounce key, one at a time until each commits
-- (class 0x636f7272, "corr"; a hash collision only makes two keys wait in turn).
SELECT pg_advisory_xact_lock(1668248178, hashtext(%(name)s || '/' || %(key)s));

-- name: debounce_merge
-- A submit with a debounce key into the PENDING task of its name and key: the
-- newest arguments, run_at now + debounce but never past the first submit +
-- debounce_max.
UPDATE corral_tasks
SET args = %(args)s, version = version + 1,
    run_at = least(extract(epoch FROM now())::float8 + %(window)s,
                   created_at + coalesce(%(bound)s::float8, 'infinity'::float8))
WHERE id = (SELECT id FROM corral_tasks
            WHERE name = %(name)s AND debounce_key = %(key)s AND status = 'PENDING'
            ORDER BY id DESC LIMIT 1)
  AND status = 'PENDING'
RETURNING id;

-- name: set_keys
-- A new task's debounce and supersede keys, in its submit's transaction; a
-- debounced one waits its window.
UPDATE corral_tasks
SET debounce_key = %(debounce_key)s, supersede_key = %(supersede_key)s,
    run_at = CASE WHEN %(window)s::float8 IS NULL THEN run_at
                  ELSE extract(epoch FROM now())::float8 + %(window)s::float8 END
WHERE id = %(id)s;

-- name: supersede_lock_groups
-- The groups of the tasks a supersede cancels, locked first as lock_group_of does.
SELECT 1 FROM corral_groups
WHERE group_key IN (SELECT group_key FROM corral_tasks
                    WHERE name = %(name)s AND supersede_key = %(key)s AND id < %(id)s
                      AND status IN ('WAITING', 'PENDING', 'RETRYING'))
ORDER BY group_key
FOR UPDATE;

-- name: supersede_queued
-- A newer submit (id) cancels the queued tasks of its name and supersede key.
UPDATE corral_tasks
SET status = 'CANCELED', finished_at = extract(epoch FROM now())::float8, error = 'superseded',
    version = version + 1, lease_token = NULL, lease_expires_at = NULL
WHERE name = %(name)s AND supersede_key = %(key)s AND id < %(id)s
  AND status IN ('WAITING', 'PENDING', 'RETRYING')
RETURNING id, queue, group_key;

-- name: supersede_running
-- ... and asks a running one to stop, as a cancel does; if it ends CANCELED,
-- its error says why (complete).
UPDATE corral_tasks SET cancel_requested = true, cancel_reason = 'superseded'
WHERE name = %(name)s AND supersede_key = %(key)s AND id < %(id)s AND status = 'RUNNING';

-- name: cancel_running
UPDATE corral_tasks SET cancel_requested = true, cancel_reason = NULL
WHERE id = %(id)s AND (status || '') = 'RUNNING';

-- name: retry
UPDATE corral_tasks
SET status = 'PENDING', run_at = extract(epoch FROM now())::float8, attempt = 0, snoozes = 0, crashes = 0,
    finished_at = NULL, started_at = NULL, error = NULL, traceback = NULL, result = NULL,
    lease_token = NULL, lease_expires_at = NULL, cancel_requested = false,
    progress = NULL, progress_message = NULL, version = version + 1
WHERE id = %(id)s  -- FAILED, TIMEOUT, CANCELED, or a status that names no state
  AND status NOT IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING', 'SUCCESS')
RETURNING id, queue;

-- name: notify
SELECT pg_notify('corral_work', %(queue)s || ':g');

-- (RESERVED again apart, as in counts)
-- name: batch_counts
SELECT status, count(*), min(created_at), max(finished_at)
FROM corral_tasks WHERE batch = %(batch)s GROUP BY status
UNION ALL
SELECT 'RESERVED', count(*), NULL, NULL FROM corral_tasks
WHERE batch = %(batch)s AND status = 'RUNNING' AND started_at IS NULL;

-- The newest finished tasks of a name (the capacity planner's sample), among
-- the newest tasks of every name: the read is bounded however long the history.
-- name: history_of_name
SELECT status, started_at, finished_at, attempt FROM corral_tasks
WHERE name = %(name)s AND status IN ('SUCCESS', 'FAILED', 'TIMEOUT')
  AND id > (SELECT coalesce(max(id), 0) FROM corral_tasks) - %(scan)s
ORDER BY id DESC LIMIT %(limit)s;

-- The same for a batch (of one name when one is given), from the batch index.
-- name: history_of_batch
SELECT status, started_at, finished_at, attempt FROM corral_tasks
WHERE batch = %(batch)s AND (%(name)s::text IS NULL OR name = %(name)s) AND status IN ('SUCCESS', 'FAILED', 'TIMEOUT')
ORDER BY id DESC LIMIT %(limit)s;

-- ---- batch settings ------------------------------------------------------------

-- name: set_batch
INSERT INTO corral_batches (name, on_complete) VALUES (%(name)s, %(on_complete)s)
ON CONFLICT (name) DO UPDATE SET on_complete = excluded.on_complete;

-- A read first, so a completion outside any batch with a callback locks nothing.
-- name: batches_unsettled
SELECT name FROM corral_batches
WHERE on_complete IS NOT NULL AND settled_at IS NULL
  AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
ORDER BY name LIMIT %(limit)s;

-- Waits for (never skips) a settle in flight: it may have looked before this
-- caller's completion committed, so this caller must look again after it.
-- name: batch_lock_unsettled
SELECT on_complete FROM corral_batches
WHERE name = %(name)s AND on_complete IS NOT NULL AND settled_at IS NULL
FOR UPDATE;

-- name: batch_active
SELECT 1 FROM corral_tasks
WHERE batch = %(batch)s AND status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
LIMIT 1;

-- name: batch_settle
UPDATE corral_batches SET settled_at = extract(epoch FROM now())::float8, callback_id = %(id)s
WHERE name = %(name)s AND settled_at IS NULL;

-- name: batch_durations
SELECT finished_at - started_at AS d FROM corral_tasks
WHERE batch = %(batch)s AND finished_at IS NOT NULL AND started_at IS NOT NULL
ORDER BY d;

-- A changed rate starts with a full bucket; an unchanged one keeps its tokens.
-- The log of recent starts (a sliding window's) is kept either way.
-- name: pauses
SELECT kind, name, paused_at, paused_by AS by FROM corral_pauses;

-- name: pause
INSERT INTO corral_pauses (kind, name, paused_at, paused_by)
VALUES (%(kind)s, %(name)s, extract(epoch FROM now())::float8, %(by)s)
ON CONFLICT DO NOTHING
RETURNING paused_at;

-- name: resume
DELETE FROM corral_pauses WHERE kind = %(kind)s AND name = %(name)s RETURNING kind;

-- A limit's settings as core.limits decided them (declared, or changed while
-- running). A changed rate starts with a full bucket; an unchanged one keeps
-- its tokens.
-- name: set_limit
INSERT INTO corral_limits AS l (name, concurrency, rate, burst, per_key, set_by, declared, changed_at)
VALUES (%(name)s, %(concurrency)s, %(rate)s, %(burst)s, %(per_key)s, %(set_by)s, %(declared)s, %(changed_at)s)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, rate = excluded.rate,
    burst = excluded.burst, per_key = excluded.per_key, set_by = excluded.set_by,
    declared = excluded.declared, changed_at = coalesce(excluded.changed_at, l.changed_at),
    tokens = CASE WHEN l.rate IS NOT DISTINCT FROM excluded.rate THEN l.tokens END,
    counted_at = CASE WHEN l.rate IS NOT DISTINCT FROM excluded.rate THEN l.counted_at END,
    adaptive = NULL, controller = NULL;

-- ---- adaptive limits (corral.core.adaptive) ----------------------------------

-- name: adaptive_limits
SELECT name, adaptive, concurrency, rate, controller FROM corral_limits
WHERE adaptive IS NOT NULL ORDER BY name;

-- name: adaptive_limit_lock
SELECT name, adaptive, concurrency, rate, controller FROM corral_limits
WHERE name = %(name)s AND adaptive IS NOT NULL FOR UPDATE;

-- An adaptive limit declared: its spec and effective values (the controller's
-- state is kept; a changed rate starts with a full bucket).
-- name: declare_adaptive
INSERT INTO corral_limits AS l (name, concurrency, rate, burst, adaptive, per_key)
VALUES (%(name)s, %(concurrency)s, %(rate)s, %(burst)s, %(adaptive)s, %(per_key)s)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, rate = excluded.rate,
    burst = excluded.burst, adaptive = excluded.adaptive, per_key = excluded.per_key,
    tokens = CASE WHEN l.rate IS NOT DISTINCT FROM excluded.rate THEN l.tokens END,
    counted_at = CASE WHEN l.rate IS NOT DISTINCT FROM excluded.rate THEN l.counted_at END;

-- One limit's row, read in the transaction that changes it (its limit_lock held).
-- name: limit_row
SELECT name, concurrency, rate, burst, paused_until, tokens, counted_at, starts,
       per_key, set_by, declared, changed_at
FROM corral_limits WHERE name = %(name)s;

-- The names of the limits (not their keys' rows), for an error naming them.
-- name: limit_names
SELECT name FROM corral_limits WHERE strpos(name, chr(31)) = 0 ORDER BY name;

-- The controller's decision, written only while its holder leads the role.
-- name: save_adaptive
UPDATE corral_limits AS l SET controller = %(state)s,
    concurrency = coalesce(%(concurrency)s::integer, l.concurrency),
    rate = coalesce(%(rate)s::text, l.rate),
    tokens = CASE WHEN %(rate)s::text IS NULL OR l.rate IS NOT DISTINCT FROM %(rate)s::text THEN l.tokens END,
    counted_at = CASE WHEN %(rate)s::text IS NULL OR l.rate IS NOT DISTINCT FROM %(rate)s::text
                      THEN l.counted_at END
WHERE l.name = %(name)s AND l.adaptive IS NOT NULL
  AND EXISTS (SELECT 1 FROM corral_leaders r
              WHERE r.role = %(role)s AND r.holder = %(holder)s
                AND r.expires_at >= extract(epoch FROM now())::float8);

-- name: leads_now
-- Does %(holder)s lead %(role)s now? (a write fenced by leadership checks it in its transaction)
SELECT 1 FROM corral_leaders r
WHERE r.role = %(role)s AND r.holder = %(holder)s AND r.expires_at >= extract(epoch FROM now())::float8;

-- name: adaptive_keys
-- The keys of a keyed adaptive limit that hold a controller state (%(prefix)s: its name and the separator).
SELECT substr(name, length(%(prefix)s) + 1), controller FROM corral_limit_keys
WHERE starts_with(name, %(prefix)s) AND controller IS NOT NULL;

-- name: save_adaptive_keys
-- Keys' decided values and controller states (one JSON array of [name,
-- state, concurrency, rate] rows), into their rows (made if they have none);
-- a changed rate starts the key with a full bucket.
INSERT INTO corral_limit_keys AS k (name, controller, concurrency, rate)
SELECT r->>0, r->>1, (r->>2)::integer, r->>3 FROM json_array_elements(%(rows)s::json) AS r
ON CONFLICT (name) DO UPDATE SET controller = excluded.controller, concurrency = excluded.concurrency,
    rate = excluded.rate,
    tokens = CASE WHEN k.rate IS NOT DISTINCT FROM excluded.rate THEN k.tokens END,
    counted_at = CASE WHEN k.rate IS NOT DISTINCT FROM excluded.rate THEN k.counted_at END;

-- name: clear_adaptive_keys
-- A keyed limit given fixed values: its keys' learned values and states go (they run under the limit's).
UPDATE corral_limit_keys SET concurrency = NULL, rate = NULL, controller = NULL, tokens = NULL, counted_at = NULL
WHERE starts_with(name, %(prefix)s) AND controller IS NOT NULL;

-- name: key_controllers
-- The controller states of the key rows %(names)s: forget_keys keeps a recently used key's.
SELECT name, controller FROM corral_limit_keys WHERE name = ANY(%(names)s::text[]) AND controller IS NOT NULL;

-- name: report_limits
WITH trim AS (DELETE FROM corral_limit_reports
              WHERE worker = %(worker)s AND at < extract(epoch FROM now())::float8 - %(kept)s::float8)
INSERT INTO corral_limit_reports (worker, at, reports)
VALUES (%(worker)s, extract(epoch FROM now())::float8, %(reports)s);

-- name: take_limit_reports
DELETE FROM corral_limit_reports RETURNING id, worker, reports;

-- Which of the named limits queued work due now waits under.
-- name: keys_waiting
-- Those of the keys %(names)s (a keyed limit's gates) that queued work due now waits under: one
-- pass over the queued limited tasks (a key per EXISTS would read a long backlog once per key).
SELECT DISTINCT n FROM corral_tasks t, unnest(t.limits) AS n
WHERE t.status IN ('PENDING', 'RETRYING') AND cardinality(t.limits) > 0
  AND t.run_at <= extract(epoch FROM now())::float8 AND n = ANY(%(names)s::text[]);

-- name: limits_waiting
SELECT n FROM unnest(%(names)s::text[]) AS n
WHERE EXISTS (SELECT 1 FROM corral_tasks t
              WHERE t.status IN ('PENDING', 'RETRYING') AND cardinality(t.limits) > 0
                AND n = ANY(t.limits) AND t.run_at <= extract(epoch FROM now())::float8);


-- name: set_limit_keys
-- A keyed limit's changed rate starts each of its keys with a full bucket
-- (run before set_limit, which the old rate is read from).
DELETE FROM corral_limit_keys k
WHERE starts_with(k.name, %(name)s || chr(31))
  AND EXISTS (SELECT 1 FROM corral_limits l
              WHERE l.name = %(name)s AND l.rate IS DISTINCT FROM %(rate)s::text);

-- name: limit_key_rows
-- The rows of the keys %(names)s (keys with no row have their whole budget),
-- each looked up by its key: "name = ANY(...)" was planned as a scan of every
-- key's row while the table had no statistics (8 ms at 10 000 keys).
SELECT k.name, k.concurrency, k.rate, NULL::int AS burst, k.paused_until, k.tokens,
       k.counted_at, k.starts
FROM unnest(%(names)s::text[]) AS n(name)
CROSS JOIN LATERAL (SELECT * FROM corral_limit_keys c WHERE c.name = n.name LIMIT 1) AS k;

-- name: key_names_after
-- The next keys' rows after %(after)s in name order, at most %(n)s (forget_keys).
SELECT name FROM corral_limit_keys WHERE name > %(after)s ORDER BY name LIMIT %(n)s;

-- name: forget_key_rows
DELETE FROM corral_limit_keys WHERE name = ANY(%(names)s::text[]);

-- name: key_usage
-- The places held under each of the keys %(names)s (one per claim, lease
-- token, running under it; from the running rows only, bounded by the fleet's
-- slots), with each key's row in the same round trip (the columns of
-- limit_key_rows, NULL for a key with none).
SELECT n.name, coalesce(u.used, 0) AS used, k.paused_until, k.tokens, k.counted_at, k.starts,
       k.concurrency, k.rate, k.name IS NOT NULL AS has_row
FROM unnest(%(names)s::text[]) AS n(name)
LEFT JOIN LATERAL (SELECT c.* FROM corral_limit_keys c WHERE c.name = n.name LIMIT 1) AS k ON true
LEFT JOIN LATERAL (
    SELECT count(DISTINCT h.lease_token) AS used
    FROM corral_held_places h WHERE h.name = n.name) u ON true;

-- name: key_charges
-- The keys a claim took tokens from or logged starts under (one JSON array of
-- [name, tokens, counted_at, starts] rows): each key's row, made on first use.
INSERT INTO corral_limit_keys AS k (name, tokens, counted_at, starts)
SELECT r->>0, (r->>1)::float8, (r->>2)::float8, r->>3 FROM json_array_elements(%(rows)s::json) AS r
ON CONFLICT (name) DO UPDATE SET tokens = excluded.tokens, counted_at = excluded.counted_at,
    starts = excluded.starts;

-- name: limits
-- (the last column: the transaction's now, the time a claim charges tokens
-- and logs starts at: the start time the claim writes, so the starts a
-- window logs are the tasks' own)
SELECT name, concurrency, rate, burst, paused_until, tokens, counted_at, starts,
       per_key, set_by, declared, changed_at, extract(epoch FROM now())::float8 AS now
FROM corral_limits ORDER BY name;

-- The rows of these limits (keys' budgets by their gate name).
-- name: limits_named
SELECT name, concurrency, rate, burst, paused_until, tokens, counted_at, starts
FROM corral_limits WHERE name = ANY(%(names)s) ORDER BY name;

-- A claim took tokens or logged starts: the bucket as counted now, the window's log.
-- name: limit_charge
UPDATE corral_limits SET tokens = %(tokens)s, counted_at = %(at)s, starts = %(starts)s WHERE name = %(name)s;

-- name: breakers
SELECT name, config, state FROM corral_breakers ORDER BY name;

-- name: set_breaker
INSERT INTO corral_breakers (name, config) VALUES (%(name)s, %(config)s)
ON CONFLICT (name) DO UPDATE SET config = excluded.config;

-- name: breaker_save
UPDATE corral_breakers SET state_name = %(state_name)s, state = %(state)s WHERE name = %(name)s;

-- name: breaker_event
INSERT INTO corral_breaker_events (at, name, before, after, reason, calls, failures)
VALUES (%(at)s, %(name)s, %(before)s, %(after)s, %(reason)s, %(calls)s, %(failures)s);

-- name: breaker_events
SELECT at, name, before, after, reason, calls, failures FROM corral_breaker_events
WHERE (%(name)s::text IS NULL OR name = %(name)s::text) ORDER BY id DESC LIMIT %(limit)s;

-- name: report_worker
-- A worker's report: its row written whole, its first start kept.
INSERT INTO corral_workers AS w (id, host, pid, queues, slots, in_use, version, beat_every, started_at, heartbeat_at)
SELECT %(id)s, %(host)s, %(pid)s, %(queues)s::text[], %(slots)s, %(in_use)s, %(version)s, %(beat_every)s,
       c.now, c.now
FROM (SELECT extract(epoch FROM clock_timestamp())::float8 AS now) c
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, queues = excluded.queues, slots = excluded.slots,
    in_use = excluded.in_use, version = excluded.version, beat_every = excluded.beat_every,
    heartbeat_at = excluded.heartbeat_at;

-- name: remove_worker
DELETE FROM corral_workers WHERE id = %(id)s;

-- name: workers
SELECT id, host, pid, queues, slots, in_use, version, beat_every, started_at, heartbeat_at
FROM corral_workers ORDER BY started_at, id;

-- name: forget_workers
-- Silent workers that hold no task any more: the sweeper took their leases back.
DELETE FROM corral_workers w
WHERE w.heartbeat_at < %(before)s
  AND NOT EXISTS (SELECT 1 FROM corral_tasks t WHERE t.status = 'RUNNING' AND t.worker_id = w.id);

-- name: limit_usage
-- (corral_held_places: the rows of running limited tasks only)
SELECT name, count(DISTINCT lease_token) AS used
FROM corral_held_places
GROUP BY name;

-- name: find_stuck
-- RUNNING tasks whose lease was lost (see corral.maintenance.recovery).
SELECT id, version, attempt, max_retries, started_at, timeout, lease_expires_at, crashes
FROM corral_tasks
WHERE status = 'RUNNING' AND lease_expires_at < %(now)s::float8
ORDER BY id
LIMIT %(limit)s;

-- name: find_stale_pending
-- PENDING tasks a worker could have taken since :before and none did:
-- due since then, and ungrouped or their group's head with the group idle
-- (nothing earlier still in line, nothing of it running, no claim of it)
-- since then. A task waiting its turn in a group is never stale.
SELECT t.id, t.version, t.attempt, t.max_retries, t.started_at, t.timeout, t.lease_expires_at
FROM corral_tasks t
WHERE t.status = 'PENDING' AND t.run_at < %(before)s::float8
  AND (t.group_key IS NULL
       OR (NOT EXISTS (SELECT 1 FROM corral_tasks p
                       WHERE p.group_key = t.group_key AND p.id <> t.id
                         AND (p.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                              OR (p.status = 'FAILED' AND p.halt_group_on_failure))
                         AND (p.id < t.id OR p.status = 'RUNNING'))
           AND coalesce((SELECT g.last_claimed_at FROM corral_groups g WHERE g.group_key = t.group_key), 0)
               < %(before)s::float8))
ORDER BY t.id
LIMIT %(limit)s;

-- name: find_expired
-- PENDING tasks never started whose deadline is at or before %(now)s, from the
-- index of tasks with a deadline (empty unless some have one).
SELECT t.id, t.version, t.attempt, t.max_retries, t.started_at, t.timeout, t.lease_expires_at, t.crashes
FROM corral_tasks t
WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s
  AND t.status = 'PENDING' AND t.attempt = 0 AND t.snoozes = 0
ORDER BY t.expires_at, t.id
LIMIT %(limit)s;

-- name: rescue
-- Sweep decisions, each guarded by status and version, and by the lease
-- still being over (a renewal since the read wins): queued again now
-- (RETRYING, PENDING) or ended now (FAILED, CANCELED); a crash counted, and
-- for a crash re-run its attempt given back.
WITH clk AS (SELECT extract(epoch FROM now())::float8 AS now),
d AS (
    SELECT * FROM unnest(%(id)s::bigint[], %(version)s::int[], %(to)s::text[], %(error)s::text[],
                         %(crashed)s::int[], %(give_back)s::int[])
        AS d(id, version, status, error, crashed, give_back)
)
UPDATE corral_tasks t
SET status = d.status, error = coalesce(d.error, t.error),
    crashes = t.crashes + d.crashed, attempt = greatest(0, t.attempt - d.give_back),
    run_at = CASE WHEN d.status IN ('PENDING', 'RETRYING') THEN clk.now ELSE t.run_at END,
    finished_at = CASE WHEN d.status IN ('PENDING', 'RETRYING') THEN t.finished_at ELSE clk.now END,
    worker_id = CASE WHEN d.status IN ('PENDING', 'RETRYING') THEN NULL ELSE t.worker_id END,
    lease_token = NULL, lease_expires_at = NULL, version = t.version + 1
FROM d, clk
WHERE t.id = d.id AND t.version = d.version
  AND (t.status || '') = CASE WHEN d.status = 'CANCELED' THEN 'PENDING' ELSE 'RUNNING' END
  AND coalesce(t.lease_expires_at, 0) < clk.now
RETURNING t.id, t.status, t.queue;

-- name: unsettled
-- Ended tasks whose settling a crash left undone: a WAITING dependent that
-- should have been canceled, or whose upstream tasks have all ended.
SELECT DISTINCT d.dep_id
FROM corral_tasks w
JOIN corral_deps d ON d.task_id = w.id
JOIN corral_tasks u ON u.id = d.dep_id
WHERE w.status = 'WAITING' AND u.status IN ('SUCCESS', 'FAILED', 'TIMEOUT', 'CANCELED')
  AND ((u.status <> 'SUCCESS' AND w.on_upstream_failure = 'cancel')
       OR NOT EXISTS (SELECT 1 FROM corral_deps d2 JOIN corral_tasks u2 ON u2.id = d2.dep_id
                      WHERE d2.task_id = w.id AND u2.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')))
LIMIT %(max_rows)s;

-- name: try_lead
INSERT INTO corral_leaders AS l (role, holder, expires_at)
VALUES (%(role)s, %(holder)s, extract(epoch FROM now())::float8 + %(ttl)s::float8)
ON CONFLICT (role) DO UPDATE
SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at < extract(epoch FROM now())::float8
RETURNING holder;


-- ---- dead letters ----------------------------------------------------------------

-- name: dead_letters
-- Paged by keyset: the ids above %(after)s (0 for the first page), so a deep
-- page reads what the first does.
SELECT * FROM corral_tasks
WHERE status IN ('FAILED', 'TIMEOUT') AND (%(batch)s::text IS NULL OR batch = %(batch)s::text)
  AND id > %(after)s::bigint
ORDER BY id LIMIT %(limit)s OFFSET %(offset)s;

-- name: dead_letters_batch
-- One batch's dead letters, from the batch index: the cost follows the batch,
-- not every dead letter of the store.
SELECT * FROM corral_tasks
WHERE batch = %(batch)s AND status IN ('FAILED', 'TIMEOUT') AND id > %(after)s::bigint
ORDER BY id LIMIT %(limit)s OFFSET %(offset)s;

-- name: dead_ids_batch
SELECT id, group_key FROM corral_tasks
WHERE batch = %(batch)s AND status IN ('FAILED', 'TIMEOUT')
ORDER BY id LIMIT %(limit)s;

-- name: dead_ids
SELECT id, group_key FROM corral_tasks
WHERE status IN ('FAILED', 'TIMEOUT') AND (%(batch)s::text IS NULL OR batch = %(batch)s::text)
ORDER BY id LIMIT %(limit)s;

-- name: lock_groups
-- Group locks in one order, as every writer takes them.
SELECT 1 FROM corral_groups WHERE group_key = ANY(%(groups)s::text[]) ORDER BY group_key FOR UPDATE;

-- name: retry_many
UPDATE corral_tasks
SET status = 'PENDING', run_at = extract(epoch FROM now())::float8, attempt = 0, snoozes = 0, crashes = 0,
    finished_at = NULL, started_at = NULL, error = NULL, traceback = NULL, result = NULL,
    lease_token = NULL, lease_expires_at = NULL, cancel_requested = false,
    progress = NULL, progress_message = NULL, version = version + 1
WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('FAILED', 'TIMEOUT')
RETURNING id, queue;

-- name: failing_kinds
-- Task kinds whose newest failures since %(since)s come %(n)s in a row: the
-- n-th newest failure of the name (among the %(scan)s newest failures) with
-- no success of the name after it.
WITH bad AS (
    SELECT id, name FROM corral_tasks
    WHERE status IN ('FAILED', 'TIMEOUT') AND finished_at >= %(since)s::float8
    ORDER BY id DESC LIMIT %(scan)s
), ranked AS (
    SELECT name, id, row_number() OVER (PARTITION BY name ORDER BY id DESC) AS rn FROM bad
)
SELECT r.name FROM ranked r
WHERE r.rn = %(n)s
  AND NOT EXISTS (SELECT 1 FROM corral_tasks s WHERE s.id > r.id AND s.name = r.name AND s.status = 'SUCCESS')
ORDER BY r.name;

-- ---- fleet control ---------------------------------------------------------------

-- name: fleet_level
SELECT level, manual, calm_since, reason, changed_at FROM corral_fleet WHERE id = 1;

-- name: set_fleet_level
-- An automatic step (auto) applies only while the stored level is not manual.
INSERT INTO corral_fleet AS f (id, level, manual, calm_since, reason, changed_at)
VALUES (1, %(level)s, %(manual)s, %(calm_since)s::float8, %(reason)s, extract(epoch FROM now())::float8)
ON CONFLICT (id) DO UPDATE SET
    level = excluded.level, manual = excluded.manual, calm_since = excluded.calm_since,
    reason = excluded.reason,
    changed_at = CASE WHEN f.level = excluded.level AND f.changed_at IS NOT NULL
                      THEN f.changed_at ELSE excluded.changed_at END
WHERE NOT (%(auto)s::bool AND f.manual)
RETURNING 1;

-- name: add_event
-- The transaction takes its id before the event its number (see read_events:
-- a missing id waits for the transactions that had ids when it was seen).
WITH x AS MATERIALIZED (SELECT pg_current_xact_id()),
ins AS (
    INSERT INTO corral_events (at, kind, subject, data)
    SELECT extract(epoch FROM now())::float8, %(kind)s, %(subject)s, %(data)s FROM x
    RETURNING id
)
SELECT id, pg_notify('corral_events', '') FROM ins;

-- name: events
SELECT id, at, kind, subject, data FROM corral_events_read
WHERE (%(kind)s::text IS NULL OR kind = %(kind)s::text)
ORDER BY id DESC LIMIT %(limit)s;

-- name: read_events
-- Events above the highest delivered id, and those of ids still missing
-- below it; with the snapshot's bounds: a missing id noted while xmax was X
-- is settled (its transaction rolled back) once xmin passes X. Two reads by
-- id, each from the partitions' id indexes (as one OR, a follower far behind
-- would read every id from the floor up).
SELECT e.id, e.at, e.kind, e.subject, e.data,
       pg_snapshot_xmin(s.snap)::text::bigint, pg_snapshot_xmax(s.snap)::text::bigint
FROM (SELECT pg_current_snapshot() AS snap) s
LEFT JOIN LATERAL (
    SELECT * FROM (
        (SELECT id, at, kind, subject, data FROM corral_events_read
         WHERE id > %(hi)s::bigint ORDER BY id LIMIT %(limit)s)
        UNION ALL
        SELECT id, at, kind, subject, data FROM corral_events_read
        WHERE id = ANY(%(gaps)s::bigint[]) AND id <= %(hi)s::bigint
    ) u ORDER BY id LIMIT %(limit)s
) e ON true
ORDER BY e.id;

-- name: stream_now
-- The newest id and the ids below it not committed yet (among the last few
-- thousand above the floor), with the snapshot's xmax: where a follower that
-- starts now begins (at the floor when every event is trimmed).
SELECT greatest(coalesce(max(r.id), 0), f.floor),
       coalesce(array_agg(r.id ORDER BY r.id) FILTER (WHERE r.id IS NOT NULL), '{}'),
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint
FROM (SELECT last_value AS floor FROM corral_events_floor) f
LEFT JOIN LATERAL (SELECT id FROM corral_events WHERE id > f.floor ORDER BY id DESC LIMIT 5000) r ON true
GROUP BY f.floor;

-- name: trim_events
-- Trimming moves the floor (see migration_0049) past the oldest events, by id
-- (ids follow time): those before the first one stamped at or after
-- "before", and all but the newest "keep"; at most "max" of them per
-- statement. No row is deleted. Returns how many it passed and the floor.
-- Run after events_trim_lock in the same transaction: the floor only rises.
WITH f AS (SELECT last_value AS floor FROM corral_events_floor),
cut AS (
    SELECT greatest(
        coalesce((SELECT e.id FROM corral_events e, f
                  WHERE e.id > f.floor AND e.at >= %(before)s::float8 ORDER BY e.id LIMIT 1) - 1,
                 (SELECT max(e.id) FROM corral_events e)),
        coalesce((SELECT e.id FROM corral_events e, f
                  WHERE e.id > f.floor ORDER BY e.id DESC LIMIT 1 OFFSET %(keep)s), 0)) AS id
),
gone AS (
    SELECT e.id FROM corral_events e, f, cut
    WHERE e.id > f.floor AND e.id <= cut.id ORDER BY e.id LIMIT %(max)s
),
moved AS (SELECT count(*) AS n, max(id) AS hi FROM gone)
SELECT moved.n, CASE WHEN moved.n > 0 THEN setval('corral_events_floor', moved.hi) ELSE f.floor END
FROM moved, f;

-- name: events_trim_lock
-- One trimmer at a time, so that the floor (a sequence: not rolled back,
-- never waited for) only rises.
SELECT pg_advisory_xact_lock(7429002);

-- name: events_spent
-- The event partitions holding rows, all at or below the floor (see migration_0049).
SELECT part::text FROM corral_events_spent() AS part;

-- name: events_truncate
-- Empty a spent event partition, its lock waited for "wait_ms" at most.
SELECT corral_events_truncate(%(part)s::regclass, %(wait_ms)s);

-- name: has_schema
-- Whether corral's tables exist in this database (read before any migration).
SELECT to_regclass('corral_meta') IS NOT NULL AND to_regclass('corral_tasks') IS NOT NULL;

-- name: prune
-- Retention: up to "max" finished tasks, oldest finish first, each in a state
-- given a cut-off (NULL: not pruned) and finished before it, read from the
-- index of finish times; their dependency rows go with them. Kept whatever
-- their age: an upstream of a task not ended or ended FAILED/TIMEOUT (a retry
-- runs it with its upstream's results); every task of a batch not finished,
-- or whose callback is not submitted; a halting failure with tasks of its
-- group behind it. A row another transaction holds (a submit naming it as a
-- dependency) is skipped, left for the next pass. OFFSET 0 keeps each check a
-- probe of an index per candidate: as anti-joins the planner would hash the
-- whole table's unfinished rows (status has no statistics) for each pass.
WITH picked AS MATERIALIZED (
        SELECT t.id FROM corral_tasks t
        WHERE t.finished_at < %(oldest)s::float8
          AND t.finished_at < CASE t.status WHEN 'SUCCESS' THEN %(success)s::float8
                                            WHEN 'CANCELED' THEN %(canceled)s::float8
                                            WHEN 'FAILED' THEN %(failed)s::float8
                                            WHEN 'TIMEOUT' THEN %(timeout)s::float8 END
          AND (NOT t.has_dependents OR NOT EXISTS (
              SELECT 1 FROM corral_deps d JOIN corral_tasks w ON w.id = d.task_id
              WHERE d.dep_id = t.id
                AND w.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING', 'FAILED', 'TIMEOUT') OFFSET 0))
          AND (t.batch IS NULL OR (
              NOT EXISTS (SELECT 1 FROM corral_tasks b
                          WHERE b.batch = t.batch AND b.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
                          OFFSET 0)
              AND NOT EXISTS (SELECT 1 FROM corral_batches s
                              WHERE s.name = t.batch AND s.on_complete IS NOT NULL AND s.settled_at IS NULL
                              OFFSET 0)))
          AND NOT (t.status = 'FAILED' AND t.halt_group_on_failure AND t.group_key IS NOT NULL
                   AND EXISTS (SELECT 1 FROM corral_tasks g
                               WHERE g.group_key = t.group_key AND g.id > t.id
                                 AND g.status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING') OFFSET 0))
        ORDER BY t.finished_at LIMIT %(max)s
        FOR UPDATE SKIP LOCKED
), gone AS (
    -- the ids read once: as `id IN (subquery)`, a plan that runs the subquery
    -- again for each row (statistics that saw an empty table) took more than max
    DELETE FROM corral_tasks WHERE id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING id
), deps AS (
    DELETE FROM corral_deps d USING gone WHERE d.task_id = gone.id
)
SELECT count(*) FROM gone;

-- ---- the dashboard's reads ----------------------------------------------------

-- name: queue_counts
-- Unfinished tasks per queue and state, each part matching a partial index
-- active_counts reads (live rows only): no index of its own, so no write pays for it.
SELECT queue, status, count(*) FROM corral_tasks
WHERE status = 'PENDING' AND group_key IS NULL GROUP BY queue, status
UNION ALL
SELECT queue, status, count(*) FROM corral_tasks WHERE status = 'RETRYING' AND group_key IS NULL GROUP BY queue, status
UNION ALL
SELECT queue, status, count(*) FROM corral_tasks
WHERE status IN ('PENDING', 'RETRYING') AND group_key IS NOT NULL GROUP BY queue, status
UNION ALL
SELECT queue, CASE WHEN started_at IS NULL THEN 'RESERVED' ELSE 'RUNNING' END, count(*)
FROM corral_tasks WHERE status = 'RUNNING' GROUP BY 1, 2
UNION ALL
SELECT queue, 'WAITING', count(*) FROM corral_tasks WHERE status = 'WAITING' GROUP BY queue;

-- name: group_lines
-- Groups with a live line (the group-block index), blocked heads first; the
-- head is the line's smallest id.
SELECT l.group_key AS "group", l.n AS backlog, h.id AS head_id, h.name AS head_name,
       CASE WHEN h.status = 'RUNNING' AND h.started_at IS NULL THEN 'RESERVED' ELSE h.status END AS head_status,
       h.worker_id AS head_worker, h.error AS head_error
FROM (SELECT group_key, count(*) AS n, min(id) AS head FROM corral_tasks
      WHERE group_key IS NOT NULL
        AND (status IN ('WAITING', 'PENDING', 'RETRYING', 'RUNNING')
             OR (status = 'FAILED' AND halt_group_on_failure))
      GROUP BY group_key) AS l
JOIN corral_tasks AS h ON h.id = l.head
ORDER BY h.status IN ('FAILED', 'RETRYING', 'TIMEOUT') DESC, l.group_key
LIMIT %(limit)s OFFSET %(offset)s;

-- name: batch_names
-- The next batch names after %(after)s, one index seek each (a loose index
-- scan), so a page costs the same however many tasks the batches hold.
WITH RECURSIVE b(name, k) AS (
    SELECT (SELECT min(batch) FROM corral_tasks WHERE batch > %(after)s), 1
    UNION ALL
    SELECT (SELECT min(batch) FROM corral_tasks WHERE batch > b.name), k + 1
    FROM b WHERE b.name IS NOT NULL AND k < %(limit)s
)
SELECT name FROM b WHERE name IS NOT NULL;

-- name: batch_empty_name
SELECT 1 FROM corral_tasks WHERE batch = '' LIMIT 1;

-- name: batch_status_counts
SELECT batch, status, count(*) FROM corral_tasks WHERE batch = ANY(%(batches)s::text[]) GROUP BY batch, status
UNION ALL
SELECT batch, 'RESERVED', count(*) FROM corral_tasks
WHERE batch = ANY(%(batches)s::text[]) AND status = 'RUNNING' AND started_at IS NULL GROUP BY batch;

-- name: recent_finished
SELECT id, name, queue, status, started_at, finished_at FROM corral_tasks
WHERE finished_at >= %(since)s ORDER BY finished_at, id LIMIT %(limit)s;

-- name: recent_finished_desc
SELECT id, name, queue, status, started_at, finished_at FROM corral_tasks
WHERE finished_at >= %(since)s ORDER BY finished_at DESC, id DESC LIMIT %(limit)s;

-- name: finished_counts
-- The dashboard's sampler once a minute keeps no more durations: counts, no rows.
SELECT floor(finished_at / 60) * 60 AS minute, status, count(*) FROM corral_tasks
WHERE finished_at >= %(since)s AND finished_at < %(until)s GROUP BY 1, 2;

-- name: finished_runs
SELECT id, name, queue, status, run_at, started_at, finished_at FROM corral_tasks
WHERE finished_at >= %(start)s AND finished_at < %(end)s ORDER BY finished_at, id LIMIT %(limit)s;

-- name: save_minute_stat
INSERT INTO corral_minute_stats (minute, queue, name, done, failed, depth, dur_p50, dur_p99, wait_p50, wait_p99)
VALUES (%(minute)s, %(queue)s, %(name)s, %(done)s, %(failed)s, %(depth)s,
        %(dur_p50)s, %(dur_p99)s, %(wait_p50)s, %(wait_p99)s)
ON CONFLICT (minute, queue, name) DO UPDATE SET
    done = EXCLUDED.done, failed = EXCLUDED.failed, depth = EXCLUDED.depth,
    dur_p50 = EXCLUDED.dur_p50, dur_p99 = EXCLUDED.dur_p99,
    wait_p50 = EXCLUDED.wait_p50, wait_p99 = EXCLUDED.wait_p99;

-- name: trim_minute_stats
DELETE FROM corral_minute_stats WHERE minute < %(before)s;

-- name: minute_stats
SELECT minute, queue, name, done, failed, depth, dur_p50, dur_p99, wait_p50, wait_p99
FROM corral_minute_stats WHERE minute >= %(since)s ORDER BY minute, queue, name;

-- ---- periodic schedules ------------------------------------------------------------

-- name: save_schedule
INSERT INTO corral_schedules (name, task, expr, timezone, queue, group_key, overlap, catch_up, max_delay,
                              created_at, updated_at)
VALUES (%(name)s, %(task)s, %(expr)s, %(timezone)s, %(queue)s, %(group_key)s, %(overlap)s, %(catch_up)s,
        %(max_delay)s, %(now)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET
    task = excluded.task, expr = excluded.expr, timezone = excluded.timezone, queue = excluded.queue,
    group_key = excluded.group_key, overlap = excluded.overlap, catch_up = excluded.catch_up,
    max_delay = excluded.max_delay, updated_at = excluded.updated_at;

-- name: schedules
SELECT s.name, s.task, s.expr, s.timezone, s.queue, s.group_key, s.overlap, s.catch_up, s.max_delay,
       s.created_at, s.last_tick, s.last_outcome, s.last_task_id, t.status AS last_task_status
FROM corral_schedules s LEFT JOIN corral_tasks t ON t.id = s.last_task_id
ORDER BY s.name;

-- Lock the schedule's row: its ticks are decided one at a time, so overlap=False
-- sees the task the previous tick enqueued. NULL status: no task, or gone.
-- name: schedule_lock
SELECT s.last_task_id, t.status, extract(epoch FROM now())::float8
FROM corral_schedules s LEFT JOIN corral_tasks t ON t.id = s.last_task_id
WHERE s.name = %(name)s
FOR UPDATE OF s;

-- name: tick_claim
INSERT INTO corral_schedule_ticks (schedule, tick, outcome, task_id, at)
VALUES (%(name)s, %(tick)s, %(outcome)s, NULL, extract(epoch FROM now())::float8)
ON CONFLICT (schedule, tick) DO NOTHING
RETURNING tick;

-- name: tick_set_task
UPDATE corral_schedule_ticks SET task_id = %(task_id)s WHERE schedule = %(name)s AND tick = %(tick)s;

-- name: schedule_ticked
UPDATE corral_schedules SET
    last_tick = %(tick)s, last_outcome = %(outcome)s,
    last_task_id = coalesce(%(task_id)s, last_task_id)
WHERE name = %(name)s AND (last_tick IS NULL OR last_tick <= %(tick)s);

-- Ticks far older than the one just written can never be tried again.
-- name: trim_ticks
DELETE FROM corral_schedule_ticks WHERE schedule = %(name)s AND tick < %(before)s;

-- name: schedule_ticks
SELECT schedule, tick, outcome, task_id, at FROM corral_schedule_ticks
WHERE schedule = %(name)s ORDER BY tick DESC LIMIT %(limit)s;
