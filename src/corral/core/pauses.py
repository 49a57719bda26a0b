"""Pauses by hand: a queue, a group or a limit that no claim takes work of.

An operator pauses with ``app.pause(queue=...)`` (or ``group=``, ``limit=``),
``corral pause`` or the dashboard; the store keeps one row per pause, and
every claim reads them in its own transaction, so a pause holds across the
fleet from its commit on. Paused work simply waits: nothing is taken, no
attempt burned, a group's head holds its group's place. A pause by hand is
apart from the pause a 429's ``Retry-After`` puts on a limit
(``LimitSpec.paused_until``): neither ends the other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from corral.core import validation as check
from corral.core.events import PAUSE as PAUSE_EVENT
from corral.core.gates import KEY_SEP, split_key
from corral.errors import ConfigError

#: What may be paused, in the order they are shown.
KINDS = ("queue", "group", "limit")


def pause_order(p: Pause) -> tuple[int, str]:
    """The order pauses are listed in: by kind (:data:`KINDS`), then name."""
    return (KINDS.index(p.kind) if p.kind in KINDS else len(KINDS), p.name)


def event_of(kind: str, name: str, paused: bool, by: str) -> tuple[str, str, str]:
    """``(kind, subject, data)`` of the event a pause or a resume adds."""
    data = json.dumps({"kind": kind, "name": name, "paused": paused, "by": by})
    return PAUSE_EVENT, f"{kind}:{name}", data


@dataclass(frozen=True, slots=True)
class Pause:
    """One pause in force: what, since when (store time), by whom (free text)."""

    kind: str
    name: str
    paused_at: float
    by: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "paused_at": self.paused_at, "by": self.by}


def check_target(queue: str | None = None, group: str | None = None, limit: str | None = None) -> tuple[str, str]:
    """``(kind, name)`` of a pause or resume: exactly one of ``queue``,
    ``group`` and ``limit``, a name. Raises ConfigError otherwise."""
    given = [(k, v) for k, v in zip(KINDS, (queue, group, limit)) if v is not None]
    if len(given) != 1:
        raise ConfigError("name exactly one of a queue, a group or a limit to pause or resume")
    kind, name = given[0]
    name = check.text(name, f"the {kind} to pause or resume")
    if kind == "limit" and KEY_SEP in name:
        # a claim compares a pause with the limit's own name: one key's pause
        # would be stored and hold nothing
        raise ConfigError(f"one key of a limit cannot be paused apart: pause the limit {split_key(name)[0]!r}")
    return kind, name


def who(by: str | None = None) -> str:
    """Who pauses: ``by`` as given, else this process's user@host."""
    if by is not None:
        return check.text(by, "by") if by else ""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name is no reason to refuse a pause
        user = "?"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class Paused:
    """The pauses a claim obeys, as sets by kind. Empty: nothing paused
    (a claim then pays nothing more)."""

    queues: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    limits: frozenset[str] = frozenset()

    @classmethod
    def of(cls, rows: Iterable[tuple[str, str]]) -> Paused:
        """From ``(kind, name)`` rows; kinds not known are ignored."""
        by: dict[str, set[str]] = {k: set() for k in KINDS}
        for kind, name in rows:
            if kind in by:
                by[kind].add(name)
        return cls(frozenset(by["queue"]), frozenset(by["group"]), frozenset(by["limit"]))

    def __bool__(self) -> bool:
        return bool(self.queues or self.groups or self.limits)

    def holds(self, queue: str, group: str | None, limits: Iterable[str]) -> bool:
        """Is a task of ``queue``, ``group``, naming ``limits`` (a keyed
        limit's key budgets included: pausing the limit pauses every key)
        held back by a pause?"""
        if queue in self.queues or (group is not None and group in self.groups):
            return True
        if self.limits:
            return any(split_key(n)[0] in self.limits for n in limits)
        return False
