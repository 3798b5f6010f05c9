"""A native Spark data source for the journal (PySpark's Python Data Source API), no JDBC jar needed.

``spark.read.format("pgjournal").option("entityType", "Cart").option("sliceRanges", 8).load()`` reads
``event_journal`` with one input partition per slice range; ``.option("table", "durable_state")`` reads the
durable state table the same way (each persistence id's latest state). Each task streams its range from
PostgreSQL into Arrow record batches (:mod:`spark.arrow`: a binary COPY read by the ADBC driver). The upper
bound of a batch read is the visibility horizon (:mod:`pgjournal.core.horizon`) of the table's writers, settled
once while Spark plans the read: every partition reads below the same bound, so the result is a consistent,
final set that a later read only adds to. The statements come from the store layer
(:class:`pgjournal.store.export.ExportSQL`).

``spark.readStream.format("pgjournal")`` is in :mod:`spark.stream`; both share the options, the schema and
the row -> Arrow conversion here.

A journal sharded by slice range over several databases (docs/sharding.md) is read with option ``shards``
(``RANGE=DSN;RANGE=DSN``, the form of ``PGJOURNAL_SHARDS``, which is the default when neither ``dsn`` nor
``shards`` is given): the databases must record that layout (checked while planning), the read's slice ranges
are cut at the databases' boundaries, each database's horizon bounds its own partitions, and every partition
carries its database's DSN, so the databases are read in parallel. Batch reads only, for now.

What Spark lets a Python source do (PySpark 4.3): filters on ``entity_type``, ``slice``,
``persistence_id``, ``db_timestamp`` and ``seq_nr`` / ``revision`` are pushed into the SQL (batch reads; the
API has no pushdown for stream readers), and slice filters drop whole partitions. The API has no column
pruning (a reader produces every column of its schema), so the schema is the projection: option
``columns`` (or a schema given with ``.schema(...)``) names the columns to return, and a read without the
payload neither reads nor decodes it. Option ``tags`` keeps the rows carrying any of the tags, filtered by the
database in every statement of a read (the tagged events' index), a stream's offsets included.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.codec.transcoding import KEY_BYTES, Transcoder
from pgjournal.errors import ConfigurationError, InvalidArgument, SchemaNotMigrated
from pgjournal.model.offsets import parse_timestamp
from pgjournal.model.slices import parse_slice_range
from pgjournal.server.dsn import check_dsn, mask_dsn, resolve_dsn
from pgjournal.shards.layout import SHARDS_ENV, ShardSettings
from pgjournal.store.export import EVENTS, STATES, TABLES, ExportSQL
from pgjournal.validation import check_tag_filter

from .arrow import ArrowRows, Columns, stream_rows
from .decode import REDACTED, PayloadDecoder
from .read import check_entity_type, check_recorded_layout, ranges_by_database, resolve_shards, resolve_slice_ranges

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
    from pgjournal.core.horizon import HorizonTracker
    from pgjournal.core.replica import ReplicaHorizon

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
#: Spark setting that must be on for pushFilters to be called (else Spark refuses the reader).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
DEFAULT_SLICE_RANGES = 4
#: The ADBC driver hands over batches of about 16 MiB (~95k journal rows of ~100-byte payloads); slicing
#: them smaller only adds Arrow messages to the JVM.
DEFAULT_BATCH_ROWS = 100_000
#: Payloads sampled to infer the ``event`` struct when decoding without a payloadSchema.
INFER_SAMPLE = 1_000
OPTIONS = {
    "dsn": "connection string (default $PGJOURNAL_DSN, else the embedded server)",
    "shards": f"a journal sharded by slice range: RANGE=DSN entries separated by ';' (default ${SHARDS_ENV} when "
              "option dsn is not given); each database's ranges are read in parallel, from that database",
    "replica": "a hot standby of the database of option dsn to read from, below the primary's horizon once the "
               "standby has replayed it (docs/sharding.md, section 7); a sharded journal's as replica:RANGE=DSN "
               "entries in option shards",
    "table": "event_journal (default: events) or durable_state (each persistence id's latest state)",
    "entitytype": "entity type to read (default every entity type)",
    "sliceranges": "a divisor of 1024, or ranges like 0-511,512-1023 (default 4)",
    "columns": "the columns to return, comma-separated (default all): without the payload and its decoded "
               "column, payloads are neither read nor decoded",
    "decode": "true: add `event` (`state` for durable_state), the payload decoded by the journal's serializer "
              "registry as a struct (schema inferred from a sample), and `redacted`",
    "payloadschema": "DDL of the payload struct, e.g. 'item STRING, qty INT' (implies decode)",
    "masterkey": "the PostgresKeyStore's master key (32 bytes, hex or base64), to decode encrypted payloads",
    "keystoredsn": "the PostgresKeyStore's database, with masterKey (default: dsn)",
    "since": "ISO 8601 lower bound on db_timestamp, inclusive (batch)",
    "until": "ISO 8601 upper bound on db_timestamp, exclusive (batch; never above the horizon)",
    "batchrows": f"rows per Arrow batch at most (default {DEFAULT_BATCH_ROWS})",
    "portable": "true: the clock minus longest_transaction instead of the writer-lock horizon",
    "startingoffsets": "stream: earliest (default), latest, or a JSON offset",
    "maxeventspertrigger": "stream: at most this many rows per micro-batch",
    "tags": "only the rows carrying any of these tags, comma-separated (filtered by the database)",
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


def _columns_option(value: object, table: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = [part.strip() for part in str(value).split(",")]
    known = [*COLUMN_TYPES[table], DECODED[table], REDACTED]
    unknown = [n for n in names if n not in known]
    if unknown or not all(names) or len(set(names)) != len(names):
        raise InvalidArgument(f"option columns must name distinct columns of {table} ({', '.join(known)}), "
                              f"got {value!r}")
    return tuple(names)


@dataclass(frozen=True)
class SourceOptions:
    """The options of a ``format("pgjournal")`` read, checked (no database needed)."""

    dsn: str
    table: str
    entity_type: str | None
    ranges: tuple[tuple[int, int], ...]
    columns: tuple[str, ...] | None
    decode: bool
    payload_schema: str | None
    since: datetime | None
    until: datetime | None
    batch_rows: int
    portable: bool | None
    starting_offsets: str
    max_events: int | None
    #: The PostgresKeyStore's master key and database (``None``: the key store, if any, is the registry's).
    master_key: bytes | None = field(default=None, repr=False)
    key_store_dsn: str | None = field(default=None, repr=False)
    #: Option tags: only the rows carrying any of these (``None``: every row).
    tags: tuple[str, ...] | None = None
    #: The databases of a sharded journal (``dsn`` is then the first one's); ``None``: one database.
    shards: ShardSettings | None = field(default=None, repr=False)
    #: Option replica: the hot standby of the one database, where the read's rows are read.
    replica: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Raise :class:`InvalidArgument` or :class:`ConfigurationError` naming a bad option."""
        lowered = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(set(lowered) - set(OPTIONS))
        if unknown:
            raise InvalidArgument(f"unknown option(s) {', '.join(unknown)} for format {FORMAT!r}; known: "
                                  + ", ".join(sorted(OPTIONS)))
        table = str(lowered.get("table", EVENTS.name)).strip()
        if table not in TABLES:
            raise InvalidArgument(f"option table must be one of {', '.join(TABLES)}, got {table!r}")
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
        columns = _columns_option(lowered.get("columns"), table)
        master_key = _master_key(lowered.get("masterkey"))
        if lowered.get("keystoredsn") is not None and master_key is None:
            raise InvalidArgument("option keyStoreDsn needs option masterKey (the key store's master key)")
        shards = _shards_option(lowered)
        if lowered.get("replica") is not None and shards is not None:
            raise InvalidArgument("option replica is the standby of one database: give each database's of a sharded "
                                  "journal as replica:RANGE=DSN in option shards")
        return cls(
            dsn=shards.dsns[0] if shards is not None else resolve_dsn(lowered.get("dsn")),
            table=table,
            entity_type=entity_type,
            ranges=parse_slice_ranges_option(lowered.get("sliceranges")),
            columns=columns,
            decode=(_bool(lowered, "decode", False) or payload_schema is not None
                    or (columns is not None and DECODED[table] in columns)),
            payload_schema=str(payload_schema).strip() if payload_schema is not None else None,
            since=since,
            until=until,
            batch_rows=_positive(lowered, "batchrows", DEFAULT_BATCH_ROWS) or DEFAULT_BATCH_ROWS,
            portable=portable,
            starting_offsets=starting,
            max_events=_positive(lowered, "maxeventspertrigger", None),
            master_key=master_key,
            key_store_dsn=resolve_dsn(lowered["keystoredsn"]) if lowered.get("keystoredsn") is not None else None,
            tags=_tags_option(lowered.get("tags")),
            shards=shards,
            replica=_replica_option(lowered.get("replica")),
        )

    def databases(self) -> list[tuple[str, tuple[tuple[int, int], ...]]]:
        """Each database read, with the read's slice ranges it holds: the ranges of option sliceRanges cut at
        the databases' boundaries (a sharded journal), or all of them in the one database."""
        if self.shards is None:
            return [(self.dsn, self.ranges)]
        return ranges_by_database(self.shards, self.ranges)

    @property
    def decoded(self) -> str:
        """The name of the decoded payload column of this table (``event`` or ``state``)."""
        return DECODED[self.table]

    def output_columns(self) -> tuple[str, ...]:
        """The columns :func:`source_schema` gives: ``columns``, else all (and the decoded one when decoding)."""
        if self.columns is not None:
            return self.columns
        return (*COLUMN_TYPES[self.table], *((self.decoded, REDACTED) if self.decode else ()))

    def open_journal(self, serializers: SerializerRegistry | None = None) -> Journal:
        """A one-connection journal for planning (raises :class:`DatabaseUnavailable` when unreachable), whose
        ``serializers`` are the registry the read decodes with (:func:`reading_registry`), as the database
        must be read."""
        return self.open_journal_at(self.dsn, serializers)

    def open_journal_at(self, dsn: str, serializers: SerializerRegistry | None = None) -> Journal:
        """:meth:`open_journal` on the database at ``dsn`` (one of a sharded journal's), with its standby when the
        read has one (checked at open: a standby of that database)."""
        from pgjournal import Journal

        return Journal.open(dsn, portable=self.portable, notify=False, pool_min_size=1, pool_max_size=1,
                            serializers=reading_registry(self, serializers), replica=self.replica_of(dsn))

    def replica_of(self, dsn: str) -> str | None:
        """The hot standby the read reads the database at ``dsn`` on (option replica, or the shards' entry)."""
        return self.shards.replica_of(dsn) if self.shards is not None else self.replica

    def read_dsn(self, dsn: str) -> str:
        """Where a task reads the rows of the database at ``dsn``: its standby, else itself."""
        return self.replica_of(dsn) or dsn

    def check_layout(self) -> None:
        """A sharded read: every database answers and records the layout of option shards (as
        :meth:`ShardedJournal.open <pgjournal.shards.ShardedJournal.open>` checks it); else nothing."""
        if self.shards is not None:
            check_recorded_layout(self.shards, portable=self.portable)


def _shards_option(options: Mapping[str, str]) -> ShardSettings | None:
    """Option shards, else ``$PGJOURNAL_SHARDS`` when option dsn is not given either; ``None``: one database."""
    text = options.get("shards")
    try:
        return resolve_shards(options.get("dsn"), ShardSettings.parse(str(text)) if text is not None else None)
    except (ConfigurationError, InvalidArgument) as exc:
        raise type(exc)(f"option shards: {exc}") from None


def _replica_option(value: object) -> str | None:
    if value is None:
        return None
    try:
        return check_dsn(str(value))
    except ConfigurationError as exc:
        raise ConfigurationError(f"option replica: {exc}") from None


def _tags_option(value: object) -> tuple[str, ...] | None:
    """Option tags: tags separated by commas, at least one (events carrying any of them)."""
    if value is None:
        return None
    try:
        return check_tag_filter([tag.strip() for tag in str(value).split(",")])
    except InvalidArgument as exc:
        raise InvalidArgument(f"option tags must be tags separated by commas, got {value!r}: {exc}") from None


def _master_key(value: object) -> bytes | None:
    """Option masterKey: 32 bytes as 64 hex digits or as base64 (never echoed in an error)."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        key = bytes.fromhex(text) if len(text) == 2 * KEY_BYTES else base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        key = b""
    if len(key) != KEY_BYTES:
        raise InvalidArgument(f"option masterKey must be {KEY_BYTES} bytes as {2 * KEY_BYTES} hex digits or base64 "
                              f"(got {len(text)} characters that are neither)")
    return key


def reading_registry(options: SourceOptions, serializers: SerializerRegistry | None) -> SerializerRegistry:
    """The registry a read decodes with: ``serializers`` (the one :func:`spark.datasource.register` was given;
    default a plain one), reading encrypted payloads with the key store of option masterKey when given."""
    registry = serializers if serializers is not None else SerializerRegistry()
    if options.master_key is None:
        return registry
    transcoder = registry.transcoder
    if transcoder is not None and transcoder.key_store is not None:
        raise ConfigurationError("option masterKey gives a key store, and so does the serializer registry "
                                 "registered with the source: give one of them")
    from pgjournal.keystore import PostgresKeyStore

    store = PostgresKeyStore.shared(options.key_store_dsn or options.dsn, master_key=options.master_key)
    return registry.with_transcoder(Transcoder(key_store=store))


def export_store(journal: Journal, table: str) -> ExportSQL:
    """The store of bulk reads of ``table`` for ``journal``'s database (its dialect and payload column types)."""
    payload = TABLES[table].serialized[2]
    return journal.dialect.export_store(table, frozenset({payload} if journal.stored.jsonb(payload, table) else ()))


def horizon_tracker(journal: Journal, table: str) -> HorizonTracker | ReplicaHorizon:
    """The visibility horizon of ``table``'s writers (journal writers, or durable state writers) for a reader of
    ``journal.read_connection()``: on a standby, the primary's, once the standby has replayed it."""
    if table == EVENTS.name:
        return journal.reader_horizon()
    capabilities = journal.capabilities
    if capabilities.writer_horizon and not capabilities.state_relations:
        raise SchemaNotMigrated(f"the database has no {table} table; run `pgjournal migrate`")
    return journal.reader_horizon(capabilities.state_relations)


def check_entity_type_known(conn: psycopg.Connection, store: ExportSQL, entity_type: str | None, dsn: str) -> None:
    """Raise :class:`ConfigurationError` when ``entity_type`` has no row in the table (a typo, mostly)."""
    if entity_type is None or conn.execute(*store.has_entity_type(entity_type)).fetchone():
        return
    known = [r[0] for r in conn.execute(*store.entity_types(20)).fetchall()]
    what = "events in the journal" if store.table is EVENTS else f"rows in {store.table.name}"
    raise ConfigurationError(
        f"entity type {entity_type!r} has no {what} at {mask_dsn(dsn)}; entity types there: "
        + (", ".join(repr(k) for k in known) if known else f"none ({store.table.name} is empty)"))


@dataclass
class PlannedDatabase:
    """One database of a read, planned: its DSN, the read's slice ranges it holds, its planning journal and the
    table's store there."""

    dsn: str
    ranges: tuple[tuple[int, int], ...]
    journal: Journal
    store: ExportSQL


def plan_databases(options: SourceOptions, serializers: SerializerRegistry | None = None
                   ) -> list[PlannedDatabase]:
    """Every database of the read (one, or those of option shards holding its ranges), after the checks that
    must fail before any task runs: the shard layout agreed, no database unreachable or without schema, the
    entity type known in one of them. The journals' ``serializers`` are what the read decodes with (the stored
    format read once, here). The caller closes the journals (:func:`close_planned`)."""
    options.check_layout()
    planned: list[PlannedDatabase] = []
    try:
        for dsn, ranges in options.databases():
            journal = options.open_journal_at(dsn, serializers)
            try:
                store = export_store(journal, options.table).with_tags(options.tags)
                horizon_tracker(journal, options.table)
            except BaseException:
                journal.close()
                raise
            planned.append(PlannedDatabase(dsn, ranges, journal, store))
        unknown: list[ConfigurationError] = []
        for database in planned:
            with database.journal.connection() as conn:
                try:
                    check_entity_type_known(conn, database.store, options.entity_type, database.dsn)
                except ConfigurationError as exc:
                    unknown.append(exc)
        if len(unknown) == len(planned) == 1:
            raise unknown[0]
        if unknown and len(unknown) == len(planned):
            raise ConfigurationError(f"in none of the {len(planned)} databases of the sharded journal: {unknown[0]}")
    except BaseException:
        close_planned(planned)
        raise
    return planned


def close_planned(planned: Sequence[PlannedDatabase]) -> None:
    for database in planned:
        database.journal.close()


def plan(options: SourceOptions, serializers: SerializerRegistry | None = None) -> tuple[Journal, ExportSQL]:
    """:func:`plan_databases`, keeping the first database's journal and store (the only ones of a read of one
    database). The caller closes the journal."""
    planned = plan_databases(options, serializers)
    close_planned(planned[1:])
    return planned[0].journal, planned[0].store


# -- schema ---------------------------------------------------------------------------------------------


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


def source_schema(options: SourceOptions, serializers: SerializerRegistry | None = None) -> str:
    """The schema DDL of a read (:meth:`SourceOptions.output_columns`). Spark asks for it at ``load()``, so
    the database checks happen here too: a bad DSN or entity type fails before any task."""
    columns = options.output_columns()
    decoded_ddl = payload_struct_ddl(options.payload_schema) if options.payload_schema is not None else None
    planned = plan_databases(options, serializers)
    try:
        for database in planned:
            if options.decoded not in columns or decoded_ddl is not None:
                break
            with database.journal.connection() as conn:  # a sharded journal: the first database with payloads
                decoded_ddl = infer_payload_ddl(conn, database.store, options.entity_type,
                                                database.journal.serializers)
    finally:
        close_planned(planned)
    types = {**COLUMN_TYPES[options.table], options.decoded: decoded_ddl, REDACTED: "BOOLEAN"}
    return ", ".join(f"{name} {types[name]}" for name in columns if types[name] is not None)


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


# -- filter pushdown -------------------------------------------------------------------------------------


@dataclass
class PushedFilters:
    """Filters taken by a reader as SQL conditions (from the store), and the slices they leave."""

    store: ExportSQL
    conditions: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    slices: set[int] = field(default_factory=lambda: set(range(1024)))

    def push(self, flt: Filter) -> bool:
        """Take ``flt`` when it is a comparison or IN on a pushable column with plain values."""
        kind = type(flt).__name__
        attribute: tuple[str, ...] = getattr(flt, "attribute", ())  # Not, And, Or have none: not pushed
        column = attribute[0] if len(attribute) == 1 else None
        if column not in self.store.pushable:
            return False
        values: list[Any] = list(getattr(flt, "value", ())) if kind == "In" else [getattr(flt, "value", None)]
        try:
            values = [_sql_value(column, v) for v in values]
        except (TypeError, ValueError):
            return False
        condition = self.store.condition(column, kind, values, f"f{len(self.conditions)}")
        if condition is None:
            return False
        self.conditions.append(condition)
        if column == "slice":
            self.slices &= {s for s in range(1024) if any(_compare(kind, s, v) for v in values)}
        return True


def _sql_value(column: str, value: Any) -> Any:
    if column == "db_timestamp":
        if not isinstance(value, datetime):
            raise TypeError(value)
        # Spark hands timestamps over as naive datetimes in UTC (the source's session time zone is UTC)
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if column in ("slice", "seq_nr", "revision"):
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
    """One slice range of a read, ``lo..hi``, with the statement its task runs (``(sql, params)`` from the
    store, built on the driver); ``None`` when every range was filtered out. ``dsn``: where its rows are read
    (the range's database, or its standby)."""

    def __init__(self, index: int, lo: int, hi: int, query: tuple[str, dict[str, Any]] | None, dsn: str) -> None:
        super().__init__(index)
        self.lo, self.hi, self.query, self.dsn = lo, hi, query, dsn

    def __repr__(self) -> str:
        return f"RangePartition({self.lo}-{self.hi})"


def read_partition(options: SourceOptions, converter: ArrowRows, partition: InputPartition
                   ) -> Iterator[pa.RecordBatch]:
    """A task's rows: its partition's statement through :func:`spark.arrow.stream_rows`."""
    if not isinstance(partition, RangePartition) or partition.query is None:
        return iter(())  # every range was filtered out: Spark still runs one (empty) partition
    sql, params = partition.query
    return stream_rows(partition.dsn, sql, params, converter, options.batch_rows)


class JournalBatchReader(DataSourceReader):
    """Reads each slice range below one horizon settled at planning time; decodes with ``serializers``
    (see :func:`reading_registry`)."""

    def __init__(self, options: SourceOptions, schema: StructType, serializers: SerializerRegistry | None = None
                 ) -> None:
        self.options = options
        self.columns = read_columns(schema, options.table)
        planned = plan_databases(options, serializers)  # fail at planning, before any task runs
        close_planned(planned)
        self.converter = ArrowRows(schema, self.columns, planned[0].journal.serializers)
        #: Each database's DSN, its slice ranges of the read and its store (one unless sharded).
        self.databases = [(database.dsn, database.ranges, database.store) for database in planned]
        self.pushed = PushedFilters(planned[0].store)

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for flt in filters:
            if not self.pushed.push(flt):
                yield flt

    def partitions(self) -> list[InputPartition]:
        """One partition per slice range left by the pushed filters; each database's below its own horizon."""
        partitions: list[InputPartition] = []
        for dsn, ranges, store in self.databases:
            kept = [(lo, hi) for lo, hi in ranges if self.pushed.slices & set(range(lo, hi + 1))]
            if not kept:
                continue
            with self.options.open_journal_at(dsn) as journal, journal.read_connection() as conn:
                bound = horizon_tracker(journal, self.options.table).final_bound(conn)
            if self.options.until is not None:
                bound = min(bound, self.options.until)
            partitions += [RangePartition(len(partitions) + i, lo, hi, store.rows_below(
                self.columns.read, lo, hi, bound, entity_type=self.options.entity_type, since=self.options.since,
                pushed=self.pushed.conditions), self.options.read_dsn(dsn))
                for i, (lo, hi) in enumerate(kept)]
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.converter, partition)
