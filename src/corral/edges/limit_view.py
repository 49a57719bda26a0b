"""What ``corral limit show`` and the dashboard's Limits page say of each limit.

One reading of the store, the same in both: a limit's settings in force and
who set them (with the declared ones kept aside), the places held now, the
starts its rate allows now, whether it is paused, and for a keyed limit the
number of keys holding places and its busiest keys. Read-only."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from corral.stores.base import Store

#: Busiest keys shown per keyed limit.
TOP_KEYS = 5


def limits_report(store: Store, top: int = TOP_KEYS) -> list[dict[str, Any]]:
    """Each limit, by name, as a dict (the JSON of ``corral limit show --json``)."""
    now = store.now()
    specs = store.limits()
    usage = store.limit_usage()
    tokens = store.limit_tokens()
    keys = store.busiest_keys(top=2**31) if any(s.per_key for s in specs.values()) else {}
    out = []
    for name, s in sorted(specs.items()):
        held = keys.get(name, [])
        paused = s.paused_until is not None and s.paused_until > now
        row: dict[str, Any] = {
            "name": name,
            "concurrency": s.concurrency,
            "rate": s.rate,
            "burst": s.burst,
            "in_use": usage.get(name, 0),
            "tokens": None if name not in tokens else round(tokens[name], 3),
            "paused": paused,
            "paused_until": s.paused_until if paused else None,
            "per_key": s.per_key,
            "set_by": s.set_by,
            "declared": None if s.declared is None else asdict(s.declared),
            "changed_at": s.changed_at,
        }
        if s.per_key:
            row["active_keys"] = len(held)
            row["busiest_keys"] = [{"key": k, "in_use": n} for k, n in held[:top]]
        out.append(row)
    return out


__all__ = ["TOP_KEYS", "limits_report"]
