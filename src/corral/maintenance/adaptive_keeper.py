"""The adaptive limits' controller, run by the sweeper's leader (docs/adaptive-limits.md).

Once a second, while its sweeper leads, the keeper takes the workers'
reports (:meth:`corral.stores.base.Store.take_limit_reports`), merges them
per adaptive limit into the fleet's report over the second
(:func:`corral.core.adaptive.fleet_report`), says whether the limit was the
bottleneck (work waited under it while the calls used its rate, or its places
were all in use: :meth:`corral.stores.base.Store.limits_waiting`), and runs
:func:`corral.core.adaptive.decide`. The decision's state and the new
effective values are written to the limit's row, fenced by the sweeper's
leadership, with an event saying why when a value changed
(:data:`corral.core.events.LIMIT_ADAPTED`). The state is the whole memory of
the controller, so a new leader continues from the row where the old one
stopped; its first second only takes the reports (their span is unknown).

A keyed adaptive limit (``per_key=True``) learns per key: the workers report
each key's calls under its gate name (``limit + KEY_SEP + key``, the busiest
keys only), and the keeper runs :func:`corral.core.adaptive.decide_keys` with
the keys' states read from their rows, writing each decided key's state and
effective values to its row in one upsert fenced the same way
(:meth:`corral.stores.base.Store.save_adaptive_keys`). A key the controller
forgot (idle, or no longer among the busiest) has its own values cleared and
runs under the limit's again. A key whose effective values changed gets an
event in the same write (:data:`corral.core.events.LIMIT_KEY_ADAPTED`), for
the busiest :data:`corral.core.adaptive.MAX_KEY_EVENTS` such keys a tick.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from typing import Any

from corral.core.adaptive import (
    MAX_KEY_EVENTS,
    RATE_BUSY_SHARE,
    AdaptiveRow,
    Decision,
    KeyState,
    LimitReport,
    decide,
    decide_keys,
    effective_concurrency,
    fleet_report,
    initial_state,
    key_state_json,
    key_state_of,
    rate_text,
)
from corral.core.gates import keyed_name, split_key
from corral.core.rates import parse_rate
from corral.maintenance.loop import Loop
from corral.stores.base import Store

log = logging.getLogger("corral.adaptive")

#: The keeper decides this far past each whole second of the wall clock (the
#: workers report just after it: engine/limit_reporter.py REPORT_AT).
DECIDE_AT = 0.25
#: An interval longer than this (a pause, a slow store) counts as this long.
MAX_INTERVAL = 5.0
ROLE = "sweeper"


class AdaptiveKeeper(Loop):
    """Run the controller of every adaptive limit once a second while ``sweeper`` leads."""

    thread_name = "corral-adaptive"
    what = "adapting the limits"
    log = log

    def __init__(self, store: Store, sweeper: Any, *, role: str = ROLE, aligned: bool = True):
        self.store = store
        self.sweeper = sweeper
        self.role = role
        self.aligned = aligned
        #: the store time of the last decision (None: not leading, or just took the lead)
        self.last: float | None = None
        #: decisions written, and those fenced out (another leader)
        self.decisions = 0
        self.fenced = 0
        #: keys' decisions written (a keyed adaptive limit's), their events written, and
        #: the changes beyond :data:`MAX_KEY_EVENTS` in a tick that wrote no event
        self.key_decisions = 0
        self.key_events = 0
        self.key_events_left = 0
        #: per limit, its rate before the last decision: in force for the first part of the next interval
        self._before: dict[str, float] = {}
        super().__init__()

    @property
    def interval(self) -> float:  # type: ignore[override]
        """Seconds to the next decision: just past the next whole second's reports."""
        if not self.aligned:
            return 1.0
        return (DECIDE_AT - time.time()) % 1.0 or 1.0

    def step(self) -> list[Decision]:
        return self.tick()

    def tick(self) -> list[Decision]:
        """One decision per adaptive limit, if the sweeper leads; the decisions written."""
        if not self.sweeper.is_leader:
            self.last = None
            self._before.clear()
            return []
        rows = self.store.adaptive_limits()
        taken = self.store.take_limit_reports()
        now = self.store.now()
        last, self.last = self.last, now
        if not rows or last is None:
            return []
        seconds = min(MAX_INTERVAL, max(1e-3, now - last))
        per: dict[str, list[tuple[str, LimitReport]]] = {name: [] for name in rows}
        keyed: dict[str, dict[str, list[tuple[str, LimitReport]]]] = {}
        for worker, text in taken:
            try:
                data = json.loads(text)
            except ValueError:
                continue
            for name, report in data.items():
                limit, key = split_key(name)
                if limit not in per:
                    continue
                try:
                    got = (worker, LimitReport.from_dict(report))
                except (TypeError, ValueError):
                    continue
                if key is None:
                    per[name].append(got)
                else:
                    keyed.setdefault(limit, {}).setdefault(key, []).append(got)
        waiting = self.store.limits_waiting(list(rows))
        made = []
        for name, row in rows.items():
            report = fleet_report(per[name], seconds)
            decision = self._decide(row, report, name in waiting, now)
            if decision is not None:
                made.append(decision)
            self._decide_keys(row, keyed.get(name, {}), seconds, now)
        return made

    def _decide_keys(
        self, row: AdaptiveRow, reports: dict[str, list[tuple[str, LimitReport]]], seconds: float, now: float
    ) -> int:
        """The keys of ``row`` (a keyed adaptive limit) decided and written; how many."""
        stored = self.store.adaptive_keys(row.name)
        if not reports and not stored:
            return 0  # a plain limit, or a keyed one with no key learning: no write
        spec = row.spec
        states: dict[str, KeyState] = {}
        for key, text in stored.items():
            got = key_state_of(text)
            if got is not None:
                states[key] = got
        fleet = {key: fleet_report(rs, seconds) for key, rs in reports.items()}
        rate0 = _per_second(row.rate) or spec.bounds.max_rate
        conc0 = float(row.concurrency or spec.bounds.max_concurrency)
        # was a key's own limit the bottleneck? it let through all it could, and work waits under it
        # (asked of the store only for the keys that let through all they could: few, however many report)
        full: dict[str, tuple[int, int]] = {}
        for key, report in fleet.items():
            state = states[key].state if key in states else initial_state(spec.bounds, now, rate0, conc0)
            held_rate = int(spec.rate and report.calls >= RATE_BUSY_SHARE * state.rate * report.seconds)
            places = effective_concurrency(state, spec.bounds)
            held_conc = int(spec.concurrency and report.peak_in_flight >= places)
            if held_rate or held_conc:
                full[key] = (held_rate, held_conc)
        waiting = self.store.limits_waiting([keyed_name(row.name, k) for k in full]) if full else set()
        for key, (held_rate, held_conc) in full.items():
            if keyed_name(row.name, key) in waiting:
                fleet[key] = replace(fleet[key], held_by_rate=held_rate, held_by_concurrency=held_conc)
        kept, decisions = decide_keys(states, fleet, spec.bounds, now, start=(conc0, rate0))
        writes: dict[str, tuple[str | None, int | None, str | None]] = {}
        changed: list[str] = []
        for key, decision in decisions.items():
            key_conc = decision.concurrency if spec.concurrency else None
            key_rate = rate_text(decision.rate) if spec.rate else None
            # the values the key ran under: its own, else the limit's (where its new state started)
            before = states[key].state if key in states else initial_state(spec.bounds, now, rate0, conc0)
            if (key_conc is not None and key_conc != effective_concurrency(before, spec.bounds)) or (
                key_rate is not None and key_rate != rate_text(before.rate)
            ):
                changed.append(key)
                kept[key] = replace(kept[key], changed=now)
            writes[key] = (key_state_json(kept[key]), key_conc, key_rate)
        for key in states.keys() - kept.keys():  # forgotten: the key runs under the limit's values again
            writes[key] = (None, None, None)
        if not writes:
            return 0
        # an event per changed key, the busiest first, at most MAX_KEY_EVENTS a tick
        changed.sort(key=lambda k: (-fleet[k].calls, -(fleet[k].throttles + fleet[k].errors), k))
        events = {key: _key_event(row.name, key, decisions[key]) for key in changed[:MAX_KEY_EVENTS]}
        if not self.store.save_adaptive_keys(row.name, self.sweeper.holder, self.role, writes, events):
            self.fenced += 1
            log.info("adaptive limit %s: keys not written, this process does not lead any more", row.name)
            return 0
        self.key_decisions += len(decisions)
        self.key_events += len(events)
        self.key_events_left += len(changed) - len(events)
        return len(writes)

    def _decide(self, row: AdaptiveRow, report: LimitReport, waiting: bool, now: float) -> Decision | None:
        spec = row.spec
        rate_now = _per_second(row.rate)
        state = row.state or initial_state(spec.bounds, now, rate=rate_now, concurrency=row.concurrency)
        # was the limit the bottleneck? work waited under it, and it let through all it could
        # (under the rate in force: a raise decided in the last interval held for only part of it)
        in_force = min(state.rate, self._before.get(row.name, state.rate))
        self._before[row.name] = state.rate
        held_rate = held_conc = 0
        if waiting and spec.rate and report.calls >= RATE_BUSY_SHARE * in_force * report.seconds:
            held_rate = 1
        if waiting and spec.concurrency and row.concurrency and report.peak_in_flight >= row.concurrency:
            held_conc = 1
        report = replace(report, held_by_rate=held_rate, held_by_concurrency=held_conc)
        decision = decide(state, report, spec.bounds, now)
        conc = decision.concurrency if spec.concurrency else None
        rate = rate_text(decision.rate) if spec.rate else None
        changed = (conc is not None and conc != row.concurrency) or (rate is not None and rate != row.rate)
        quiet = not (report.calls or report.throttles or report.errors or report.successes)
        if quiet and not changed and row.state is not None and decision.state == row.state:
            return None  # an idle limit costs no write
        event = json.dumps(decision.explanation, separators=(",", ":")) if changed else None
        state_json = json.dumps(decision.state.to_dict(), separators=(",", ":"))
        if not self.store.save_adaptive(row.name, self.sweeper.holder, self.role, state_json, conc, rate, event):
            self.fenced += 1
            log.info("adaptive limit %s: not written, this process does not lead any more", row.name)
            return None
        self.decisions += 1
        if changed:
            log.debug(
                "adaptive limit %s: concurrency %s, rate %s (%s; %s)",
                row.name,
                conc if conc is not None else row.concurrency,
                rate or row.rate,
                decision.rate_rule,
                decision.concurrency_rule,
            )
        return decision


def _key_event(limit: str, key: str, decision: Decision) -> str:
    """A key's ``limit_key_adapted`` event data: the limit's, with the limit and key named."""
    return json.dumps({"limit": limit, "key": key, **decision.explanation}, separators=(",", ":"))


def _per_second(rate: str | None) -> float | None:
    if not rate:
        return None
    try:
        return parse_rate(rate).per_second
    except ValueError:
        return None


__all__ = ["AdaptiveKeeper", "DECIDE_AT"]
