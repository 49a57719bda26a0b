"""``corral submit``, ``status``, ``tasks``, ``show``, ``cancel`` and ``retry``:
queue tasks and look at or act on what is in the store."""

from __future__ import annotations

from typing import Any

import click

from corral.cli import render
from corral.cli.common import (
    CLIError,
    duration_arg,
    given_store,
    json_arg,
    json_option,
    load_app,
    open_given_store,
    store_option,
    store_url_of,
)
from corral.cli.pauses import pauses_of, print_pauses
from corral.core.model import TaskFilter, TaskRecord
from corral.core.states import FINAL, State
from corral.edges.workers import worker_health
from corral.errors import TaskNotFound
from corral.maintenance.recovery import STALE_PENDING_PREFIX

#: States ``retry`` moves back to PENDING.
RETRYABLE_BY_HAND = (State.FAILED, State.TIMEOUT, State.CANCELED)
#: Tasks fetched a page at a time when ``retry --batch`` collects them.
_PAGE = 500


#: States a task waits in: a list of them (``--status``) says why each waits, as the dashboard's does.
WAITING_STATES = frozenset({State.WAITING, State.PENDING, State.RETRYING, State.RESERVED})


def _reasons(store, rows: list[TaskRecord], status: str | None) -> dict[int, list] | None:
    """Why each row of a list of waiting tasks waits, from one snapshot for
    the page (None for a list not filtered to a waiting state)."""
    if not status or State(status.upper()) not in WAITING_STATES or not rows:
        return None
    from corral.edges.why import explain

    return explain(store, rows)


def _print_rows(store, rows: list[TaskRecord], status: str | None, as_json: bool, **shown: Any) -> None:
    reasons = _reasons(store, rows, status)
    if as_json:
        out = [render.record_dict(r) for r in rows]
        if reasons is not None:
            for d, r in zip(out, rows):
                d["why"] = reasons[r.id][0].text
                d["reasons"] = [x.as_dict() for x in reasons[r.id]]
        render.print_json(out)
        return
    why = {k: v[0].text for k, v in reasons.items()} if reasons is not None else None
    render.print_tasks(rows, why=why, **shown)


def _task(store, task_id: int) -> TaskRecord:
    rec = store.get(task_id)
    if rec is None:
        raise TaskNotFound(f"no task with id {task_id}")
    return rec


def _no_batch(batch: str) -> CLIError:
    return CLIError(f"no batch named {batch!r}")


# ---- submit ----------------------------------------------------------------------------
@click.command()
@click.argument("task_name", metavar="TASK")
@click.argument("args_json", metavar="[ARGS_JSON]", required=False)
@click.option(
    "--app",
    "app_spec",
    envvar="CORRAL_APP",
    required=True,
    metavar="APP",
    help="module:attribute of the App that defines TASK (or $CORRAL_APP).",
)
@store_option
@click.option("--kwargs", "kwargs_json", metavar="JSON", help="Keyword arguments as a JSON object.")
@click.option("--group", help="FIFO lane: one in flight per group, in submit order.")
@click.option("--batch", help="Batch id (aggregate status in `corral status --batch`).")
@click.option("--key", help="Idempotency key: a second submit with it returns the first task.")
@click.option("--delay", metavar="DURATION", help="Run no earlier than this from now (e.g. 30s, 5m).")
@click.option("--priority", type=int, help="Higher runs first.")
@click.option("--queue", help="Queue (default: the task's).")
@click.option("--timeout", metavar="DURATION", help="Override the task's timeout.")
@click.option("--retries", type=click.IntRange(min=0), help="Override the task's retries.")
@click.option(
    "--depends-on",
    "depends_on",
    multiple=True,
    type=int,
    metavar="ID",
    help="Run after this task succeeds (repeatable).",
)
@click.option("--trace-id", help="Trace id (default: a new one).")
@json_option
def submit(
    task_name,
    args_json,
    app_spec,
    store_url,
    kwargs_json,
    group,
    batch,
    key,
    delay,
    priority,
    queue,
    timeout,
    retries,
    depends_on,
    trace_id,
    as_json,
):
    """Queue one run of TASK with ARGS_JSON (a JSON array); print its id.

    Example: corral submit sync_sku '["A1", "tmall"]' --app examples.shop:app --group merchant-1001
    """
    args = json_arg(args_json, "ARGS_JSON", list) if args_json is not None else []
    kwargs = json_arg(kwargs_json, "--kwargs", dict) if kwargs_json is not None else {}
    options: dict[str, Any] = {}
    for name, value in (
        ("group", group),
        ("batch", batch),
        ("key", key),
        ("priority", priority),
        ("queue", queue),
        ("retries", retries),
        ("trace_id", trace_id),
    ):
        if value is not None:
            options[name] = value
    if delay is not None:
        options["delay"] = duration_arg(delay, "--delay")
    if timeout is not None:
        options["timeout"] = duration_arg(timeout, "--timeout")
    if depends_on:
        options["depends_on"] = list(depends_on)
    app = load_app(app_spec, given_store(store_url))
    h = app.submit(task_name, args=args, kwargs=kwargs, **options)
    if as_json:
        render.print_json({"id": h.id, "created": h.created})
    else:
        click.echo(h.id)
        if not h.created:
            click.echo(f"note: key {key!r} matched existing task {h.id}; nothing new was queued", err=True)


# ---- status -------------------------------------------------------------------------------
@click.command()
@store_option
@click.option("--queue", help="Only this queue.")
@click.option("--batch", help="Also show this batch's aggregate status.")
@json_option
def status(store_url, queue, batch, as_json):
    """Task counts per state (and limits in use)."""
    store = open_given_store(store_url, create=False)
    counts = store.counts(queue) if queue else store.counts()
    full = {s.value: int(counts.get(s.value, 0)) for s in render.STATE_ORDER}
    unknown = sum(int(n) for st, n in counts.items() if st not in full)
    if unknown:  # rows whose status names no state: counted, never left out of the total
        full[render.UNKNOWN] = unknown
    specs = store.limits()
    usage = store.limit_usage()
    keys = store.busiest_keys()
    summary = store.batch_summary(batch) if batch else None
    if summary is not None and summary.total == 0:
        raise _no_batch(batch)
    url = store_url_of(store_url)
    health = worker_health(store)
    paused = pauses_of(store)
    if as_json:
        data = render.status_dict(url, full, specs, usage, summary, keys)
        render.print_json(dict(data, workers=health, paused=[p.as_dict() for p in paused]))
    else:
        render.print_status(url, queue, full, specs, usage, summary, keys)
        print_pauses(paused)
        render.print_health(health)


# ---- tasks -------------------------------------------------------------------------------
@click.command()
@store_option
@click.option(
    "--status",
    "state",
    type=click.Choice([s.value for s in render.STATE_ORDER], case_sensitive=False),
    help="Only tasks in this state.",
)
@click.option("--batch", help="Only this batch.")
@click.option("--group", help="Only this group.")
@click.option("--name", help="Only this task name.")
@click.option("--queue", help="Only this queue.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(min=0), default=0)
@click.option("--oldest-first", is_flag=True, help="Oldest first (default: newest first).")
@click.option(
    "--stale",
    is_flag=True,
    help="Only tasks the sweeper canceled because no worker took them in time (`corral retry --stale` re-queues them).",
)
@click.option("--worker", help="Only tasks this worker holds now (RUNNING or RESERVED).")
@click.option("--older", metavar="AGE", help="Only tasks submitted at least AGE ago (90s, 5m, 2h, 1d).")
@click.option("--newer", metavar="AGE", help="Only tasks submitted at most AGE ago.")
@click.option(
    "--sort",
    type=click.Choice(["submitted", "age", "status"]),
    help="submitted: newest first (the default); age: oldest first; status: queued, held, then finished.",
)
@click.option("--after", metavar="POS", help="The page after this position (printed under a full page).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=render.json_help(f"the table cuts it to {render.TABLE_FIELD_CHARS}."),
)
def tasks(
    store_url,
    state,
    batch,
    group,
    name,
    queue,
    limit,
    offset,
    oldest_first,
    stale,
    worker,
    older,
    newer,
    sort,
    after,
    as_json,
):
    """List tasks, newest first. Filtered to a waiting state (WAITING,
    PENDING, RETRYING, RESERVED), each row says why it waits (see `corral why`).

    With --worker, --older, --newer, --sort or --after, pages go by position
    (a deep page costs what the first does), as on the dashboard's Tasks page."""
    if stale and state and state.upper() != State.CANCELED.value:
        raise click.UsageError("--stale lists CANCELED tasks; it does not go with --status " + state.upper())
    if any(v is not None for v in (worker, older, newer, sort, after)):
        if stale or offset:
            raise click.UsageError("--stale and --offset do not go with --worker, --older, --newer, --sort or --after")
        filters = dict(status=state.upper() if state else None, batch=batch, group=group, name=name, queue=queue)
        sort = sort or ("age" if oldest_first else "submitted")
        _find(store_url, filters, worker, older, newer, sort, after, limit, as_json)
        return
    store = open_given_store(store_url, create=False)
    flt = TaskFilter(
        status=State.CANCELED if stale else State(state.upper()) if state else None,
        error_prefix=STALE_PENDING_PREFIX if stale else None,
        queue=queue,
        batch=batch,
        group=group,
        name=name,
        limit=limit,
        offset=offset,
        newest_first=not oldest_first,
    )
    rows = store.list_tasks(flt)
    _print_rows(store, rows, state, as_json, group_filtered=bool(group), batch_filtered=bool(batch), now=store.now())


def _find(store_url, filters, worker, older, newer, sort, after, limit, as_json) -> None:
    """``corral tasks`` by position: the dashboard's query (corral.edges.task_lists)."""
    from corral.edges.task_lists import TaskQuery, find_tasks, parse_age

    try:
        query = TaskQuery(
            **filters,
            worker=worker,
            min_age=parse_age(older) if older else None,
            max_age=parse_age(newer) if newer else None,
            sort=sort,
            after=after,
            limit=limit,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    store = open_given_store(store_url, create=False)
    now = store.now()
    page = find_tasks(store, query, now)
    shown = {"group_filtered": bool(query.group), "batch_filtered": bool(query.batch), "now": now}
    _print_rows(store, page.rows, query.status, as_json, **shown)
    if as_json:
        return
    if page.next is not None:
        click.echo(f"more: --after {page.next}", err=True)


# ---- show -------------------------------------------------------------------------------
@click.command()
@click.argument("task_id", metavar="ID", type=int)
@store_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=render.json_help("App.get(ID) in Python reads it whole."),
)
def show(task_id, store_url, as_json):
    """Every field of one task: state, progress, checkpoint, error, and the
    traceback of the failed attempt its error is from.

    The table cuts big fields (args, result, error, checkpoint) to a readable
    length and notes their full length."""
    rec = _task(open_given_store(store_url, create=False), task_id)
    if as_json:
        render.print_json(render.record_dict(rec))
    else:
        render.print_task(rec)


# ---- cancel / retry ----------------------------------------------------------------------
@click.command()
@click.argument("task_id", metavar="ID", type=int)
@store_option
def cancel(task_id, store_url):
    """Cancel a task: at once if queued, at its next ctx call if running."""
    store = open_given_store(store_url)
    before = _task(store, task_id)
    if before.status in FINAL:
        raise CLIError(f"task {task_id} already ended {before.status.value}; nothing to cancel")
    rec = store.cancel(task_id)
    if rec is None:
        raise TaskNotFound(f"no task with id {task_id}")
    if rec.status is State.CANCELED:
        click.echo(f"task {task_id} canceled")
    elif rec.status is State.RUNNING:
        click.echo(f"task {task_id} is running; cancel requested (it stops at its next ctx call)")
    elif rec.status is State.RESERVED:
        click.echo(f"task {task_id} is held by a worker, not started; cancel requested (it never starts)")
    else:
        raise CLIError(f"task {task_id} is {rec.status.value}; it could not be canceled")


@click.command()
@click.argument("task_id", metavar="ID", type=int, required=False)
@click.option("--batch", help="Retry every FAILED, TIMEOUT or CANCELED task of this batch.")
@click.option(
    "--stale",
    is_flag=True,
    help="Retry every task the sweeper canceled because no worker took it in time (see `corral tasks --stale`).",
)
@click.option(
    "--dead",
    is_flag=True,
    help="Retry every dead letter (FAILED or TIMEOUT; with --batch, of that batch) in one write, "
    "keeping each group's submit order (see `corral dead`).",
)
@store_option
def retry(task_id, batch, stale, dead, store_url):
    """Put a FAILED, TIMEOUT or CANCELED task (or a whole batch's, or every
    stale one the sweeper canceled, or the dead letters) back in the queue."""
    if dead:
        if task_id is not None or stale:
            raise click.UsageError("--dead goes alone or with --batch B")
        store = open_given_store(store_url)
        if batch is not None and store.batch_summary(batch).total == 0:
            raise _no_batch(batch)
        ids = store.retry_dead(batch)
        click.echo(f"{len(ids)} dead letter(s) queued again" + (f" from batch {batch}" if batch else ""))
        return
    if sum((task_id is not None, batch is not None, stale)) != 1:
        raise click.UsageError("give one of: a task ID, --batch B, --stale, --dead [--batch B]")
    store = open_given_store(store_url)
    if stale:
        ids = _ids(store, State.CANCELED, None, STALE_PENDING_PREFIX)
        retried = [i for i in ids if store.retry(i)]
        click.echo(f"{len(retried)} stale task(s) queued again")
        return
    if task_id is not None:
        rec = _task(store, task_id)
        if rec.status not in RETRYABLE_BY_HAND or not store.retry(task_id):
            raise CLIError(
                f"task {task_id} is {rec.status.value}; only FAILED, TIMEOUT or CANCELED tasks can be retried"
            )
        click.echo(f"task {task_id} queued again")
        return
    if store.batch_summary(batch).total == 0:
        raise _no_batch(batch)
    ids = [i for state in RETRYABLE_BY_HAND for i in _ids(store, state, batch)]
    retried = [i for i in sorted(ids) if store.retry(i)]
    click.echo(f"batch {batch}: {len(retried)} task(s) queued again")


def _ids(store, state: State, batch: str | None, error_prefix: str | None = None) -> list[int]:
    """The ids of every task of ``batch`` in ``state``, a page at a time, oldest first."""
    ids: list[int] = []
    while True:
        flt = TaskFilter(
            status=state, batch=batch, error_prefix=error_prefix, limit=_PAGE, offset=len(ids), newest_first=False
        )
        page = store.list_tasks(flt)
        ids.extend(r.id for r in page)
        if len(page) < _PAGE:
            return ids
