"""How this database's payloads must be read: facts that migrations record in ``pgjournal_format``.

The one fact so far: **legacy JSON under id 33**. Before revision 0005 pgjournal wrote JSON with
``ser_id`` 33, which is Akka's id for Jackson CBOR (Akka's JSON is 31). From 0005 on pgjournal writes 31 and
reads 33 as CBOR, as Akka does. A database that already holds rows with id 33 when it is migrated to 0005
gets the marker ``legacy_json_ser_id = 33``; a journal opened on it reads a 33 payload as JSON where it is
JSON and as CBOR otherwise (see ``serialization._legacy_33`` for why that cannot mistake Akka's CBOR).

Why a marker and not a data migration (``UPDATE ... SET event_ser_id = 31 WHERE event_ser_id = 33``):

* the least-privileged writer role may not update ``event_ser_id`` (history is append-only, see
  :mod:`pgjournal.roles`), and the owner running the migration would rewrite every row of a table that may
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

FORMAT_TABLE = "pgjournal_format"
LEGACY_JSON_SER_ID = "legacy_json_ser_id"
_SELECT = f"SELECT name, value FROM {FORMAT_TABLE}"


@dataclass(frozen=True, slots=True)
class StoredFormat:
    #: Rows with ``ser_id`` 33 may be pgjournal's old JSON (read JSON where it is JSON, else CBOR).
    legacy_json_33: bool = False


def read_stored_format(conn: psycopg.Connection) -> StoredFormat:
    """The markers of the database on ``conn``; none (Akka's meaning of every id) when the table is absent,
    as in a journal that Akka created."""
    found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (FORMAT_TABLE,)).fetchone()
    if not found or not found[0]:
        return StoredFormat()
    values = dict(conn.execute(_SELECT).fetchall())
    return StoredFormat(legacy_json_33=values.get(LEGACY_JSON_SER_ID) == "33")
