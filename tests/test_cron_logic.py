"""The pure tick logic of periodic tasks: next ticks, catch-up choices, time zones and DST."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from corral.core.cron import Schedule, check_expression, due_ticks
from corral.errors import ConfigError

T0 = 1_700_000_100  # a multiple of 300: a */5 tick (2023-11-14 22:15 UTC)


def every5(**kw) -> Schedule:
    return Schedule(name="s", task="t", expr="*/5 * * * *", **kw)


def local(ts: int, tz: str) -> str:
    return datetime.fromtimestamp(ts, Schedule("x", "t", "* * * * *", timezone=tz).tz).strftime("%Y-%m-%d %H:%M%z")


def test_next_and_latest_tick():
    s = every5()
    assert s.next_after(T0) == T0 + 300  # strictly after
    assert s.next_after(T0 - 1) == T0
    assert s.latest(T0) == T0  # at or before
    assert s.latest(T0 - 1) == T0 - 300
    assert s.ticks(T0 - 300, T0 + 600) == [T0, T0 + 300, T0 + 600]
    assert s.ticks(T0 - 300, T0 + 600, limit=2) == [T0, T0 + 300]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "invalid cron expression"),
        ("* * * *", "has 4 field"),
        ("*/5 * * * * *", "has 6 field"),
        ("0 0 31 2 *", "never fires"),
        ("@fortnightly", "unknown cron alias"),
        ("", "five fields"),
    ],
)
def test_bad_expressions_fail_with_one_line(expr, message):
    with pytest.raises(ConfigError, match=message) as info:
        check_expression(expr)
    assert "\n" not in str(info.value)


def test_aliases_and_spacing_are_normalised():
    assert check_expression("@Hourly") == "@hourly"
    assert check_expression(" */5  *  * * * ") == "*/5 * * * *"


def test_bad_timezone_and_options():
    with pytest.raises(ConfigError, match="unknown timezone"):
        every5(timezone="Mars/Olympus")
    with pytest.raises(ConfigError, match="catch_up must be one of"):
        every5(catch_up="some")
    with pytest.raises(ConfigError, match="max_delay"):
        every5(max_delay=0)


def test_timezone_decides_the_wall_clock_hour():
    paris = Schedule("p", "t", "0 9 * * *", timezone="Europe/Paris")
    start = int(datetime(2026, 7, 1, tzinfo=UTC).timestamp())
    tick = paris.next_after(start)
    assert local(tick, "Europe/Paris") == "2026-07-01 09:00+0200"
    assert datetime.fromtimestamp(tick, UTC).hour == 7


def test_dst_spring_forward_runs_the_skipped_time_once_after_the_gap():
    daily = Schedule("d", "t", "30 2 * * *", timezone="Europe/Paris")
    start = int(datetime(2026, 3, 28, 12, tzinfo=UTC).timestamp())
    ticks = daily.ticks(start, start + 3 * 86400)
    assert [local(t, "Europe/Paris") for t in ticks] == [
        "2026-03-29 03:00+0200",  # 02:30 does not exist that night
        "2026-03-30 02:30+0200",
        "2026-03-31 02:30+0200",
    ]


def test_dst_fall_back_runs_a_named_hour_once_and_every_hour_twice():
    daily = Schedule("d", "t", "30 2 * * *", timezone="Europe/Paris")
    start = int(datetime(2026, 10, 24, 12, tzinfo=UTC).timestamp())
    ticks = daily.ticks(start, start + 2 * 86400)
    assert [local(t, "Europe/Paris") for t in ticks] == ["2026-10-25 02:30+0200", "2026-10-26 02:30+0100"]
    hourly = Schedule("h", "t", "30 * * * *", timezone="Europe/Paris")
    night = int(datetime(2026, 10, 25, 0, 0, tzinfo=UTC).timestamp())  # 02:00 CEST
    ticks = hourly.ticks(night - 1, night + 3 * 3600)
    assert [local(t, "Europe/Paris") for t in ticks] == [
        "2026-10-25 02:30+0200",
        "2026-10-25 02:30+0100",  # the repeated hour: real time goes on, so does an hourly job
        "2026-10-25 03:30+0100",
    ]
    assert daily.latest(int(datetime(2026, 10, 25, 2, 0, tzinfo=UTC).timestamp())) == ticks[0]


def test_catch_up_latest_takes_only_the_newest_missed_tick():
    s = every5()
    down_since = T0
    now = T0 + 3600 + 17
    assert due_ticks(s, down_since, now, last_check=now) == [T0 + 3600]


def test_catch_up_all_takes_every_missed_tick_in_order():
    s = every5(catch_up="all")
    assert due_ticks(s, T0, T0 + 1500, last_check=T0 + 1500) == [T0 + 300, T0 + 600, T0 + 900, T0 + 1200, T0 + 1500]
    assert due_ticks(s, T0, T0 + 1500, last_check=T0 + 1500, limit=2) == [T0 + 300, T0 + 600]


def test_catch_up_none_takes_only_ticks_that_came_while_watching():
    s = every5(catch_up="none")
    # just started (last check = now): the ticks of the downtime are dropped
    assert due_ticks(s, T0, T0 + 1000, last_check=T0 + 1000) == []
    # watching since T0 + 1000: the tick at T0 + 1200 came on time
    assert due_ticks(s, T0, T0 + 1201, last_check=T0 + 1000) == [T0 + 1200]


def test_max_delay_drops_ticks_too_old_in_every_mode():
    for mode in ("latest", "all", "none"):
        s = every5(catch_up=mode, max_delay=60)
        assert due_ticks(s, T0 - 300, T0 + 61, last_check=T0 - 1) == [], mode
        assert due_ticks(s, T0 - 300, T0 + 60, last_check=T0 - 1) == [T0], mode
    daily = Schedule("d", "t", "0 3 * * *", max_delay=3600)
    three = int(datetime(2026, 5, 2, 3, tzinfo=UTC).timestamp())
    assert due_ticks(daily, three - 86400, three + 2 * 3600, last_check=three + 2 * 3600) == []
    assert due_ticks(daily, three - 86400, three + 1800, last_check=three + 1800) == [three]


def test_nothing_is_due_at_or_before_what_was_handled():
    s = every5()
    assert due_ticks(s, T0, T0 + 299, last_check=T0) == []
    assert due_ticks(s, T0 + 300, T0 + 300, last_check=T0) == []
    assert due_ticks(s, T0, T0 + 300, last_check=T0) == [T0 + 300]


def test_each_tick_builds_the_task_of_the_schedule():
    s = Schedule("s", "refresh", "@hourly", queue="low", group="g", max_retries=2, limits=("api",))
    a, b = s.new_task(T0), s.new_task(T0)
    assert (a.name, a.queue, a.group, a.max_retries, a.limits) == ("refresh", "low", "g", 2, ("api",))
    assert a.trace_id != b.trace_id


def test_a_tick_ahead_of_the_stores_clock_is_too_early_and_stamps_never_run_ahead():
    from corral.core.cron import MAX_CLOCK_AHEAD, first_stamp, too_early

    assert not too_early(1000, 1000) and not too_early(1000 + MAX_CLOCK_AHEAD, 1000)
    assert too_early(1000 + MAX_CLOCK_AHEAD + 1, 1000)
    assert first_stamp(5000.0, 1000.0) == 1000.0  # a clock an hour ahead: the store's time
    assert first_stamp(1003.0, 1000.0) == 1000.0  # even a clock ahead within the bound a tick has
    assert first_stamp(900.0, 1000.0) == 900.0  # behind: its own time, as before
