"""A native Spark data source for the journal (PySpark's Python Data Source API), no JDBC jar needed.

``spark.read.format("pgjournal").option("entityType", "Cart").option("sliceRanges", 8).load()`` reads
``event_journal`` with one input partition per slice range. Each task streams its range from PostgreSQL
(``COPY ... TO STDOUT`` as CSV, parsed by Arrow's C++ reader) into Arrow record batches. The upper bound
of a batch read is the visibility horizon (:mod:`pgjournal.horizon`), settled once while Spark plans the
read: every partition reads below the same bound, so the result is a consistent, final set that a later
read only adds to.

``spark.readStream.format("pgjournal")`` is in :mod:`spark.stream`; both share the options, the schema and
the row -> Arrow conversion here.

What Spark lets a Python source do (PySpark 4.3): filters on ``entity_type``, ``slice``,
``persistence_id``, ``db_timestamp`` and ``seq_nr`` are pushed into the SQL (batch reads; the API has no
pushdown for stream readers), and slice filters drop whole partitions. The API has no column pruning: a
reader always produces every column of its schema, so the JSON payload is decoded only when asked for
(``decode`` or ``payloadSchema``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.dsn import mask_dsn, resolve_dsn
from pgjournal.errors import ConfigurationError, DatabaseUnavailable, InvalidArgument, SerializationError
from pgjournal.offsets import parse_timestamp
from pgjournal.serialization import SerializerRegistry
from pgjournal.slices import parse_slice_range

from .read import EVENT_COLUMNS, check_entity_type, resolve_slice_ranges

try:  # the base classes exist only where PySpark is installed; the option parsing works without it
    from pyspark.sql.datasource import DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - pgjournal without the spark extra
    DataSourceReader = object  # type: ignore[assignment,misc]

    @dataclass
    class InputPartition:  # type: ignore[no-redef]
        value: Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.datasource import Filter
    from pyspark.sql.types import StructType

    from pgjournal import Journal

FORMAT = "pgjournal"
#: The columns every read returns (``spark.read.read_events``' columns), then ``event`` when decoding.
BASE_SCHEMA = ("slice INT, entity_type STRING, persistence_id STRING, seq_nr BIGINT, db_timestamp TIMESTAMP, "
               "writer STRING, tags ARRAY<STRING>, event_ser_id INT, event_ser_manifest STRING, "
               "event_payload BINARY")
#: The SELECT list, in :data:`EVENT_COLUMNS` order, as text that Arrow's C++ CSV reader turns into columns
#: (measured on 100k events in one process: 240-490k rows/s; a server-side cursor into Python tuples: 116k):
#: the timestamp as epoch microseconds, tags as a JSON array, the payload as hex.
SELECT_LIST = ("slice, entity_type, persistence_id, seq_nr, "
               "(EXTRACT(EPOCH FROM db_timestamp) * 1000000)::bigint, writer, "
               "COALESCE(array_to_json(tags)::text, '[]'), event_ser_id, event_ser_manifest, "
               "encode(event_payload, 'hex')")
#: Spark setting that must be on for pushFilters to be called (else Spark refuses the reader).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
#: Payloads to infer a schema from: of one entity type, or of all (entity_type NULL).
SAMPLE_SQL = ("SELECT event_ser_id, event_ser_manifest, event_payload FROM event_journal WHERE NOT deleted "
              "AND (%(entity_type)s::varchar IS NULL OR entity_type = %(entity_type)s) LIMIT %(sample)s")
DEFAULT_SLICE_RANGES = 4
DEFAULT_BATCH_ROWS = 20_000
#: Payloads sampled to infer the ``event`` struct when decoding without a payloadSchema.
INFER_SAMPLE = 1_000
OPTIONS = {
    "dsn": "connection string (default $PGJOURNAL_DSN, else the embedded server)",
    "entitytype": "entity type to read (default every entity type)",
    "sliceranges": "a divisor of 1024, or ranges like 0-511,512-1023 (default 4)",
    "decode": "true: add `event`, the JSON payload as a struct (schema inferred from a sample)",
    "payloadschema": "DDL of the payload struct, e.g. 'item STRING, qty INT' (implies decode)",
    "since": "ISO 8601 lower bound on db_timestamp, inclusive (batch)",
    "until": "ISO 8601 upper bound on db_timestamp, exclusive (batch; never above the horizon)",
    "batchrows": "rows per Arrow batch (default 20000)",
    "portable": "true: the clock minus longest_transaction instead of the writer-lock horizon",
    "startingoffsets": "stream: earliest (default), latest, or a JSON offset",
    "maxeventspertrigger": "stream: at most this many events per micro-batch",
    "path": "ignored (Spark may pass it)",
}


# -- options ---------------------------------------------------------------------------------------------


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {key} must be true or false, got {value!r}")


def _positive(options: Mapping[str, str], key: str, default: int | None) -> int | None:
    value = options.get(key)
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1:
        raise InvalidArgument(f"option {key} must be a positive integer, got {value!r}")
    return number


def parse_slice_ranges_option(value: object) -> tuple[tuple[int, int], ...]:
    """``"8"`` -> eight equal ranges; ``"0-511,512-1023"`` -> those ranges (checked: in 0..1023, disjoint)."""
    text = str(value).strip() if value is not None else str(DEFAULT_SLICE_RANGES)
    try:
        if text.isdigit():
            return tuple(resolve_slice_ranges(int(text)))
        return tuple(resolve_slice_ranges([parse_slice_range(part) for part in text.split(",")]))
    except InvalidArgument as exc:
        raise InvalidArgument(f"option sliceRanges={text!r}: {exc}") from None


def describe_ranges(ranges: Sequence[tuple[int, int]]) -> str:
    return ",".join(f"{lo}-{hi}" for lo, hi in ranges)


@dataclass(frozen=True)
class SourceOptions:
    """The options of a ``format("pgjournal")`` read, checked (no database needed)."""

    dsn: str
    entity_type: str | None
    ranges: tuple[tuple[int, int], ...]
    decode: bool
    payload_schema: str | None
    since: datetime | None
    until: datetime | None
    batch_rows: int
    portable: bool | None
    starting_offsets: str
    max_events: int | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Raise :class:`InvalidArgument` or :class:`ConfigurationError` naming a bad option."""
        lowered = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(set(lowered) - set(OPTIONS))
        if unknown:
            raise InvalidArgument(f"unknown option(s) {', '.join(unknown)} for format {FORMAT!r}; known: "
                                  + ", ".join(sorted(OPTIONS)))
        try:
            entity_type = check_entity_type(lowered.get("entitytype"))
        except InvalidArgument as exc:
            raise InvalidArgument(f"option entityType: {exc}") from None
        payload_schema = lowered.get("payloadschema")
        if payload_schema is not None and not str(payload_schema).strip():
            raise InvalidArgument(f"option payloadSchema must be a DDL schema like 'item STRING, qty INT', "
                                  f"got {payload_schema!r}")
        since = parse_timestamp(lowered["since"], "option since") if lowered.get("since") else None
        until = parse_timestamp(lowered["until"], "option until") if lowered.get("until") else None
        if since is not None and until is not None and since >= until:
            raise InvalidArgument(f"option since ({since.isoformat()}) must be earlier than until "
                                  f"({until.isoformat()})")
        portable = _bool(lowered, "portable", False) if "portable" in lowered else None
        starting = str(lowered.get("startingoffsets", "earliest")).strip()
        if starting.lower() in ("earliest", "latest"):
            starting = starting.lower()
        elif not starting.startswith("{"):
            raise InvalidArgument(f"option startingOffsets must be earliest, latest or a JSON offset, "
                                  f"got {starting!r}")
        return cls(
            dsn=resolve_dsn(lowered.get("dsn")),
            entity_type=entity_type,
            ranges=parse_slice_ranges_option(lowered.get("sliceranges")),
            decode=_bool(lowered, "decode", False) or payload_schema is not None,
            payload_schema=str(payload_schema).strip() if payload_schema is not None else None,
            since=since,
            until=until,
            batch_rows=_positive(lowered, "batchrows", DEFAULT_BATCH_ROWS) or DEFAULT_BATCH_ROWS,
            portable=portable,
            starting_offsets=starting,
            max_events=_positive(lowered, "maxeventspertrigger", None),
        )

    def open_journal(self) -> Journal:
        """A one-connection journal for planning (raises :class:`DatabaseUnavailable` when unreachable)."""
        from pgjournal import Journal

        return Journal.open(self.dsn, portable=self.portable, notify=False, pool_min_size=1, pool_max_size=1)


def check_entity_type_known(conn: psycopg.Connection, entity_type: str | None, dsn: str) -> None:
    """Raise :class:`ConfigurationError` when ``entity_type`` has no event in the journal (a typo, mostly)."""
    if entity_type is None:
        return
    if conn.execute("SELECT 1 FROM event_journal WHERE entity_type = %s LIMIT 1", (entity_type,)).fetchone():
        return
    known = [r[0] for r in conn.execute(
        "SELECT DISTINCT entity_type FROM event_journal ORDER BY 1 LIMIT 20").fetchall()]
    raise ConfigurationError(
        f"entity type {entity_type!r} has no events in the journal at {mask_dsn(dsn)}; entity types there: "
        + (", ".join(repr(k) for k in known) if known else "none (the journal is empty)"))


# -- schema and rows -> Arrow ------------------------------------------------------------------------------


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


def infer_payload_ddl(conn: psycopg.Connection, entity_type: str | None, registry: SerializerRegistry,
                      sample: int = INFER_SAMPLE) -> str | None:
    """The struct DDL of the JSON object payloads among the first ``sample`` events (``None``: none)."""
    import pyarrow as pa

    rows = conn.execute(SAMPLE_SQL, {"entity_type": entity_type, "sample": sample}).fetchall()
    objects = [v for v in (_deserialize(registry, *row) for row in rows) if v is not None]
    if not objects:
        return None
    try:
        inferred = pa.array(objects).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        raise ConfigurationError("the sampled payloads do not share one JSON shape: give option payloadSchema "
                                 "(e.g. 'item STRING, qty INT')") from None
    return arrow_type_ddl(inferred)


def source_schema(options: SourceOptions) -> str:
    """The schema DDL of a read: :data:`BASE_SCHEMA`, plus ``event`` when decoding. Spark asks for it at
    ``load()``, so the database checks happen here too: a bad DSN or entity type fails before any task."""
    ddl = payload_struct_ddl(options.payload_schema) if options.payload_schema is not None else None
    with options.open_journal() as journal, journal.connection() as conn:
        check_entity_type_known(conn, options.entity_type, options.dsn)
        if options.decode and ddl is None:
            ddl = infer_payload_ddl(conn, options.entity_type, journal.serializers)
    return BASE_SCHEMA if ddl is None else f"{BASE_SCHEMA}, event {ddl}"


def check_schema(schema: StructType) -> bool:
    """Whether ``schema`` has an ``event`` column; raise :class:`ConfigurationError` unless it is ours."""
    names = list(schema.fieldNames())
    if names[: len(EVENT_COLUMNS)] != list(EVENT_COLUMNS) or len(names) > len(EVENT_COLUMNS) + 1 or (
        len(names) == len(EVENT_COLUMNS) + 1 and names[-1] != "event"
    ):
        raise ConfigurationError(f"format {FORMAT!r} reads the columns {', '.join(EVENT_COLUMNS)} (then event "
                                 f"when decoding), got a schema with {', '.join(names)}")
    return len(names) > len(EVENT_COLUMNS)


def _deserialize(registry: SerializerRegistry, ser_id: int, manifest: str, payload: bytes) -> dict | None:
    """The payload as a JSON object when the registry decodes it to one, else ``None``: payload formats are
    the registry's business, so no serializer id is assumed here."""
    try:
        value = registry.deserialize(ser_id, manifest, payload)
    except SerializationError:
        return None
    return value if isinstance(value, dict) else None


class ArrowRows:
    """COPY CSV blocks of journal rows (:data:`SELECT_LIST` order) -> Arrow record batches of a read's Spark
    schema, with no Python object per row (except payloads being decoded to ``event``).

    Picklable: built on the driver, used in every task. Payloads that are not JSON objects, or do not fit
    ``event``'s type, give a null ``event`` (as ``from_json`` would).
    """

    def __init__(self, schema: StructType) -> None:
        self.decode = check_schema(schema)
        self.schema_json = schema.json()
        self._arrow: pa.Schema | None = None
        self._registry: SerializerRegistry | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"decode": self.decode, "schema_json": self.schema_json, "_arrow": None, "_registry": None}

    @property
    def arrow_schema(self) -> pa.Schema:
        if self._arrow is None:
            from pyspark.sql.pandas.types import to_arrow_schema
            from pyspark.sql.types import StructType

            self._arrow = to_arrow_schema(StructType.fromJson(json.loads(self.schema_json)), timezone="UTC")
        return self._arrow

    def batches(self, block: bytes, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """The rows of one CSV ``block`` (whole rows) as record batches of at most ``batch_rows``."""
        import pyarrow as pa
        import pyarrow.csv as pcsv

        types = dict(zip(EVENT_COLUMNS, (pa.int32(), pa.string(), pa.string(), pa.int64(), pa.int64(), pa.string(),
                                         pa.string(), pa.int32(), pa.string(), pa.string()), strict=True))
        table = pcsv.read_csv(
            pa.BufferReader(block),
            # one parse block for the whole buffer: a row may be larger than Arrow's default block (1 MiB)
            read_options=pcsv.ReadOptions(column_names=list(EVENT_COLUMNS), use_threads=False,
                                          block_size=max(len(block) + 1, 1 << 20)),
            parse_options=pcsv.ParseOptions(newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=False,
                                                quoted_strings_can_be_null=False))
        for raw in table.to_batches(max_chunksize=batch_rows):
            yield self.convert(raw)

    def convert(self, raw: pa.RecordBatch) -> pa.RecordBatch:
        import pyarrow as pa

        schema = self.arrow_schema
        arrays = list(raw.columns)
        arrays[4] = arrays[4].cast(schema.field(4).type)  # epoch microseconds -> timestamp[us, UTC]
        arrays[6] = _json_lists(arrays[6])
        arrays[9] = _unhex(arrays[9])
        if self.decode:
            arrays.append(self._events(arrays[7].to_pylist(), arrays[8].to_pylist(), arrays[9].to_pylist(),
                                       schema.field(len(EVENT_COLUMNS)).type))
        arrays = [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _events(self, ser_ids: Sequence[int], manifests: Sequence[str], payloads: Sequence[bytes],
                struct: pa.DataType) -> pa.Array:
        import pyarrow as pa

        if self._registry is None:
            self._registry = SerializerRegistry()
        values = [_deserialize(self._registry, s, m, p) for s, m, p in zip(ser_ids, manifests, payloads,
                                                                             strict=True)]
        try:
            return pa.array(values, type=struct)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            return pa.array([_fitting(v, struct) for v in values], type=struct)


def _string_data(array: pa.Array) -> tuple[pa.Array, bytes]:
    """The offsets (rebased to 0) and the concatenated bytes of a string array without nulls."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = pa.Array.from_buffers(pa.int32(), len(array) + 1, [None, array.buffers()[1]], offset=array.offset)
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    data = array.buffers()[2]
    return pc.subtract(offsets, first), (data.to_pybytes()[first:last] if data is not None else b"")


def _unhex(array: pa.Array) -> pa.Array:
    """Hex text (``encode(bytea, 'hex')``) -> binary, decoded in one ``bytes.fromhex`` call for the batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets, text = _string_data(array)
    data = bytes.fromhex(text.decode("ascii"))
    halved = pc.divide(offsets, 2).cast(pa.int32())
    return pa.Array.from_buffers(pa.binary(), len(array), [None, halved.buffers()[1], pa.py_buffer(data)],
                                 offset=halved.offset)


def _json_lists(array: pa.Array) -> pa.Array:
    """JSON arrays of strings (``array_to_json(tags)``) -> ``list<string>``, parsed by Arrow's JSON reader."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pjson

    if len(array) == 0:
        return pa.array([], pa.list_(pa.string()))
    lines = pc.binary_join_element_wise('{"t":', array, "}\n", "")
    _, text = _string_data(lines)
    schema = pa.schema([("t", pa.list_(pa.string()))])
    table = pjson.read_json(pa.BufferReader(text), read_options=pjson.ReadOptions(use_threads=False),
                            parse_options=pjson.ParseOptions(explicit_schema=schema))
    return table.column(0).combine_chunks()


def _fitting(value: dict | None, struct: pa.DataType) -> dict | None:
    import pyarrow as pa

    try:
        pa.array([value], type=struct)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None
    return value


#: Bytes of CSV handed to Arrow at a time.
BLOCK_BYTES = 4 << 20


def stream_rows(dsn: str, query: str, params: Mapping[str, Any], converter: ArrowRows, batch_rows: int
                ) -> Iterator[pa.RecordBatch]:
    """``COPY (query) TO STDOUT (FORMAT CSV)`` in a read-only transaction, parsed block by block by Arrow.

    PostgreSQL sends one COPY message per row, so blocks cut at message ends hold whole rows. psycopg binds
    the parameters of a COPY client-side (quoted, never spliced as text).
    """
    try:
        conn = psycopg.connect(dsn, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DatabaseUnavailable(f"cannot connect to {mask_dsn(dsn)}: {mask_dsn(reason)}") from None
    try:
        with conn:
            conn.read_only = True
            with conn.cursor() as cur, cur.copy(f"COPY ({query}) TO STDOUT (FORMAT CSV)", params) as copy:
                parts: list[bytes] = []
                size = 0
                for message in copy:
                    part = bytes(message)
                    parts.append(part)
                    size += len(part)
                    if size >= BLOCK_BYTES and part.endswith(b"\n"):
                        yield from converter.batches(b"".join(parts), batch_rows)
                        parts, size = [], 0
                if parts:
                    yield from converter.batches(b"".join(parts), batch_rows)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DatabaseUnavailable(f"lost the connection to {mask_dsn(dsn)}: {mask_dsn(reason)}") from None
    finally:
        conn.close()


# -- filter pushdown -------------------------------------------------------------------------------------

#: Columns whose filters become SQL, with the SQL type of their values.
PUSHABLE = {"entity_type": "varchar", "slice": "int", "persistence_id": "varchar", "seq_nr": "bigint",
            "db_timestamp": "timestamptz"}
_COMPARISONS = {"EqualTo": "=", "GreaterThan": ">", "GreaterThanOrEqual": ">=", "LessThan": "<",
                "LessThanOrEqual": "<="}


@dataclass
class PushedFilters:
    """SQL conditions (named placeholders ``f0``, ``f1``, ...) and the slices they leave."""

    conditions: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    slices: set[int] = field(default_factory=lambda: set(range(1024)))

    def push(self, flt: Filter) -> bool:
        """Take ``flt`` when it is a comparison or IN on a pushable column with plain values."""
        kind = type(flt).__name__
        column = flt.attribute[0] if len(flt.attribute) == 1 else None
        if column not in PUSHABLE or kind not in (*_COMPARISONS, "In"):
            return False
        values = list(flt.value) if kind == "In" else [flt.value]
        try:
            values = [_sql_value(column, v) for v in values]
        except (TypeError, ValueError):
            return False
        name = f"f{len(self.params)}"
        sql_type = PUSHABLE[column]
        if kind == "In":
            self.conditions.append(f"{column} = ANY(%({name})s::{sql_type}[])")
            self.params[name] = values
        else:
            self.conditions.append(f"{column} {_COMPARISONS[kind]} %({name})s::{sql_type}")
            self.params[name] = values[0]
        if column == "slice":
            self.slices &= {s for s in range(1024) if any(_compare(kind, s, v) for v in values)}
        return True


def _sql_value(column: str, value: Any) -> Any:
    if column == "db_timestamp":
        if not isinstance(value, datetime):
            raise TypeError(value)
        # Spark hands timestamps over as naive datetimes in UTC (the source's session time zone is UTC)
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if column in ("slice", "seq_nr"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(value)
        return value
    if not isinstance(value, str):
        raise TypeError(value)
    return value


def _compare(kind: str, left: int, right: int) -> bool:
    return {"EqualTo": left == right, "In": left == right, "GreaterThan": left > right,
            "GreaterThanOrEqual": left >= right, "LessThan": left < right, "LessThanOrEqual": left <= right}[kind]


# -- batch ------------------------------------------------------------------------------------------------


class RangePartition(InputPartition):
    """One slice range of a read: ``lo..hi`` and, for a batch read, the settled bound (``until``, exclusive,
    ISO 8601); for a micro-batch, the range's start (exclusive) and end (inclusive) offsets."""

    def __init__(self, index: int, lo: int, hi: int, *, until: str | None = None, start: str | None = None,
                 end: str | None = None) -> None:
        super().__init__(index)
        self.lo, self.hi, self.until, self.start, self.end = lo, hi, until, start, end

    def __repr__(self) -> str:
        return f"RangePartition({self.lo}-{self.hi}, until={self.until}, start={self.start}, end={self.end})"


class JournalBatchReader(DataSourceReader):
    """Reads each slice range below one horizon settled at planning time."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.converter = ArrowRows(schema)
        self.pushed = PushedFilters()
        # Fail at planning, before any task runs: unreachable database, missing schema, unknown entity type.
        with options.open_journal() as journal, journal.connection() as conn:
            check_entity_type_known(conn, options.entity_type, options.dsn)

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for flt in filters:
            if not self.pushed.push(flt):
                yield flt

    def partitions(self) -> list[InputPartition]:
        with self.options.open_journal() as journal, journal.connection() as conn:
            bound = journal.horizon_tracker().final_bound(conn)
        if self.options.until is not None:
            bound = min(bound, self.options.until)
        kept = [(lo, hi) for lo, hi in self.options.ranges if self.pushed.slices & set(range(lo, hi + 1))]
        return [RangePartition(i, lo, hi, until=bound.isoformat()) for i, (lo, hi) in enumerate(kept)]

    def sql(self) -> str:
        conditions = ["slice BETWEEN %(lo)s AND %(hi)s", "NOT deleted", "db_timestamp < %(until)s"]
        if self.options.entity_type is not None:
            conditions.append("entity_type = %(entity_type)s")
        if self.options.since is not None:
            conditions.append("db_timestamp >= %(since)s")
        conditions.extend(self.pushed.conditions)
        return f"SELECT {SELECT_LIST} FROM event_journal WHERE " + " AND ".join(conditions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition) or partition.until is None:
            return iter(())  # every range was filtered out: Spark still runs one (empty) partition
        params = {"lo": partition.lo, "hi": partition.hi, "until": datetime.fromisoformat(partition.until),
                  "entity_type": self.options.entity_type, "since": self.options.since, **self.pushed.params}
        return stream_rows(self.options.dsn, self.sql(), params, self.converter, self.options.batch_rows)
