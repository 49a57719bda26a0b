"""Limits changed while running (Store.change_limit): only the fields named
change, an operator's change stays in force over a new declaration until
reset, a keyed limit's keys follow, a lower cap starts nothing until under
it, a higher one lets the next claim take more, every change is an event."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from corral.core.events import LIMIT
from corral.core.gates import keyed_name, split_key
from corral.core.model import LimitSettings, LimitSpec
from corral.errors import ConfigError

from .conftest import claim, finish, new, submit


def limited(store, n: int, limit: str = "api") -> list[int]:
    return submit(store, *[new(limits=(limit,)) for _ in range(n)])


def test_a_change_keeps_the_fields_it_does_not_name(store):
    store.set_limit(LimitSpec("api", concurrency=4, rate="10/s", burst=20))
    got = store.change_limit("api", {"concurrency": 2}, by="cli")
    assert (got.concurrency, got.rate, got.burst) == (2, "10/s", 20)
    assert got.set_by == "cli"
    assert got.declared == LimitSettings(4, "10/s", 20)
    listed = store.limits()["api"]
    assert (listed.concurrency, listed.rate, listed.burst, listed.set_by) == (2, "10/s", 20, "cli")
    assert listed.declared == LimitSettings(4, "10/s", 20)
    # a second change keeps the declaration aside, not the first change's settings
    store.change_limit("api", {"rate": "5/s"}, by="dashboard")
    listed = store.limits()["api"]
    assert (listed.concurrency, listed.rate, listed.burst, listed.set_by) == (2, "5/s", 20, "dashboard")
    assert listed.declared == LimitSettings(4, "10/s", 20)


def test_clearing_a_rate_clears_its_burst_and_a_cap_can_be_cleared(store):
    store.set_limit(LimitSpec("api", concurrency=4, rate="10/s", burst=20))
    store.change_limit("api", {"rate": None}, by="cli")
    listed = store.limits()["api"]
    assert (listed.concurrency, listed.rate, listed.burst) == (4, None, None)
    store.change_limit("api", {"concurrency": None, "rate": "3/s"}, by="cli")
    listed = store.limits()["api"]
    assert (listed.concurrency, listed.rate, listed.burst) == (None, "3/s", None)


def test_an_operators_change_outlives_a_new_declaration_until_reset(store):
    store.set_limit(LimitSpec("api", concurrency=4, rate="10/s"))
    store.change_limit("api", {"concurrency": 1}, by="cli")
    # a worker restarts and declares the limit again, even with other values
    now = store.set_limit(LimitSpec("api", concurrency=6, rate="10/s"))
    assert (now.concurrency, now.set_by) == (1, "cli")
    listed = store.limits()["api"]
    assert (listed.concurrency, listed.rate, listed.set_by) == (1, "10/s", "cli")
    assert listed.declared == LimitSettings(6, "10/s", None)
    back = store.change_limit("api", {}, by="cli", reset=True)
    assert (back.concurrency, back.rate, back.set_by, back.declared) == (6, "10/s", None, None)
    listed = store.limits()["api"]
    assert (listed.concurrency, listed.set_by, listed.declared) == (6, None, None)
    # declared again: the declaration is in force
    store.set_limit(LimitSpec("api", concurrency=3))
    assert store.limits()["api"].concurrency == 3


def test_refused_changes_write_nothing(store):
    store.set_limit(LimitSpec("api", concurrency=4, rate="10/s"))
    store.set_limit(LimitSpec("db", concurrency=1))
    with pytest.raises(ConfigError, match=r"^no limit named 'nope'; known: api, db$"):
        store.change_limit("nope", {"concurrency": 2}, by="cli")
    for bad in ({"rate": "8/q"}, {"concurrency": 0}, {"concurrency": 2, "burst": 0}, {"burst": 5, "rate": None}, {}):
        with pytest.raises(ConfigError) as err:
            store.change_limit("api", bad, by="cli")
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        store.change_limit("api", {"concurrency": 2}, by="somebody")
    listed = store.limits()["api"]
    assert (listed.concurrency, listed.rate, listed.set_by) == (4, "10/s", None)
    assert [e for e in store.events(LIMIT) if json.loads(e.data)["action"] != "declare"] == []


def test_a_lower_cap_starts_nothing_until_under_it_and_a_higher_one_more(store):
    store.set_limit(LimitSpec("api", concurrency=4))
    limited(store, 10)
    running = claim(store, 10)
    assert len(running) == 4
    store.change_limit("api", {"concurrency": 2}, by="cli")
    assert claim(store, 10) == []  # 4 held, cap 2: running work goes on, nothing starts
    assert finish(store, running[0].tasks[0]) and finish(store, running[1].tasks[0])
    assert claim(store, 10) == []  # 2 held: at the cap
    assert finish(store, running[2].tasks[0])
    assert len(claim(store, 10)) == 1  # under it: one place
    store.change_limit("api", {"concurrency": 5}, by="cli")
    assert len(claim(store, 10)) == 3  # 2 held, 5 allowed


def test_a_change_is_seen_by_another_store_instances_next_claim(store, second_store):
    store.set_limit(LimitSpec("api", concurrency=1))
    limited(store, 5)
    assert len(claim(second_store, 10)) == 1
    assert claim(second_store, 10) == []  # behind the full limit
    assert claim(second_store, 10) == []  # and it looked again: nothing changed since
    store.change_limit("api", {"concurrency": 3}, by="cli")
    assert len(claim(second_store, 10)) == 2


def test_a_keyed_limits_keys_follow_a_change(store):
    store.set_limit(LimitSpec("merchant", concurrency=1, per_key=True))
    assert store.limits()["merchant"].per_key
    submit(store, *[new(limits=(keyed_name("merchant", k),)) for k in "ab" for _ in range(4)])
    got = claim(store, 20)
    assert Counter(split_key(n)[1] for c in got for t in c.tasks for n in t.limits) == {"a": 1, "b": 1}
    store.change_limit("merchant", {"concurrency": 3}, by="cli")
    more = claim(store, 20)
    assert Counter(split_key(n)[1] for c in more for t in c.tasks for n in t.limits) == {"a": 2, "b": 2}
    assert store.limits()["merchant"].per_key  # a change keeps it keyed
    with pytest.raises(ConfigError, match="no limit named"):
        store.change_limit(keyed_name("merchant", "a"), {"concurrency": 9}, by="cli")


def test_each_change_is_an_event_naming_who(store):
    store.set_limit(LimitSpec("api", concurrency=4))
    store.set_limit(LimitSpec("api", concurrency=4))  # the same declaration again: nothing to record
    store.change_limit("api", {"concurrency": 2}, by="cli")
    store.change_limit("api", {"rate": "5/s"}, by="dashboard")
    store.change_limit("api", {}, by="app", reset=True)
    evs = [json.loads(e.data) for e in reversed(store.events(LIMIT))]
    assert [(e["action"], e["by"]) for e in evs] == [
        ("declare", "app"),
        ("set", "cli"),
        ("set", "dashboard"),
        ("reset", "app"),
    ]
    assert evs[1]["before"] == {"concurrency": 4, "rate": None, "burst": None}
    assert evs[1]["after"] == {"concurrency": 2, "rate": None, "burst": None}
    assert evs[3]["after"] == {"concurrency": 4, "rate": None, "burst": None}
    assert all(e.subject == "limit:api" for e in store.events(LIMIT))
