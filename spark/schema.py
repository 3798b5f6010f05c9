"""The columns of the native source (``format("pgjournal")``) and the Spark schema of a read: each table's
columns with their Spark types (the store's column order), the decoded payload's struct (given as option
``payloadSchema``, or inferred from a sample of payloads), and the check of a schema given with ``.schema(...)``.

PySpark's Python Data Source API has no column pruning (a reader produces every column of its schema), so the
schema is the read's projection: a schema without the payload neither reads nor decodes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgjournal.errors import ConfigurationError
from pgjournal.store.export import EVENTS, STATES, TABLES, ExportSQL

from .arrow import Columns
from .decode import REDACTED, PayloadDecoder

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from pgjournal.codec.serialization import SerializerRegistry

FORMAT = "pgjournal"
#: Spark types of each table's columns (the store's column order), and the name of the decoded payload.
COLUMN_TYPES = {
    EVENTS.name: {"slice": "INT", "entity_type": "STRING", "persistence_id": "STRING", "seq_nr": "BIGINT",
                  "db_timestamp": "TIMESTAMP", "writer": "STRING", "tags": "ARRAY<STRING>", "event_ser_id": "INT",
                  "event_ser_manifest": "STRING", "event_payload": "BINARY"},
    STATES.name: {"slice": "INT", "entity_type": "STRING", "persistence_id": "STRING", "revision": "BIGINT",
                  "db_timestamp": "TIMESTAMP", "tags": "ARRAY<STRING>", "state_ser_id": "INT",
                  "state_ser_manifest": "STRING", "state_payload": "BINARY", "deleted": "BOOLEAN"},
}
DECODED = {EVENTS.name: "event", STATES.name: "state"}
assert all(list(COLUMN_TYPES[t]) == list(TABLES[t].columns) for t in TABLES)
#: Payloads sampled to infer the ``event`` struct when decoding without a payloadSchema.
INFER_SAMPLE = 1_000


def payload_struct_ddl(payload_schema: str) -> str:
    """``"item STRING, qty INT"`` -> ``"STRUCT<item STRING, qty INT>"`` (already a STRUCT: unchanged)."""
    text = payload_schema.strip()
    return text if text.upper().startswith("STRUCT<") else f"STRUCT<{text}>"


def arrow_type_ddl(arrow_type: pa.DataType) -> str | None:
    """The Spark DDL of an Arrow type inferred from JSON values (``None``: nothing to infer from)."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        fields = []
        for f in arrow_type:
            inner = arrow_type_ddl(f.type)
            if inner is not None:
                fields.append(f"`{f.name.replace('`', '``')}` {inner}")
        return f"STRUCT<{', '.join(fields)}>" if fields else None
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        inner = arrow_type_ddl(arrow_type.value_type)
        return f"ARRAY<{inner or 'STRING'}>"
    if pa.types.is_boolean(arrow_type):
        return "BOOLEAN"
    if pa.types.is_integer(arrow_type):
        return "BIGINT"
    if pa.types.is_floating(arrow_type):
        return "DOUBLE"
    if pa.types.is_null(arrow_type):
        return None
    return "STRING"


def infer_payload_ddl(conn: psycopg.Connection, store: ExportSQL, entity_type: str | None,
                      registry: SerializerRegistry, sample: int = INFER_SAMPLE) -> str | None:
    """The struct DDL of the payloads among the first ``sample`` rows that ``registry`` decodes to JSON objects
    (``None``: none)."""
    import pyarrow as pa

    rows = conn.execute(*store.payload_sample(entity_type, sample)).fetchall()
    decoder = PayloadDecoder(registry)
    objects = [v for v in (decoder.data(*row)[0] for row in rows) if isinstance(v, dict)]
    if not objects:
        return None
    try:
        inferred = pa.array(objects).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        raise ConfigurationError("the sampled payloads do not share one JSON shape: give option payloadSchema "
                                 "(e.g. 'item STRING, qty INT')") from None
    return arrow_type_ddl(inferred)


def read_columns(schema: StructType, table: str) -> Columns:
    """What a read of ``schema`` returns and selects; raise :class:`ConfigurationError` unless every field is
    a column of ``table`` with its type (or the decoded payload, a struct), each once."""
    types = COLUMN_TYPES[table]
    names = list(schema.fieldNames())
    wrong = []
    for f in schema.fields:
        kind = f.dataType.simpleString()
        if (f.name == DECODED[table] and kind.startswith("struct<")) or (f.name == REDACTED and kind == "boolean"):
            continue
        if f.name not in types or types[f.name].lower() != kind:
            wrong.append(f"{f.name} {kind}")
    if wrong or len(set(names)) != len(names) or not names:
        raise ConfigurationError(
            f"format {FORMAT!r} reads the columns " + ", ".join(f"{n} {t.lower()}" for n, t in types.items())
            + f" (then {DECODED[table]}, a struct, and {REDACTED} boolean when decoding) of {table}, each at most "
            "once; got a schema "
            f"with {', '.join(wrong or names)}")
    return Columns.of(names, DECODED[table], TABLES[table].serialized)
