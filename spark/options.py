"""The options of a ``format("pgjournal")`` read, checked without a database (:class:`SourceOptions`), and
the serializer registry a read decodes with (:func:`reading_registry`).

A journal sharded by slice range over several databases (docs/sharding.md) is read with option ``shards``
(``RANGE=DSN;RANGE=DSN``, the form of ``PGJOURNAL_SHARDS``, which is the default when neither ``dsn`` nor
``shards`` is given); option ``replica`` reads one database's rows on its hot standby. Option ``tags`` keeps
the rows carrying any of the tags, filtered by the database in every statement of a read (the tagged events'
index), a stream's offsets included.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.codec.transcoding import KEY_BYTES, Transcoder
from pgjournal.errors import ConfigurationError, InvalidArgument
from pgjournal.model.offsets import parse_timestamp
from pgjournal.model.slices import parse_slice_range
from pgjournal.server.dsn import check_dsn, resolve_dsn
from pgjournal.shards.layout import SHARDS_ENV, ShardSettings
from pgjournal.store.export import EVENTS, TABLES
from pgjournal.validation import check_tag_filter

from .decode import REDACTED
from .read import check_entity_type, check_recorded_layout, ranges_by_database, resolve_shards, resolve_slice_ranges
from .schema import COLUMN_TYPES, DECODED, FORMAT

if TYPE_CHECKING:
    from pgjournal import Journal

DEFAULT_SLICE_RANGES = 4
#: The ADBC driver hands over batches of about 16 MiB (~95k journal rows of ~100-byte payloads); slicing
#: them smaller only adds Arrow messages to the JVM.
DEFAULT_BATCH_ROWS = 100_000
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
    from pgjournal.state.keystore import PostgresKeyStore

    store = PostgresKeyStore.shared(options.key_store_dsn or options.dsn, master_key=options.master_key)
    return registry.with_transcoder(Transcoder(key_store=store))
