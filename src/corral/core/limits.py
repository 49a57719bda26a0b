"""Changing a limit while it runs: an operator's change over the app's declaration.

``app.limit(name, ...)`` *declares* a limit: its settings are the defaults,
written by every process that declares it (each worker at its start). An
operator's change (``corral limit set``, the dashboard's form,
``app.set_limit``) changes some of the settings in force and *stays* in
force over those defaults: a worker that restarts and declares the limit
again does not undo it, nor does a deploy that declares other values (the
new declaration is kept aside and shown beside the settings in force). The
change is handed back by ``corral limit reset NAME`` (``app.reset_limit``):
the declared settings are in force again. This is Oban Pro's DynamicQueues'
rule (runtime changes persist across restarts), with the declaration always
visible, so a forgotten override is seen, not silently obeyed.

Every store applies these rules in one transaction over the limit's row
(:func:`declare` and :func:`change`), records an event of kind
:data:`corral.core.events.LIMIT` for each change, and wakes the workers.
The settings are read by each claim from the store, so every worker obeys
a change at its next claim.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from corral.core import validation as check
from corral.core.model import LimitSettings, LimitSpec
from corral.core.rates import parse_rate
from corral.errors import ConfigError

#: The settings a change may name.
FIELDS = ("concurrency", "rate", "burst")
#: Who may change a limit while it runs (the events say which).
CHANGERS = ("cli", "dashboard", "app")
#: A setting ``app.set_limit`` leaves as it is (None clears it).
UNCHANGED: Any = object()
#: What a command line or a form writes to clear a setting.
CLEAR_WORDS = ("none", "off", "-")


def check_settings(name: str, concurrency: Any, rate: Any, burst: Any) -> LimitSettings:
    """Settings a limit may have (``app.limit``'s rules); one-line ConfigError otherwise."""
    if concurrency is not None:
        check.integer(concurrency, f"limit {name!r}: concurrency", check.LIMIT_CONCURRENCY_RANGE)
    if rate is not None:
        check.text(rate, f"limit {name!r}: rate")
    if burst is not None and rate is None:
        raise ConfigError(f"limit {name!r}: a burst needs a rate (e.g. rate='100/s', burst=20)")
    if rate is not None:
        try:
            parse_rate(rate, burst)
        except ValueError as exc:
            raise ConfigError(f"limit {name!r}: {exc}") from None
    return LimitSettings(concurrency, rate, burst)


def parse_changes(concurrency: str | None, rate: str | None, burst: str | None) -> dict[str, Any]:
    """A change as a command line or a form gives it (text; None or "" = not
    named; "none" clears) as :func:`change` takes it."""
    out: dict[str, Any] = {}
    for field, text in (("concurrency", concurrency), ("rate", rate), ("burst", burst)):
        if text is None or not text.strip():
            continue
        text = text.strip()
        if text.lower() in CLEAR_WORDS:
            out[field] = None
        elif field == "rate":
            out[field] = text
        else:
            try:
                out[field] = int(text)
            except ValueError:
                raise ConfigError(f"{field} must be a whole number or 'none', not {check.shown(text)}") from None
    return out


def unknown(name: str, known: Iterable[str]) -> ConfigError:
    """The error for a change naming no limit, with the names there are."""
    names = sorted(known)
    shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return ConfigError(f"no limit named {name!r}; known: {shown or 'none (app.limit declares one)'}")


def declare(old: LimitSpec | None, new: LimitSpec) -> LimitSpec:
    """The row after ``app.limit`` declared ``new`` over ``old`` (None: no
    row yet): the new settings, unless an operator's change is in force,
    which stays; the declaration is then kept aside in ``declared``."""
    if old is None or old.set_by is None:
        return replace(new, paused_until=None if old is None else old.paused_until, set_by=None, declared=None)
    return replace(old, per_key=new.per_key, declared=new.settings())


def change(old: LimitSpec, changes: Mapping[str, Any], by: str, *, reset: bool = False) -> LimitSpec:
    """The row after an operator's change: ``changes`` maps some of
    :data:`FIELDS` to a new value (None clears it; fields not named are
    kept; clearing the rate clears its burst). ``reset``: the declared
    settings in force again. Refused (ConfigError, one line) when the
    result is not a limit ``app.limit`` would accept."""
    if by not in CHANGERS:
        raise ConfigError(f"a limit is changed by one of {', '.join(CHANGERS)}, not {check.shown(by)}")
    bad = sorted(set(changes) - set(FIELDS))
    if bad:
        raise ConfigError(f"a limit's change names {', '.join(FIELDS)}, not {', '.join(map(repr, bad))}")
    if reset:
        if changes:
            raise ConfigError("a reset hands the declared settings back; it changes nothing else")
        back = old.declared if old.declared is not None else old.settings()
        return replace(old, concurrency=back.concurrency, rate=back.rate, burst=back.burst, set_by=None, declared=None)
    if not changes:
        raise ConfigError(f"limit {old.name!r}: nothing to change (name a concurrency, a rate or a burst)")
    now = {**{f: getattr(old, f) for f in FIELDS}, **changes}
    if "rate" in changes and changes["rate"] is None and "burst" not in changes:
        now["burst"] = None
    s = check_settings(old.name, now["concurrency"], now["rate"], now["burst"])
    declared = old.declared if old.set_by is not None else old.settings()
    return replace(old, concurrency=s.concurrency, rate=s.rate, burst=s.burst, set_by=by, declared=declared)


def describe_settings(s: LimitSettings) -> str:
    """Settings in a line: ``concurrency 3, rate 8/s (burst 20)``."""
    parts = []
    parts.append(f"concurrency {s.concurrency}" if s.concurrency is not None else "no concurrency cap")
    rate = f"rate {s.rate}" if s.rate else "no rate"
    parts.append(rate + (f" (burst {s.burst})" if s.burst is not None else ""))
    return ", ".join(parts)


def settings_json(s: LimitSettings | None) -> str | None:
    """``declared`` as a row keeps it."""
    if s is None:
        return None
    return json.dumps({"concurrency": s.concurrency, "rate": s.rate, "burst": s.burst})


def settings_from_json(text: str | None) -> LimitSettings | None:
    if not text:
        return None
    try:
        d = json.loads(text)
        return LimitSettings(d.get("concurrency"), d.get("rate"), d.get("burst"))
    except (ValueError, AttributeError):  # written by another program: read as none kept
        return None


def _settings_dict(s: LimitSpec | LimitSettings | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {"concurrency": s.concurrency, "rate": s.rate, "burst": s.burst}


def event_data(action: str, by: str, before: LimitSpec | None, after: LimitSpec) -> str | None:
    """The event a change records (JSON), or None when nothing a worker obeys
    or an operator reads changed (a worker's start declaring the same again)."""
    if (
        before is not None
        and before.settings() == after.settings()
        and before.declared == after.declared
        and before.set_by == after.set_by
        and before.per_key == after.per_key
    ):
        return None
    return json.dumps(
        {
            "limit": after.name,
            "action": action,
            "by": by,
            "before": _settings_dict(before),
            "after": _settings_dict(after),
            "set_by": after.set_by,
            "declared": _settings_dict(after.declared),
        }
    )


def subject(name: str) -> str:
    """The event stream's subject of a limit's changes."""
    return f"limit:{name}"


__all__ = [
    "CHANGERS",
    "CLEAR_WORDS",
    "FIELDS",
    "change",
    "UNCHANGED",
    "check_settings",
    "describe_settings",
    "declare",
    "event_data",
    "parse_changes",
    "settings_from_json",
    "settings_json",
    "subject",
    "unknown",
]
