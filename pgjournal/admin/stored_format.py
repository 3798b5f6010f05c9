"""How this database's payloads must be read: facts that migrations record in ``pgjournal_format``.

The one fact so far: **legacy JSON under id 33**. Before revision 0005 pgjournal wrote JSON with
``ser_id`` 33, which is Akka's id for Jackson CBOR (Akka's JSON is 31). From 0005 on pgjournal writes 31 and
reads 33 as CBOR, as Akka does. A database that already holds rows with id 33 when it is migrated to 0005
gets the marker ``legacy_json_ser_id = 33``; a journal opened on it reads a 33 payload as JSON where it is
JSON and as CBOR otherwise (see ``serialization._legacy_33`` for why that cannot mistake Akka's CBOR).

Why a marker and not a data migration (``UPDATE ... SET event_ser_id = 31 WHERE event_ser_id = 33``):

* the least-privileged writer role may not update ``event_ser_id`` (history is append-only, see
  :mod:`pgjournal.admin.roles`), and the owner running the migration would rewrite every row of a table that may
  hold billions: hours of I/O, WAL and a bloated heap, with writers blocked on the row locks;
* the rows stay as they were written, so an older pgjournal, a backup, a replica or an Akka reader sees the
  same bytes as before; nothing is lost if the migration is interrupted;
* the cost is one ``EXISTS`` probe per table at migration time (a sequential scan only where no row has id
  33, once) and one row read when a journal opens.

The marker is per database and never removed: rows written with 33 after the migration (by Akka's CBOR
serializer, or by an older pgjournal still running) read correctly under the same rule. Without the marker
(the database had no row with 33 when it was migrated) an older pgjournal still writing JSON-33 rows after
the migration would leave rows that read as broken CBOR: stop older writers before migrating, or record the
marker by hand as the owner: ``INSERT INTO pgjournal_format VALUES ('legacy_json_ser_id', '33')``.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from pgjournal.runtime.steps import Step, first_of, rows_of, run
from pgjournal.store import format as sql
from pgjournal.store.format import FORMAT_TABLE as FORMAT_TABLE  # re-exported: the markers' table

LEGACY_JSON_SER_ID = "legacy_json_ser_id"
#: ``akka``: the journal tables are Akka R2DBC's, adopted as they are (see :mod:`pgjournal.admin.adopt`).
EVENT_LAYOUT = "event_layout"
AKKA_LAYOUT = "akka"
#: With the Akka layout: Akka's ``data-partition.number-of-partitions`` (tables ``event_journal_<n>``).
DATA_PARTITIONS = "akka_data_partitions"


@dataclass(frozen=True, slots=True)
class StoredFormat:
    #: Rows with ``ser_id`` 33 may be pgjournal's old JSON (read JSON where it is JSON, else CBOR).
    legacy_json_33: bool = False
    #: The journal is Akka's adopted layout: ``event_journal`` is an ordinary table (not partitioned by
    #: pgjournal), or Akka's data partitions ``event_journal_0..n-1`` behind a read-only view.
    akka_layout: bool = False
    #: Akka's data partitions (1: one ``event_journal`` table).
    data_partitions: int = 1
    #: ``table.column`` of the payload columns that are JSONB (Akka's ``payload-column-type = JSONB``),
    #: detected from the catalog when a journal opens: ``event_journal.event_payload``, ``snapshot.snapshot``...
    jsonb_columns: frozenset[str] = frozenset()

    def jsonb(self, column: str, table: str = "event_journal") -> bool:
        """Whether ``table.column`` holds JSONB (for event tables: in any data partition)."""
        return f"{table}.{column}" in self.jsonb_columns or any(
            name.startswith(f"{table}_") and name.endswith(f".{column}") for name in self.jsonb_columns)


def read_stored_format(conn: psycopg.Connection) -> StoredFormat:
    """The markers of the database on ``conn``; none (Akka's meaning of every id) when the table is absent,
    as in a journal that Akka created."""
    return run(read_stored_format_step(), conn)


def read_stored_format_step() -> Step[StoredFormat]:
    """:func:`read_stored_format` as a step (:mod:`pgjournal.runtime.steps`), for a blocking or an asyncio
    connection."""
    jsonb = frozenset((yield from rows_of(sql.jsonb_columns())))
    if not (yield from first_of(sql.format_table_exists())):
        return StoredFormat(jsonb_columns=jsonb)
    values = {marker.name: marker.value for marker in (yield from rows_of(sql.markers()))}
    return StoredFormat(legacy_json_33=values.get(LEGACY_JSON_SER_ID) == "33",
                        akka_layout=values.get(EVENT_LAYOUT) == AKKA_LAYOUT,
                        data_partitions=int(values.get(DATA_PARTITIONS) or 1), jsonb_columns=jsonb)
