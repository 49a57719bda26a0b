"""One validation for every store: the bounds of ``core/validation.py``,
checked once in the API layer, so a bad value gives the same one-line error
on memory, SQLite and PostgreSQL and stores nothing; payload caps on
arguments and results; worker options; limits that must be declared."""

from __future__ import annotations

import math
import random
import string

import pytest

import corral
from corral.core import validation as check
from corral.core.clock import FakeClock
from corral.core.model import NewTask
from corral.core.retries import Backoff, retry_delay
from corral.errors import BadArguments, ConfigError, Retry, StoreError, StoreUnavailable
from corral.stores import open_store
from helpers import ARGS

NAN, INF = math.nan, math.inf


# ---- the pure checks ---------------------------------------------------------------------------
@pytest.mark.parametrize("value", [1.5, True, "5", NAN, None, 10_001, -1, 10**12])
def test_integer_refuses_floats_bools_strings_and_out_of_range(value):
    with pytest.raises(ConfigError, match=r"^retries must be an integer from 0 to 10000, not "):
        check.integer(value, "retries", check.RETRIES_RANGE)


def test_integer_keeps_its_bounds_and_raises_the_class_asked_for():
    assert check.integer(0, "retries", check.RETRIES_RANGE) == 0
    assert check.integer(10_000, "retries", check.RETRIES_RANGE) == 10_000
    assert check.integer(-(2**31), "priority", check.PRIORITY_RANGE) == -(2**31)
    with pytest.raises(BadArguments):
        check.integer(2**31, "priority", check.PRIORITY_RANGE, BadArguments)


@pytest.mark.parametrize("value", [NAN, INF, -INF, -5, 0, 1e12, True, "5", None])
def test_seconds_must_be_finite_positive_and_at_most_ten_years(value):
    with pytest.raises(ConfigError, match=r"^timeout must be a (finite )?number of seconds > 0 and at most 315576000"):
        check.seconds(value, "timeout")


def test_seconds_may_allow_zero_and_a_minimum():
    assert check.seconds(0, "delay", zero_ok=True) == 0.0
    assert check.seconds(check.MAX_DURATION, "delay", zero_ok=True) == check.MAX_DURATION
    with pytest.raises(ConfigError, match="lease_seconds"):
        check.seconds(0.5, "lease_seconds", minimum=1.0, zero_ok=True)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("a\x00b", "NUL"),
        ("x" * 256, "1 to 255 characters, not 256"),
        ("", "1 to 255 characters, not 0"),
        ("\ud800", "lone surrogate"),
        (5, "must be a string, not 5"),
        (b"g", "must be a string"),
    ],
)
def test_text_refuses_what_some_store_cannot_hold(value, says):
    with pytest.raises(ConfigError, match="^group ") as exc:
        check.text(value, "group")
    assert says in str(exc.value)
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 200  # never echoes a big value


def test_text_takes_255_characters_of_any_script():
    assert check.text("\U0001f600" * 255, "key") == "\U0001f600" * 255


def test_payload_is_measured_in_utf8_bytes():
    assert check.payload_problem("x" * 1024, 1024, "arguments of t") is None
    assert check.payload_problem("é" * 512, 1024, "arguments of t") is None  # 2 bytes each
    problem = check.payload_problem("é" * 513, 1024, "arguments of t")
    assert problem == (
        "arguments of t: 1026 bytes as JSON, over the limit of 1024 bytes (App(max_payload_bytes=...) sets it)"
    )
    assert "lone surrogate" in check.payload_problem('["\ud800"]', 1024, "the result")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"lease_seconds": NAN}, "lease_seconds"),
        ({"concurrency": 100_000}, "concurrency must be an integer from 1 to 1000"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"heartbeat_interval": NAN}, "heartbeat_interval"),
        ({"heartbeat_interval": 30.0}, "heartbeat_interval must be shorter than lease_seconds"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"sweep_interval": 0}, "sweep_interval"),
        ({"retry_share": 0}, "retry_share must be a number greater than 0 and at most 1, not 0"),
        ({"retry_share": 1.5}, "retry_share"),
        ({"retry_share": NAN}, "retry_share"),
        ({"retry_share": True}, "retry_share"),
        ({"retry_share": "0.5"}, "retry_share"),
    ],
)
def test_worker_options_that_would_spin_or_explode_are_refused(options, says):
    app = corral.App("memory://")
    with pytest.raises(ConfigError, match=says) as exc:
        app.worker(**options)
    assert "\n" not in str(exc.value)


def test_worker_retry_share_defaults_to_a_quarter_and_none_turns_it_off():
    app = corral.App("memory://")
    assert app.worker().retry_share == check.DEFAULT_RETRY_SHARE == 0.25
    assert app.worker(retry_share=1).retry_share == 1.0
    assert app.worker(retry_share=None).retry_share is None


def test_retry_cap_is_the_share_rounded_up_and_never_zero():
    assert check.retry_cap(4, 0.25) == 1
    assert check.retry_cap(10, 0.3) == 3  # 10 * 0.3 is 3.0000000000000004 in floats
    assert check.retry_cap(5, 0.25) == 2
    assert check.retry_cap(1, 0.01) == 1
    assert check.retry_cap(8, 1.0) == 8
    assert check.retry_cap(8, None) is None


def test_backoff_holds_through_thousands_of_retries_and_refuses_nan():
    assert Backoff(jitter=0.0).delay(5_000) == 300.0  # 2**4999 overflows a float: the cap holds
    with pytest.raises(ConfigError, match="Backoff base"):
        Backoff(base=NAN)
    assert retry_delay(Retry(after=2.5), 1, Backoff()) == 2.5


@pytest.mark.parametrize("after", [NAN, -100, INF, "5", True])
def test_retry_refuses_a_pause_that_is_not_a_finite_number_of_seconds(after):
    with pytest.raises(ConfigError, match=r"^Retry\(after=\.\.\.\) must be a (finite )?number of seconds >= 0") as exc:
        Retry(after=after)
    assert "\n" not in str(exc.value)
    assert Retry(after=0).after == 0.0 and Retry().after is None


def test_a_task_asking_to_run_later_after_nan_seconds_fails_saying_why():
    app = corral.App("memory://", clock=FakeClock())

    @app.task(retries=3)
    def odd(ctx):
        ctx.retry(after=NAN)

    h = odd.submit()
    from corral.testing import run_until_idle

    run_until_idle(app)
    rec = app.get(h.id)
    assert rec.status is corral.State.FAILED and rec.attempt == 1
    assert "Retry(after=...) must be a finite number of seconds" in rec.error


@pytest.mark.parametrize("max_delay", [NAN, -1, 0, INF, "nan"])
def test_periodic_refuses_a_max_delay_that_is_not_a_positive_finite_duration(max_delay):
    app = corral.App("memory://")
    with pytest.raises(ConfigError, match="^max_delay must be") as exc:
        app.periodic("@hourly", max_delay=max_delay)(lambda: None)
    assert "\n" not in str(exc.value)


# ---- declarations ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"retries": NAN}, "retries"),
        ({"retries": 1.5}, "retries"),
        ({"retries": True}, "retries"),
        ({"retries": 10**12}, "retries"),
        ({"priority": 1.7}, "priority"),
        ({"priority": "5"}, "priority"),
        ({"timeout": INF}, "timeout"),
        ({"timeout": NAN}, "timeout"),
        ({"queue": "q\x00"}, "queue"),
        ({"queue": "q" * 9000}, "queue"),
        ({"limits": "api"}, "limits must be a list of names"),
        ({"limits": ["a\x00"]}, "limits"),
        ({"name": "n" * 256}, "task name"),
        ({"retry_on": ValueError(1)}, "retry_on"),
        ({"halt_group_on_failure": 1}, "halt_group_on_failure"),
    ],
)
def test_task_declarations_are_checked(options, says):
    app = corral.App("memory://")
    with pytest.raises(ConfigError, match=says):
        app.task(lambda: None, **options)
    assert app.registry == {}


@pytest.mark.parametrize("value", [NAN, 0, True, 1.5, "5", 2**31])
def test_limit_concurrency_is_checked(value):
    app = corral.App("memory://")
    with pytest.raises(ConfigError, match="a limit's concurrency must be an integer from 1 to 2147483647"):
        app.limit("api", concurrency=value)
    assert app.store.limits() == {}


def test_app_options_are_checked():
    with pytest.raises(ConfigError, match="max_payload_bytes must be an integer from 1024"):
        corral.App("memory://", max_payload_bytes=10)
    with pytest.raises(ConfigError, match="max_queued"):
        corral.App("memory://", max_queued=0)
    with pytest.raises(ConfigError, match="full_timeout"):
        corral.App("memory://", full_timeout=NAN)


# ---- submit: the same on every store -------------------------------------------------------------
@pytest.fixture
def app(url: str):
    a = corral.App(url, clock=FakeClock())
    yield a
    a.close(timeout=5)


BAD_SUBMITS = {
    "timeout nan": {"timeout": NAN},
    "timeout inf": {"timeout": INF},
    "timeout 0": {"timeout": 0},
    "timeout str": {"timeout": "5"},
    "delay -5": {"delay": -5},
    "delay nan": {"delay": NAN},
    "delay 1e12": {"delay": 1e12},
    "delay bool": {"delay": True},
    "retries 1.5": {"retries": 1.5},
    "retries str": {"retries": "5"},
    "retries 10**12": {"retries": 10**12},
    "retries -1": {"retries": -1},
    "priority 1.7": {"priority": 1.7},
    "priority bool": {"priority": True},
    "priority 2**31": {"priority": 2**31},
    "group NUL": {"group": "g\x00"},
    "batch NUL": {"batch": "b\x00"},
    "key NUL": {"key": "k\x00"},
    "queue NUL": {"queue": "q\x00"},
    "trace_id NUL": {"trace_id": "t\x00"},
    "group surrogate": {"group": "\udcff"},
    "key 3 kB": {"key": "k" * 3000},
    "queue 9 kB": {"queue": "q" * 9000},
    "group empty": {"group": ""},
    "group int": {"group": 1001},
    "depends_on str": {"depends_on": ["1"]},
    "depends_on bool": {"depends_on": [True]},
    "depends_on bare": {"depends_on": 5},
    "args str": {"args": "abc"},
    "kwargs int key": {"kwargs": {1: "x"}},
    "args object": {"args": (object(),)},
    "args surrogate": {"args": ("\ud800",)},
    "args 2 MB": {"args": ("x" * 2_000_000,)},
    "unknown option": {"dealy": 5},
}


def _errors(app: corral.App) -> dict[str, tuple[str, str]]:
    @app.task(name=f"t{len(app.registry)}")
    def t(*args, **kwargs):
        return None

    out = {}
    for case, options in BAD_SUBMITS.items():
        with pytest.raises(BadArguments) as exc:
            app.submit_many(t, [dict(options)])
        out[case] = (type(exc.value).__name__, str(exc.value))
    return out


def test_bad_submits_give_one_error_on_every_store_and_store_nothing(app):
    errors = _errors(app)
    reference = _errors(corral.App("memory://"))
    for case, (_kind, message) in errors.items():
        assert "\n" not in message and len(message) < 300, (case, message)
        option = case.split()[0]
        assert option in message or "arguments of" in message or "submit option" in message, (case, message)
    # the same class and words everywhere (task names differ: t0 here, t0 there)
    assert errors == reference
    assert sum(app.counts().values()) == 0


def test_one_bad_item_of_a_batch_stores_none(app):
    @app.task
    def t(i):
        return i

    good = [{"args": (i,), "group": "g"} for i in range(5)]
    with pytest.raises(BadArguments, match="group must not contain a NUL character"):
        app.submit_many(t, [*good, {"args": (9,), "group": "g\x00"}])
    with pytest.raises(BadArguments, match="delay"):
        t.submit_many([(1,), {"args": (2,), "delay": NAN}])
    assert sum(app.counts().values()) == 0
    assert len(app.submit_many(t, good)) == 5  # the same good items alone are stored


def test_values_at_the_bounds_are_stored_alike_on_every_store(app):
    @app.task
    def t(*args):
        return None

    wide = "\U0001f600" * check.MAX_TEXT_CHARS  # 1 020 bytes of UTF-8: fits a PostgreSQL index entry
    h = app.submit(
        t,
        args=("nul \x00 in arguments is escaped JSON",),
        key=wide,
        group=wide,
        batch=wide,
        queue=wide,
        trace_id=wide,
        retries=10_000,
        priority=-(2**31),
        timeout=check.MAX_DURATION,
        delay=check.MAX_DURATION,
    )
    rec = h.get()
    assert (rec.key, rec.group, rec.batch, rec.queue, rec.trace_id) == (wide,) * 5
    assert (rec.max_retries, rec.priority, rec.timeout) == (10_000, -(2**31), check.MAX_DURATION)
    assert rec.arguments == (["nul \x00 in arguments is escaped JSON"], {})
    assert app.submit(t, key=wide).id == h.id  # the key matches itself


def test_limit_declared_neither_here_nor_in_the_store_refuses_the_submit(app):
    @app.task(limits=["partner_api"])
    def call():
        return None

    with pytest.raises(ConfigError, match=r"names limit 'partner_api', declared neither in this app nor in its store"):
        call.submit()
    assert sum(app.counts().values()) == 0
    app.limit("partner_api", concurrency=2)  # declared after the task, as a module may do
    assert call.submit().get().limits == ("partner_api",)


def test_limit_declared_by_another_app_of_the_store_is_enough(app):
    if app.store.url.startswith("memory"):
        other = corral.App(app.store)  # memory is shared only through the same store object
    else:
        other = corral.App(app.store.url)
    other.limit("shared_api", concurrency=3)
    other.close()

    @app.task(limits=["shared_api"])
    def call():
        return None

    asked = []
    real = app.store.limits

    def limits():
        asked.append(1)
        return real()

    app.store.limits = limits  # type: ignore[method-assign]
    call.submit()
    call.submit_many([(), ()])
    assert len(asked) == 1, "the store is asked once; the name is known after"
    assert sum(app.counts().values()) == 3


# ---- payload caps ---------------------------------------------------------------------------------
def test_arguments_over_the_default_cap_are_refused():
    app = corral.App("memory://")

    @app.task
    def t(blob):
        return None

    assert check.DEFAULT_MAX_PAYLOAD_BYTES == 1_048_576
    t.submit("x" * 1_000_000)
    with pytest.raises(BadArguments, match=r"arguments of t: 1048601 bytes as JSON, over the limit of 1048576"):
        t.submit("x" * 1_048_576)
    assert sum(app.counts().values()) == 1


def test_the_cap_is_set_per_app():
    app = corral.App("memory://", max_payload_bytes=4096)

    @app.task
    def t(blob):
        return None

    with pytest.raises(BadArguments, match="over the limit of 4096 bytes"):
        t.submit("x" * 5000)
    assert sum(app.counts().values()) == 0


def test_a_result_over_the_cap_fails_the_task_for_good():
    app = corral.App("memory://", max_payload_bytes=4096)
    runs = []

    @app.task(retries=3)
    def big():
        runs.append(1)
        return "x" * 5000

    @app.task
    def small():
        return "ok"

    h, ok = big.submit(), small.submit()
    app.start(workers=2)
    try:
        with pytest.raises(corral.TaskFailed, match=r"the result: 5002 bytes as JSON, over the limit of 4096"):
            h.result(timeout=10)
        assert ok.result(timeout=10) == "ok"
        assert h.get().status is corral.State.FAILED and runs == [1], "not retried: it would fail the same way"
    finally:
        app.close(timeout=5)


# ---- PostgreSQL: a data error is not an outage ----------------------------------------------------
def test_postgres_index_entry_too_big_is_a_store_error_not_an_outage(pg_url):
    store = open_store(pg_url)
    try:
        store.migrate()
        rng = random.Random(7)
        key = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(6000))  # incompressible
        with pytest.raises(StoreError) as exc:
            store.submit([NewTask(name="t", args=ARGS, key=key)])
        assert not isinstance(exc.value, StoreUnavailable), str(exc.value)
        assert "cannot reach" not in str(exc.value) and "index row" in str(exc.value)
        assert sum(store.counts().values()) == 0
        store.submit([NewTask(name="t", args=ARGS, key="k")])  # the store still works
        assert sum(store.counts().values()) == 1
    finally:
        store.close()


def test_postgres_outage_is_told_by_sqlstate():
    from corral.stores.postgres import _is_outage

    class Err(Exception):
        def __init__(self, sqlstate):
            self.sqlstate = sqlstate

    assert _is_outage(Err(None))  # the connection broke: no server answer at all
    assert _is_outage(Err("08006")) and _is_outage(Err("57P01")) and _is_outage(Err("53300"))
    assert not _is_outage(Err("54000"))  # program limit exceeded: index row size
    assert not _is_outage(Err("57014"))  # a statement timeout is not the server gone
