"""Periodic tasks through the public API and the CLI: declaring, validating,
running in a worker on a fake clock, testing with corral.testing, listing."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import corral
from corral.cli import cli
from corral.core.clock import FakeClock
from corral.core.cron import ENQUEUED, Schedule
from corral.core.states import State
from corral.errors import ConfigError
from corral.testing import fire_ticks, run_until_idle
from helpers import wait_for

T0 = 1_700_000_100  # a */5 tick


@pytest.fixture
def app():
    a = corral.App("memory://", clock=FakeClock(T0 + 1))
    yield a
    a.close()


def test_periodic_registers_a_task_and_its_schedule(app):
    @app.periodic(
        "*/5 * * * *",
        name="refresh_prices",
        queue="prices",
        group="g",
        timezone="Europe/Paris",
        overlap=False,
        catch_up="all",
        max_delay="1h",
        retries=2,
    )
    def refresh(ctx):
        return "ok"

    assert app.registry["refresh_prices"] is refresh
    assert (refresh.queue, refresh.retries) == ("prices", 2)
    s = app.schedules["refresh_prices"]
    assert (s.task, s.expr, s.queue, s.group, s.timezone) == (
        "refresh_prices",
        "*/5 * * * *",
        "prices",
        "g",
        "Europe/Paris",
    )
    assert (s.overlap, s.catch_up, s.max_delay, s.max_retries) == (False, "all", 3600.0, 2)


def test_cron_option_of_task_and_a_second_schedule_for_a_task(app):
    @app.task(cron="@hourly", queue="q")
    def cleanup():
        pass

    app.periodic("0 3 * * *", name="cleanup_nightly", timezone="Asia/Tokyo")(cleanup)
    assert sorted(app.schedules) == ["cleanup", "cleanup_nightly"]
    assert app.schedules["cleanup"] == Schedule("cleanup", "cleanup", "@hourly", queue="q")
    assert app.schedules["cleanup_nightly"].task == "cleanup"


@pytest.mark.parametrize(
    ("expr", "kw", "message"),
    [
        ("*/5 * * *", {}, "needs five"),
        ("0 0 30 2 *", {}, "never fires"),
        ("* * * * *", {"timezone": "Nowhere/City"}, "unknown timezone"),
        ("* * * * *", {"catch_up": "some"}, "catch_up must be one of"),
        ("* * * * *", {"max_delay": "soon"}, "max_delay"),
        ("* * * * *", {"overlap": "no"}, "overlap must be"),
    ],
)
def test_a_bad_schedule_fails_at_definition_with_one_line_and_registers_nothing(app, expr, kw, message):
    with pytest.raises(ConfigError, match=message) as info:

        @app.periodic(expr, **kw)
        def job():
            pass

    assert "\n" not in str(info.value)
    assert app.registry == {} and app.schedules == {}
    with pytest.raises(ConfigError):
        app.task(cron=expr if not kw else "bad")(lambda: None)
    assert app.registry == {} and app.schedules == {}


def test_a_periodic_function_that_needs_arguments_is_refused(app):
    with pytest.raises(ConfigError, match="called with no arguments, but job\\(\\) needs sku"):

        @app.periodic("* * * * *")
        def job(ctx, sku):
            pass

    with pytest.raises(ConfigError, match="called with no arguments"):
        app.task(cron="@daily")(lambda sku: None)
    assert app.registry == {}
    with pytest.raises(ConfigError, match="already registered"):
        app.periodic("* * * * *", name="x")(lambda: None)
        app.periodic("* * * * *", name="x")(lambda: None)


def test_a_worker_enqueues_and_runs_each_tick_on_the_fake_clock(app):
    runs = []

    @app.periodic("*/5 * * * *")
    def job(ctx):
        runs.append(ctx.task_id)

    app.start(2, periodic_interval=0.01, poll_interval=0.01)
    wait_for(lambda: [s.name for s in app.store.schedules()] == ["job"], timeout=10)
    for k in range(1, 4):
        app.clock.advance(300)
        wait_for(lambda n=k: len(runs) == n, timeout=10, message=f"tick {k} ran")
    # the last run's outcome is written a moment after its function returns
    (st,) = wait_for(lambda: [s for s in app.store.schedules() if s.last_task_status == "SUCCESS"], timeout=10)
    assert st.last_tick == T0 + 900


def test_testing_kit_fires_ticks_by_hand(app):
    @app.periodic("*/5 * * * *", overlap=False)
    def job():
        return 1

    assert fire_ticks(app) == []  # stores the schedule; nothing is due yet
    app.clock.advance(300)
    (first,) = fire_ticks(app)
    assert first.status is State.PENDING
    app.clock.advance(300)
    assert fire_ticks(app) == []  # overlap=False: the first run is still queued, this tick is skipped
    assert [r.id for r in run_until_idle(app)] == [first.id]
    app.clock.advance(300)
    (third,) = fire_ticks(app)
    assert [r.status for r in run_until_idle(app)] == [State.SUCCESS]
    assert [t.outcome for t in app.store.schedule_ticks("job")] == [ENQUEUED, "skipped", ENQUEUED]
    assert third.id > first.id


def test_corral_periodic_lists_schedules_from_the_store(sqlite_url):
    corral.App(sqlite_url).close()
    runner = CliRunner()
    out = runner.invoke(cli, ["periodic", "--store", sqlite_url])
    assert out.exit_code == 0 and "no schedules stored" in out.stdout
    clock = FakeClock(T0 + 1)
    with corral.App(sqlite_url, clock=clock) as a:

        @a.periodic("*/5 * * * *", name="refresh_prices", timezone="Europe/Paris", overlap=False)
        def refresh():
            pass

        fire_ticks(a)
        clock.advance(300)
        (task,) = fire_ticks(a)
    out = runner.invoke(cli, ["periodic", "--store", sqlite_url])
    assert out.exit_code == 0, out.output
    for text in (
        "refresh_prices",
        "*/5 * * * *",
        "Europe/Paris",
        "2023-11-14 23:20 CET",  # the last tick, in the schedule's zone
        f"task {task.id} PENDING",
    ):
        assert text in out.stdout, out.stdout
    out = runner.invoke(cli, ["periodic", "--store", sqlite_url, "--json"])
    (row,) = json.loads(out.stdout)
    assert (row["name"], row["last_tick"], row["last_task_id"], row["overlap"]) == (
        "refresh_prices",
        T0 + 300,
        task.id,
        False,
    )


def test_corral_periodic_with_an_app_lists_its_schedules_before_any_worker_ran(sqlite_url):
    out = CliRunner().invoke(cli, ["periodic", "--store", sqlite_url, "apps.cron_app:app", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert [(r["name"], r["cron"], r["last_tick"]) for r in rows] == [
        ("nightly_report", "0 3 * * *", None),
        ("refresh_prices", "*/5 * * * *", None),
    ]
    assert rows[0]["next_tick"] is not None
    bad = CliRunner().invoke(cli, ["periodic", "--store", sqlite_url, "apps.nowhere:app"])
    assert bad.exit_code != 0 and len(bad.output.strip().splitlines()) == 1


def test_an_older_sqlite_file_gains_the_schedule_tables(sqlite_url):
    import sqlite3

    from corral.stores import open_store
    from corral.stores.sqlite import SCHEMA_VERSION

    open_store(sqlite_url).migrate()
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as con:  # the file as schema 6 left it
        con.execute("DROP TABLE schedules")
        con.execute("DROP TABLE schedule_ticks")
        con.execute("DELETE FROM corral_schema")
        con.execute("INSERT INTO corral_schema (version) VALUES (6)")
    store = open_store(sqlite_url)
    try:
        store.migrate()
        store.save_schedules([Schedule("s", "t", "@daily")], now=T0)
        assert [s.name for s in store.schedules()] == ["s"]
        with sqlite3.connect(path) as con:
            assert con.execute("SELECT max(version) FROM corral_schema").fetchone()[0] == SCHEMA_VERSION
    finally:
        store.close()
