"""Both SQL dialects name their queries alike, so the two stores read alike.

A name found in one ``.sql`` file only must be listed here with the reason.
"""

from __future__ import annotations

from corral.stores.sql import load

#: SQLite only: one statement per step where PostgreSQL does it in one, or
#: bookkeeping that PostgreSQL's triggers keep.
SQLITE_ONLY = {
    "save_adaptive_key": "a key's decision upserted per key (PostgreSQL: `save_adaptive_keys`, one JSON array)",
    "held_places": "the table of places held and its triggers (PostgreSQL: `migration_0044`)",
    "queued_count": "a bounded submit counts from the partial indexes alone (PostgreSQL: `active_counts`)",
    "limit_held": "one limit's places, as the Python pick asks (PostgreSQL: the `places_held` fragment)",
    "relay_fits": "which limits may pass a place to a relay (PostgreSQL: inside `handoff_allowed`)",
    "limits_tight": "which limits a hand-over could keep from another worker (PostgreSQL: inside `handoff_allowed`)",
    "first_waiter": "whose work waits first under a limit (PostgreSQL: inside `handoff_allowed`)",
    "gated_signature": "a claim behind a full limit skips a look when nothing changed (PostgreSQL: no Python pick)",
    "claim_candidates": "the claim is picked in Python from ordered candidates (PostgreSQL: one `claim`)",
    "claim_retry_candidates": "the retry path's candidates for the Python claim (PostgreSQL: inside `claim`)",
    "claim_candidates_past": "the Python claim reads on without the keys it passes over (PostgreSQL: `key_probe`)",
    "keys_held": "the places of the keys a claim is about to consider, in one go (PostgreSQL: `key_usage`)",
    "claim_keyed": "ungrouped work under concurrency limits in one read (PostgreSQL: one `claim`)",
    "claim_units": "claim_keyed's answer written, a token each (PostgreSQL: one `claim`)",
    "heads_ready": "whether claim_keyed may be used: no group's head queued (PostgreSQL: one `claim`)",
    "claim_heads": "units of one task each in one statement (PostgreSQL: one `claim`)",
    "claim_plain_shared": "the plain claim with a retry share (PostgreSQL: `claim_plain` takes the share)",
    "claim_head": "the claim writes its head, then its members",
    "claim_members": "the claim writes its head, then its members",
    "group_followers": "chunk members read by the Python claim",
    "due_probe": "an idle worker hears of every commit and looks whether work is due (PostgreSQL: notifications)",
    "group_last_claimed": "round-robin order computed by the Python claim",
    "group_running": "head rule checked by the Python claim",
    "touch_group": "the claim records a group's last claim (PostgreSQL: inside `claim`)",
    "head_clear": "group heads refreshed by the store (PostgreSQL: statement triggers)",
    "head_set": "group heads refreshed by the store (PostgreSQL: statement triggers)",
    "heads_of_no_state": "a head flag on a row of no known state moves on (PostgreSQL: statement triggers skip it)",
    "groups_with_head": "a submit refreshes the heads of groups without one (PostgreSQL: statement triggers)",
    "complete_final": "a final outcome (PostgreSQL: every outcome in one `complete`)",
    "complete_final_many": "a batch of final outcomes (PostgreSQL: one `complete`)",
    "complete_requeue": "an outcome that queues again (PostgreSQL: one `complete`)",
    "has_dependents": "dependents settled step by step (PostgreSQL: `settle_dependents`)",
    "promote_dependents": "dependents settled step by step (PostgreSQL: `settle_dependents`)",
    "cancel_dependents": "dependents settled step by step (PostgreSQL: `settle_dependents`)",
    "deps_of": "depends_on read from its table (PostgreSQL: an array column)",
    "insert_task": "submit inserts with executemany (PostgreSQL: one `submit`)",
    "insert_dep": "submit inserts with executemany (PostgreSQL: one `submit`)",
    "next_id_base": "submit assigns ids itself to insert dependencies in the same batch",
    "find_key": "submit looks an idempotency key up one at a time (PostgreSQL: `ids_by_key`)",
    "heartbeat_extend": "the heartbeat extends, then reads what is held (PostgreSQL: one `heartbeat`)",
    "heartbeat_held": "the heartbeat extends, then reads what is held (PostgreSQL: one `heartbeat`)",
    "select_tasks": "the column list of every task read (PostgreSQL reads by name: SELECT *)",
    "status_of": "cancel reads the state first (PostgreSQL: guarded updates in one transaction)",
    "schema": "the schema as one idempotent script (PostgreSQL: numbered migrations)",
    "columns_v4": "columns added to an older file where missing (PostgreSQL: `migration_0005`)",
    "limit_pause": "a 429's pause of its limits (PostgreSQL: inside `complete`)",
    "claim_head_candidates": "ready group heads in round-robin order (PostgreSQL: inside `claim`)",
    "schema_v17": "the ready heads' index after the columns it needs (PostgreSQL: `migration_0002`)",
    "last_event_id": "the stream's newest id, ids in commit order (PostgreSQL: `stream_now` with missing ids)",
    "event_stream": "the event triggers after the columns they need (PostgreSQL: `migration_0023`)",
    "set_clock": "a fake clock's time for the event triggers (PostgreSQL stamps with now())",
    "clear_clock": "the event triggers back on SQLite's own clock (PostgreSQL stamps with now())",
    "schedule_last_run": "a schedule's last run, read under the write lock (PostgreSQL: `schedule_lock`)",
    "tick_skipped": "a tick's row marked skipped after the overlap check (PostgreSQL: written so at once)",
    "prune_deps": "the dependency rows of pruned tasks (PostgreSQL: inside `prune`)",
    "paused_queues": "the paused queues, read by a wait (PostgreSQL: the claim reads them in its statement)",
    "limits_changed": "the last change of a limit, read by a claim behind a full limit (PostgreSQL: notified)",
    "key_rows_after": "the next keys' rows to forget, read whole (PostgreSQL: `key_names_after`, then their locks)",
    "expire_queued": "a claim ends the expired tasks its Python pick met (PostgreSQL: `claim` passes them over)",
    "put_limit_report": "a worker's limit report, after `trim_limit_reports` (PostgreSQL: one `report_limits`)",
    "trim_limit_reports": "a worker's old limit reports go first (PostgreSQL: inside `report_limits`)",
}

#: PostgreSQL only: what SQLite does not need or does in Python.
POSTGRES_ONLY = {
    "set_limit_keys": "a keyed limit's changed rate fills its keys' buckets (SQLite: the keys' rows are kept)",
    "key_probe": "the keys of the first candidates, locked before the claim (SQLite: the Python claim reads each)",
    "claim_simple": "ungrouped work under caps alone, locked, judged and taken in one statement (SQLite: claim_keyed)",
    "key_usage": "a claim's keys' places held and their rows (SQLite: `limit_usage`, `limit_key_rows`)",
    "key_charges": "the keys' rows in their own table, made on first charge (SQLite: `limit_charge` makes each)",
    "key_names_after": "the next keys to forget, to lock before reading them (SQLite: `key_rows_after`)",
    "report_limits": "a worker's limit report and its old ones trimmed in one statement (SQLite: two)",
    "adaptive_limit_lock": "an adaptive limit's row locked while declared again (SQLite: one writer at a time)",
    "lock_queue_bound": "bounded submits near the bound take one advisory lock (SQLite: one writer at a time)",
    "mark_bounded_submit": "a bounded submit marks itself in flight (SQLite: one writer at a time)",
    "bounded_in_flight": "the tasks other bounded submits are adding (SQLite: one writer at a time)",
    "queued_upto": "the queue counted up to a bound from its partial indexes (SQLite: `queued_count`)",
    "claim": "one statement claims (SQLite: `claim_candidates` + `claim_head`/`claim_members`)",
    "claim_probe": "capped limits with ready work (SQLite: checked by the Python claim)",
    "limit_lock": "advisory locks serialise capped limits (SQLite: one writer at a time)",
    "limit_free": "free slots read under the limit locks",
    "handoff_allowed": "limits whose place passes to a successor without their lock (SQLite: one writer at a time)",
    "unlimited_ready": "whether unlimited work waits while every limit is full",
    "lock_group_of": "group row lock against concurrent writers (SQLite: one writer at a time)",
    "complete": "every outcome in one statement (SQLite: `complete_final*`, `complete_requeue`)",
    "heartbeat": "one UPDATE ... RETURNING (SQLite: `heartbeat_extend` + `heartbeat_held`)",
    "submit": "one statement inserts a submit (SQLite: `insert_task` + `insert_dep`)",
    "submit_one": "one plain task, lighter; it may hand the task to a waiting worker (SQLite: `insert_task`)",
    "ids_by_key": "ids of several idempotency keys at once (SQLite: `find_key`)",
    "settle_dependents": "dependents settled in one recursive statement",
    "unsettled": "dependents a crashed completion left WAITING (SQLite settles in the same transaction)",
    "notify": "LISTEN/NOTIFY wake-ups (SQLite polls data_version)",
    "now": "the database clock (SQLite uses the store's Clock)",
    "has_schema": "whether a database holds corral's tables (SQLite: a file check before it is opened)",
    "stream_now": "a follower's start: the newest id and ids not committed yet (SQLite: `last_event_id`)",
    "tx_now": "the transaction's clock, which tokens are charged at (SQLite uses the store's Clock)",
    "migration_0001": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0002": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0003": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0004": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0005": "numbered migrations (SQLite: `schema` and `columns_v4`)",
    "migration_0006": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0007": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0019": "numbered migrations (SQLite: `columns_v4`)",
    "migration_0020": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0021": "PostgreSQL autovacuum settings for the task table (SQLite has no autovacuum of dead rows)",
    "migration_0022": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0023": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0024": "offers of waiting workers, which submits hand plain tasks to (SQLite workers see each commit)",
    "migration_0025": "no planner statistics on status (SQLite's claims name their index)",
    "migration_0027": "numbered migrations (SQLite: `columns_v4`)",
    "migration_0028": "numbered migrations (SQLite: `columns_v4`)",
    "status_statistics": "old planner statistics on status that a store warns of (SQLite's claims name their index)",
    "offer": "a waiting worker opens its offer (on its listening connection)",
    "offer_withdraw": "a waiting worker withdraws its offer and reads the tasks given under it",
    "offer_given": "tasks given under an offer whose submit committed after the withdrawal's snapshot",
    "migration_0013": "numbered migrations (SQLite: one idempotent `schema`)",
    "batch_lock_unsettled": "a batch's settle row locked (SQLite: one writer at a time)",
    "whereami": "which database a caller's connection is on (SQLite compares the file)",
    "migration_0008": "numbered migrations (SQLite: one idempotent `schema`)",
    "schedule_lock": "a schedule's row locked so its ticks are decided one at a time (SQLite: one writer)",
    "migration_0014": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0018": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0033": "numbered migrations (SQLite: `columns_v4`)",
    "migration_0034": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0035": "numbered migrations (SQLite: one idempotent `schema`)",
    "migration_0036": "numbered migrations (SQLite: one idempotent `schema`)",
    "lock_groups": "group row locks of a bulk re-queue, in one order (SQLite: one writer at a time)",
    "retry_many": "dead letters re-queued in one statement (SQLite: `retry` per id in one transaction)",
    "migration_0037": "numbered migrations (SQLite: `columns_v4` and `schema_v17`)",
    "migration_0040": "numbered migrations (SQLite: `schema`)",
    "migration_0039": "numbered migrations (SQLite: `schema`)",
    "migration_0041": "numbered migrations (SQLite: `columns_v4`)",
    "migration_0038": "numbered migrations (SQLite: `columns_v4` and `schema`)",
    "migration_0043": "numbered migrations (SQLite: `schema` and `columns_v4`)",
    "migration_0045": "numbered migrations (SQLite: `schema` and `columns_v4`)",
    "migration_0046": "numbered migrations (SQLite: `held_places`)",
    "migration_0047": "numbered migrations (SQLite: the key rows of `named_limits` had these columns already)",
    "migration_0048": "numbered migrations (SQLite: offers are PostgreSQL-only)",
    "migration_0049": "numbered migrations (SQLite: no dead rows to avoid, one writer, no MVCC horizon)",
    "events_trim_lock": "one trimmer moves the event floor at a time (SQLite: one writer at a time)",
    "events_spent": "event partitions wholly below the floor (SQLite: trims by DELETE)",
    "events_truncate": "a spent event partition emptied (SQLite: trims by DELETE)",
    "migration_0050": "the gates' places read after their locks in a fresh snapshot (SQLite: one writer at a time)",
    "save_adaptive_keys": "keys' decisions in one JSON-array upsert (SQLite: `save_adaptive_key` per key)",
    "debounce_lock": "submits of one debounce key one at a time, advisory lock (SQLite: one writer at a time)",
    "set_keys": "a new task's keys after the bulk insert (SQLite: in `insert_task`)",
    "supersede_lock_groups": "group row locks before a supersede cancels (SQLite: one writer at a time)",
}


def test_both_dialects_use_the_same_query_names():
    sqlite, postgres = set(load("sqlite")), set(load("postgres"))
    assert sqlite - postgres == set(SQLITE_ONLY), "name the query alike in both files, or list it with its reason"
    assert postgres - sqlite == set(POSTGRES_ONLY), "name the query alike in both files, or list it with its reason"
    assert all(SQLITE_ONLY.values()) and all(POSTGRES_ONLY.values())


def test_fragments_are_put_into_the_queries_that_use_them():
    for dialect in ("sqlite", "postgres"):
        assert not any("{{" in sql for sql in load(dialect).values()), dialect
    q = load("postgres")
    # one gate check: the claim, its probe and the hand-over read the same gates
    gates = "SELECT b.name, true, false FROM corral_breakers b WHERE b.state_name <> 'CLOSED'"
    assert all(gates in q[name] for name in ("claim", "claim_probe", "handoff_allowed"))
    held = "SELECT count(DISTINCT h.lease_token) FROM corral_held_places h"
    assert all(held in q[name] for name in ("limit_free", "handoff_allowed"))
    assert "fragment" not in " ".join(q)  # a fragment is no query of its own


def test_a_fragment_used_but_not_defined_is_refused(tmp_path, monkeypatch):
    import pytest

    from corral.stores import sql

    monkeypatch.setattr(
        sql.resources, "files", lambda _pkg: tmp_path
    )  # the loader reads <dialect>.sql beside it: here, a file of the test's
    (tmp_path / "bad.sql").write_text("-- name: q\nSELECT {{missing}}\n")
    (tmp_path / "good.sql").write_text("-- fragment: one\n-- the number one\nSELECT 1;\n-- name: q\nSELECT ({{one}})\n")
    with pytest.raises(ValueError, match="missing"):
        sql.load("bad")
    assert sql.load("good") == {"q": "SELECT (SELECT 1)"}
