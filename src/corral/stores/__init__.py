"""Stores: where tasks live. ``open_store(url)`` picks one by URL scheme."""

from __future__ import annotations

import os

from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.errors import ConfigError, StoreUnavailable
from corral.stores.base import Store

DEFAULT_URL = "sqlite:///corral.db"


def default_url() -> str:
    return os.environ.get("CORRAL_STORE") or DEFAULT_URL


def open_store(url: str | None = None, *, clock: Clock = SYSTEM_CLOCK, create: bool = True) -> Store:
    """Open the store named by ``url`` (default: $CORRAL_STORE, else sqlite:///corral.db).

    ``clock`` is the time of the memory and SQLite stores (tests pass a
    :class:`~corral.core.clock.FakeClock`); PostgreSQL keeps the database's.
    With ``create=False`` (what commands that only read ask) a store that
    does not exist yet is not made: a missing SQLite file, or a PostgreSQL
    database without corral's tables, raises
    :class:`~corral.errors.StoreUnavailable` and nothing is written."""
    url = url or default_url()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "memory":
        from corral.stores.memory import MemoryStore

        return MemoryStore(url, clock=clock)
    if scheme == "sqlite":
        from corral.stores.sqlite import SQLiteStore

        return SQLiteStore(url, clock=clock, create=create)
    if scheme in ("postgresql", "postgres"):
        from corral.stores.postgres import PostgresStore

        store = PostgresStore(url)
        if not create and not store.has_schema():
            store.close()
            raise StoreUnavailable(
                f"no corral store in {store._shown}: the database has no corral tables "
                "(a command that only reads never creates them)"
            )
        return store
    raise ConfigError(f"cannot parse store URL {url!r}: expected memory://, sqlite:///path or postgresql://...")


__all__ = ["Store", "open_store", "default_url", "DEFAULT_URL"]
