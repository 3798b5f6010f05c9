"""Appends whose transaction the test holds open: the write path's statement on the test's own connection."""

from __future__ import annotations

import psycopg

from pgjournal import slice_for_persistence_id
from pgjournal.store.events import insert_sql


def insert_in(conn: psycopg.Connection, pid: str, after: int, count: int = 1) -> None:
    """The write path's statement on the caller's (non-autocommit) connection; the entity type is ``pid``'s
    prefix (``Busy|held`` is of ``Busy``)."""
    conn.execute(insert_sql("event_journal", after_latest=False, single=False), {
        "slice": slice_for_persistence_id(pid), "entity_type": pid.partition("|")[0], "pid": pid, "writer": "held",
        "tags": None,
        "expected": after, "meta_ser_id": None, "meta_manifest": None, "meta_payload": None,
        "ser_ids": [4] * count, "manifests": [""] * count, "payloads": [b'{"held":true}'] * count})
