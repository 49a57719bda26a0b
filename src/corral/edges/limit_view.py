"""What ``corral limit show`` and the dashboard's Limits page say of each limit.

One reading of the store, the same in both: a limit's settings in force and
who set them (with the declared ones kept aside), the places held now, the
starts its rate allows now, whether it is paused, and for a keyed limit the
number of keys holding places and its busiest keys (for a keyed adaptive
limit, also the busiest keys' learned values). Read-only."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from corral.core.adaptive import AdaptiveRow, effective_concurrency, key_state_of, rate_text
from corral.core.events import LIMIT_ADAPTED
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
    adaptive = store.adaptive_limits()
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
            "adaptive": None,
        }
        if name in adaptive:
            row["adaptive"] = adaptive_dict(adaptive[name])
        if s.per_key:
            row["active_keys"] = len(held)
            row["busiest_keys"] = [{"key": k, "in_use": n} for k, n in held[:top]]
            if name in adaptive:  # each key learns its own values: the busiest keys' beside their places
                learned = learned_keys(store, adaptive[name])
                row["learning_keys"] = len(learned)
                places = dict(held)
                for k in row["busiest_keys"]:
                    got = learned.get(k["key"])
                    k["learned"] = None if got is None else {"concurrency": got["concurrency"], "rate": got["rate"]}
                row["learned_keys"] = [
                    {"key": key, **got, "in_use": places.get(key, 0)}
                    for key, got in sorted(learned.items(), key=lambda kv: _busiest(kv, now))[:top]
                ]
        out.append(row)
    return out


#: A learning key with a call in the last this many seconds counts as busy now.
KEY_FRESH_SECONDS = 5.0


def _busiest(item: tuple[str, dict[str, Any]], now: float) -> tuple[bool, int, float, str]:
    """The order of the learning keys: those busy now first, by their last
    second's calls, then the most recently seen."""
    key, got = item
    return (now - got["seen"] > KEY_FRESH_SECONDS, -got["calls"], -got["seen"], key)


def learned_keys(store: Store, row: AdaptiveRow) -> dict[str, dict[str, Any]]:
    """The keys of a keyed adaptive limit that learned their own values: key to
    the effective concurrency and rate their controller set (None: the knob
    is not adaptive, the limit's value holds), the calls of its last busy
    interval, when it last had one (``seen``) and when the controller last
    changed its values (``changed_at``; None: never)."""
    spec, out = row.spec, dict[str, dict[str, Any]]()
    for key, text in store.adaptive_keys(row.name).items():
        got = key_state_of(text)
        if got is not None:
            out[key] = {
                "concurrency": effective_concurrency(got.state, spec.bounds) if spec.concurrency else None,
                "rate": rate_text(got.state.rate) if spec.rate else None,
                "calls": got.calls,
                "seen": got.seen,
                "changed_at": got.changed,
            }
    return out


def adaptive_dict(row: AdaptiveRow) -> dict[str, Any]:
    """An adaptive limit (:class:`corral.core.adaptive.AdaptiveRow`) for ``--json``:
    the effective values the claims obey beside the user's bounds, and what
    the controller remembers."""
    spec, b, st = row.spec, row.spec.bounds, row.state
    out: dict[str, Any] = {"name": row.name, "concurrency": row.concurrency, "rate": row.rate}
    if spec.concurrency:
        out["concurrency_bounds"] = [b.min_concurrency, b.max_concurrency]
    if spec.rate:
        out["rate_bounds"] = [rate_text(b.min_rate), rate_text(b.max_rate)]
    if st is not None:
        out["baseline_ms"] = None if st.baseline_ms is None else round(st.baseline_ms, 2)
        out["last_cut_rate"] = None if st.w_max is None else round(st.w_max, 3)
    return out


#: The adaptive chart's window, seconds, and the newest events read for it.
HISTORY_SECONDS = 300.0
HISTORY_EVENTS = 5_000


def adaptive_history(
    store: Store, names: list[str], seconds: float = HISTORY_SECONDS
) -> dict[str, list[dict[str, Any]]]:
    """Each adaptive limit's decisions over the last ``seconds``, oldest first,
    from its ``limit_adapted`` events: when, the effective rate (per second)
    and concurrency it set, and what the fleet reported in the interval before
    (calls, successes, throttles). The dashboard draws these."""
    since = store.now() - seconds
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for e in store.events(LIMIT_ADAPTED, limit=HISTORY_EVENTS):
        if e.at < since:
            break  # newest first
        name = e.subject.removeprefix("limit:")
        if name not in out:
            continue
        d = e.details
        i = d.get("inputs") or {}
        out[name].append(
            {
                "at": e.at,
                "rate": d.get("rate"),
                "concurrency": d.get("concurrency"),
                "rate_rule": d.get("rate_rule"),
                "concurrency_rule": d.get("concurrency_rule"),
                "calls": i.get("calls", 0),
                "successes": i.get("successes", 0),
                "throttles": i.get("throttles", 0),
                "seconds": i.get("seconds") or 1.0,
            }
        )
    for points in out.values():
        points.reverse()
    return out


__all__ = ["HISTORY_SECONDS", "TOP_KEYS", "adaptive_dict", "adaptive_history", "learned_keys", "limits_report"]
