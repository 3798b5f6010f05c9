"""Read ``event_journal`` into a DataFrame through Spark's JDBC source, one partition per slice range.

Each slice range becomes one JDBC query (``slice BETWEEN a AND b ...``). On PostgreSQL ``event_journal``
is partitioned by slice range (see :mod:`pgjournal.dialects.postgres`), so a range reads only its own
partitions instead of the whole heap. Spark's JDBC source takes predicates as SQL text, not bound
parameters: every value placed in them is validated here and quoted by psycopg's literal quoting.

A journal sharded by slice range over several databases (``shards=``, or ``$PGJOURNAL_SHARDS`` when no DSN is
given; docs/sharding.md) is read as one frame whose partitions are each database's ranges, read in parallel
from that database: the ranges are cut at the databases' boundaries, and the databases must record the layout.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from itertools import pairwise
from typing import TYPE_CHECKING

from psycopg import sql

from pgjournal.admin.stored_format import StoredFormat, read_stored_format
from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.errors import ConfigurationError, InvalidArgument
from pgjournal.model.offsets import parse_timestamp
from pgjournal.model.slices import check_slice_range
from pgjournal.model.slices import slice_ranges as split_slices
from pgjournal.server.connections import connect
from pgjournal.server.dsn import mask_dsn, resolve_dsn
from pgjournal.shards.layout import SHARDS_ENV, ShardSettings
from pgjournal.validation import MAX_NAME_LENGTH

from . import scram
from .arrow import KEY_COLUMN
from .decode import REDACTED, PayloadDecoder, decoding_function, texts_function
from .jdbc import JdbcTarget, jdbc_target
from .shipping import shipped

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: The columns ``read_events`` returns (then ``event``, the decoded payload, and ``redacted`` when decoding).
EVENT_COLUMNS = ("slice", "entity_type", "persistence_id", "seq_nr", "db_timestamp", "writer", "tags",
                 "event_ser_id", "event_ser_manifest", "event_payload")
#: What decoding reads: ``(ser_id, manifest, payload)``.
SERIALIZED = ("event_ser_id", "event_ser_manifest", "event_payload")
DEFAULT_FETCH_SIZE = 10_000

SliceRanges = int | Sequence[tuple[int, int]]
Shards = ShardSettings | Mapping[str, str] | Sequence[str]


def resolve_shards(dsn: str | None, shards: Shards | None) -> ShardSettings | None:
    """The databases of a sharded read: ``shards`` (settings, ``{"0-511": dsn, ...}`` or a list of DSNs), else
    ``$PGJOURNAL_SHARDS`` when ``dsn`` is not given either; ``None``: one database."""
    if shards is not None:
        if dsn is not None:
            raise InvalidArgument("give a dsn (one database) or shards (a sharded journal), not both")
        return shards if isinstance(shards, ShardSettings) else ShardSettings.of(shards)
    if dsn is None and os.environ.get(SHARDS_ENV, "").strip():
        return ShardSettings.from_env()
    return None


def check_recorded_layout(shards: ShardSettings, *, portable: bool | None = None) -> None:
    """Every database answers and records ``shards``' layout, as
    :meth:`ShardedJournal.open <pgjournal.shards.ShardedJournal.open>` checks it (else its typed error)."""
    from pgjournal.shards import ShardedJournal

    ShardedJournal.open(shards, portable=portable, notify=False, pool_min_size=1, pool_max_size=1).close()


def ranges_by_database(shards: ShardSettings, ranges: Sequence[tuple[int, int]]
                       ) -> list[tuple[str, tuple[tuple[int, int], ...]]]:
    """Each database holding some of ``ranges``, with those ranges cut at its boundaries."""
    held = []
    for (first, last), dsn in zip(shards.ranges, shards.dsns, strict=True):
        cut = tuple(sub for lo, hi in ranges for sub in shards.ranges_within(lo, hi) if first <= sub[0] <= last)
        if cut:
            held.append((dsn, cut))
    return held


def resolve_slice_ranges(slice_ranges: SliceRanges) -> list[tuple[int, int]]:
    """``4`` -> four equal ranges; a list of ``(min, max)`` pairs is checked (in range, not overlapping)."""
    if isinstance(slice_ranges, int) and not isinstance(slice_ranges, bool):
        return split_slices(slice_ranges)
    if isinstance(slice_ranges, str | bytes) or not isinstance(slice_ranges, Sequence) or not slice_ranges:
        raise InvalidArgument(f"slice_ranges must be a divisor of 1024 or a non-empty list of (min_slice, "
                              f"max_slice) pairs, got {slice_ranges!r}")
    ranges: list[tuple[int, int]] = []
    for item in slice_ranges:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise InvalidArgument(f"slice range must be a (min_slice, max_slice) pair, got {item!r}")
        check_slice_range(item[0], item[1])
        ranges.append((item[0], item[1]))
    ordered = sorted(ranges)
    for (_, hi), (lo, _) in pairwise(ordered):
        if lo <= hi:
            raise InvalidArgument(f"slice ranges overlap at slice {lo}: {slice_ranges!r}")
    return ranges


def time_bound(value: datetime | str | None, what: str) -> datetime | None:
    """A timezone-aware datetime (or ISO 8601 text with a zone) as UTC; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_timestamp(value, what)
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidArgument(f"{what} must be a timezone-aware datetime or ISO 8601 text, got {value!r}")
    return value.astimezone(UTC)


def literal(value: object) -> str:
    """``value`` as an SQL literal (psycopg's quoting; timestamps cast to ``timestamptz``)."""
    if isinstance(value, datetime):
        return f"{sql.Literal(value.isoformat()).as_string()}::timestamptz"
    return sql.Literal(value).as_string()


def check_entity_type(entity_type: str | None) -> str | None:
    if entity_type is None:
        return None
    if not isinstance(entity_type, str) or not entity_type or len(entity_type) > MAX_NAME_LENGTH or (
        "\x00" in entity_type
    ):
        raise InvalidArgument(f"entity_type must be a non-empty string of at most {MAX_NAME_LENGTH} characters "
                              f"without NUL, got {entity_type!r}")
    return entity_type


def table_name(table: str) -> str:
    """Quote ``table`` or ``schema.table`` as identifiers, so a name cannot carry SQL."""
    parts = table.split(".") if isinstance(table, str) else []
    if not 1 <= len(parts) <= 2 or not all(parts) or any(len(p) > 63 or "\x00" in p for p in parts):
        raise InvalidArgument(f"table must be a name like event_journal or akka.event_journal, got {table!r}")
    return sql.Identifier(*parts).as_string()


def predicates(
    ranges: Sequence[tuple[int, int]],
    *,
    entity_type: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    lower_bounds: Sequence[datetime | None] | None = None,
    include_deleted: bool = False,
) -> list[str]:
    """One WHERE clause per slice range; ``lower_bounds[i]`` (inclusive) overrides ``since`` for range i."""
    common = [] if include_deleted else ["NOT deleted"]
    if entity_type is not None:
        common.append(f"entity_type = {literal(entity_type)}")
    if until is not None:
        common.append(f"db_timestamp < {literal(until)}")
    clauses = []
    for i, (lo, hi) in enumerate(ranges):
        parts = [f"slice BETWEEN {int(lo)} AND {int(hi)}", *common]
        lower = lower_bounds[i] if lower_bounds is not None else since
        if lower is not None:
            parts.append(f"db_timestamp >= {literal(lower)}")
        clauses.append(" AND ".join(parts))
    return clauses


def jdbc_frame(
    spark: SparkSession,
    target: JdbcTarget,
    table: str,
    where: Sequence[str],
    *,
    fetch_size: int = DEFAULT_FETCH_SIZE,
) -> DataFrame:
    """The raw journal rows: one JDBC partition per clause in ``where``, the columns of :data:`EVENT_COLUMNS`."""
    from pyspark.sql import functions as F

    if isinstance(fetch_size, bool) or not isinstance(fetch_size, int) or fetch_size < 1:
        raise InvalidArgument(f"fetch_size must be a positive integer, got {fetch_size!r}")
    properties = {**target.properties, "fetchsize": str(fetch_size)}
    quoted = table_name(table)
    try:
        frame = spark.read.jdbc(target.url, quoted, predicates=list(where), properties=properties)
    except Exception as exc:  # py4j / pyspark wrap the driver's error: keep its message, drop the Java trace
        raise ConfigurationError(f"cannot read table {table!r} at {target.url}: {jdbc_error(exc)}") from None
    missing = [c for c in EVENT_COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigurationError(f"table {table!r} lacks column(s) {', '.join(missing)}: expected the "
                                 "event_journal layout of pgjournal / Akka Persistence R2DBC")
    empty_tags = F.array().cast("array<string>")
    # A JSONB payload column (Akka's payload-column-type = JSONB) arrives as text: as bytes (its UTF-8 JSON)
    # the frame has the same schema whichever type the column has.
    text_payload = dict(frame.dtypes).get("event_payload") == "string"

    def column(name: str) -> Column:
        if name == "tags":
            return F.coalesce(F.col("tags"), empty_tags).alias("tags")
        if name == "event_payload" and text_payload:
            return F.col(name).cast("binary").alias(name)
        return F.col(name)

    return frame.select(*[column(c) for c in EVENT_COLUMNS])


def jdbc_error(exc: BaseException) -> str:
    """The PostgreSQL driver's message inside a Spark/py4j error (first line, password masked)."""
    text = _driver_message(exc) or str(exc)
    for marker in ("PSQLException: ", "SQLException: ", "ConnectException: "):
        if marker in text:
            text = text.split(marker, 1)[1]
            break
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return mask_dsn(lines[0] if lines else type(exc).__name__)


def _driver_message(exc: BaseException) -> str | None:
    """The message of the driver's exception among the causes of the JVM's (Spark 4 wraps a failed connection
    as ``FAILED_JDBC.CONNECTION`` "Couldn't connect to the database", which says neither where nor why)."""
    cause = getattr(exc, "_origin", None)  # pyspark's CapturedException: the Java throwable, through py4j
    try:
        for _ in range(20):
            if cause is None:
                return None
            if str(cause.getClass().getName()).startswith("org.postgresql."):
                return f"PSQLException: {cause.getMessage()}"
            cause = cause.getCause()
    except Exception:  # not a py4j object, or the gateway is gone: the Python text will do
        return None
    return None


def stored_format(dsn: str | None) -> StoredFormat:
    """The database's payload markers (:mod:`pgjournal.admin.stored_format`), read once through psycopg."""
    with connect(resolve_dsn(dsn), doing="read the stored format of") as conn:
        return read_stored_format(conn)


def payload_decoder(serializers: SerializerRegistry | None, stored: StoredFormat | None) -> PayloadDecoder:
    """The decoder of a read: ``serializers`` (default: a plain registry) as the database ``stored`` says."""
    if serializers is not None and not isinstance(serializers, SerializerRegistry):
        raise InvalidArgument(f"serializers must be a pgjournal SerializerRegistry, got {type(serializers).__name__}")
    registry = serializers if serializers is not None else SerializerRegistry()
    return PayloadDecoder(registry.for_stored_format(stored or StoredFormat()))


def _payload_columns() -> list[Column]:
    from pyspark.sql import functions as F

    return [F.col(c) for c in (*SERIALIZED, KEY_COLUMN)]


def infer_payload_schema(frame: DataFrame, decoder: PayloadDecoder, *, sampling_ratio: float = 1.0,
                         serializers: SerializerRegistry | None = None) -> StructType:
    """The schema Spark's JSON reader infers over the payloads of ``frame`` that ``decoder`` decodes to JSON
    objects (one pass over the rows; ``serializers``: the registry inside ``decoder``, sent to the workers)."""
    from pyspark.sql.functions import arrow_udf  # type: ignore[attr-defined]  # exported by name only

    if not isinstance(sampling_ratio, int | float) or not 0 < sampling_ratio <= 1:
        raise InvalidArgument(f"sampling_ratio must be in (0, 1], got {sampling_ratio!r}")
    with shipped(serializers, "the payload decoding UDF"):
        texts = frame.select(arrow_udf(texts_function(decoder), "string")(*_payload_columns()).alias("value"))
    return frame.sparkSession.read.option("samplingRatio", sampling_ratio).json(
        texts.where("value IS NOT NULL")).schema


def decode_payloads(frame: DataFrame, payload_schema: StructType | str | None = None, *,
                    sampling_ratio: float = 1.0, serializers: SerializerRegistry | None = None,
                    stored: StoredFormat | None = None) -> DataFrame:
    """Add ``event`` and ``redacted``: the payload decoded by ``serializers`` (the journal's registry; default
    a plain one) as the native source decodes it (:mod:`spark.decode`), as a struct of ``payload_schema`` (a
    StructType or DDL text like ``"item STRING, qty INT"``), or of the schema inferred from the payloads when
    ``None``; ``redacted`` is true where the payload's key is gone (crypto-shredded).

    ``stored``: the database's stored format (:func:`stored_format`: the legacy JSON-33 marker). A payload that
    does not decode to a JSON object, or does not fit, gives a null ``event``. When no payload decodes to an
    object to infer from, nothing is added (Parquet cannot store an empty struct).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.functions import arrow_udf  # type: ignore[attr-defined]  # exported by name only
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import BooleanType, StructField, StructType

    decoder = payload_decoder(serializers, stored)
    if payload_schema is None:
        schema = infer_payload_schema(frame, decoder, sampling_ratio=sampling_ratio, serializers=serializers)
    elif isinstance(payload_schema, StructType):
        schema = payload_schema
    elif isinstance(payload_schema, str):
        try:
            parsed = StructType.fromDDL(payload_schema)
        except Exception as exc:  # pyspark raises its own parse errors
            raise InvalidArgument(f"payload_schema {payload_schema!r} is not a Spark DDL schema like "
                                  f"'item STRING, qty INT': {str(exc).splitlines()[0]}") from None
        if not isinstance(parsed, StructType):
            raise InvalidArgument(f"payload_schema {payload_schema!r} is a {parsed.simpleString()}, not a struct "
                                  "of fields like 'item STRING, qty INT'")
        schema = parsed
    else:
        raise InvalidArgument(f"payload_schema must be a StructType, DDL text or None, got {payload_schema!r}")
    if not schema.fields:
        return frame
    both = StructType([StructField("event", schema), StructField(REDACTED, BooleanType(), False)])
    with shipped(serializers, "the payload decoding UDF"):
        decode = arrow_udf(decoding_function(decoder, to_arrow_type(schema, timezone="UTC"), "event"), both)
        decoded = frame.withColumn("_decoded", decode(*_payload_columns()))
    return decoded.select(*[F.col(c) for c in frame.columns], F.col("_decoded.event").alias("event"),
                          F.col(f"_decoded.{REDACTED}").alias(REDACTED))


def read_events(
    spark: SparkSession,
    dsn: str | None = None,
    entity_type: str | None = None,
    slice_ranges: SliceRanges = 4,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    payload_schema: StructType | str | None = None,
    *,
    decode: bool = True,
    table: str = "event_journal",
    include_deleted: bool = False,
    fetch_size: int = DEFAULT_FETCH_SIZE,
    sampling_ratio: float = 1.0,
    serializers: SerializerRegistry | None = None,
    shards: Shards | None = None,
) -> DataFrame:
    """The journal's events as a DataFrame with one partition per slice range.

    Columns: :data:`EVENT_COLUMNS` (``db_timestamp`` a timestamp, shown in UTC by sessions from
    :func:`spark.session.spark_session`; ``tags`` an ``array<string>``, empty when none) and, with ``decode``,
    ``event`` and ``redacted``: the payload decoded by ``serializers`` (the journal's registry) as a struct, as
    the native source decodes it (:func:`decode_payloads`). ``since`` is inclusive, ``until`` exclusive.
    ``table`` may name an Akka Persistence R2DBC journal (same columns). ``dsn`` ``None``: ``$PGJOURNAL_DSN``
    or the embedded server. ``shards``: the databases of a sharded journal (see the module docstring); one
    partition per slice range of each database, read from it.
    """
    ranges = resolve_slice_ranges(slice_ranges)
    lower, upper = time_bound(since, "since"), time_bound(until, "until")
    if lower is not None and upper is not None and lower >= upper:
        raise InvalidArgument(f"since ({lower.isoformat()}) must be earlier than until ({upper.isoformat()})")
    sharded = resolve_shards(dsn, shards)
    if sharded is not None:
        check_recorded_layout(sharded)
    databases = [(dsn, tuple(ranges))] if sharded is None else ranges_by_database(sharded, ranges)
    frames = [jdbc_frame(spark, jdbc_target(at, scram_plugin=scram.in_session(spark)), table,
                         predicates(held, entity_type=check_entity_type(entity_type), since=lower, until=upper,
                                    include_deleted=include_deleted), fetch_size=fetch_size)
              for at, held in databases]
    frame = functools.reduce(lambda left, right: left.union(right), frames)
    if not decode:
        return frame
    formats = [stored_format(at) for at, _ in databases]
    if any(f != formats[0] for f in formats):
        raise ConfigurationError("the databases of the sharded journal store payloads differently ("
                                 + "; ".join(f"{mask_dsn(str(at))}: {f}" for (at, _), f in zip(databases, formats,
                                                                                            strict=True))
                                 + "): read with decode=False, or decode each database's frame alone")
    return decode_payloads(frame, payload_schema, sampling_ratio=sampling_ratio, serializers=serializers,
                           stored=formats[0])
