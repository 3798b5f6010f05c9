"""``spark.readStream.format("pgjournal")``: the journal (or, with ``table=durable_state``, the changes of
durable state) as a Structured Streaming source.

The offset is a JSON map from slice range (``"0-127"``) to a :class:`~pgjournal.model.offsets.TimestampOffset`
string: the ``db_timestamp`` of the last event delivered in that range and, in ``seen``, every persistence id
delivered *at exactly that timestamp* with its highest sequence number. A micro-batch reads, per range, the
rows after its start offset and up to and including its end offset in ``(db_timestamp, seq_nr,
persistence_id)`` order: events sharing a timestamp are told apart by ``seen``, so a batch cut between two of
them (``maxEventsPerTrigger``) delivers the rest in the next one and none twice.

``latestOffset`` never passes the visibility horizon (a :class:`~pgjournal.core.horizon.HorizonTracker` kept by
the reader for the life of the query): every row it admits is committed and visible, and no transaction
still open can add a row at or below it. So re-reading a micro-batch after a restart from the checkpoint
gives the same rows, and a checkpointed sink gets every event exactly once.

Durable state is read alike, with the revision in place of the sequence number: a micro-batch delivers each
persistence id's latest revision in it, and a state overwritten before its micro-batch ran is delivered once,
at its newer revision, in a later one (the changes semantics of ``changes_by_slices``).

Offsets are per slice range, so a checkpoint is tied to the query's ``sliceRanges``: a restart with other
ranges raises :class:`SliceRangesChanged` naming both. Of a sharded journal (option ``shards``), the ranges are
``sliceRanges`` cut at the databases' boundaries, each read from its database below that database's horizon.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgjournal.errors import ConfigurationError, InvalidArgument
from pgjournal.model.offsets import TimestampOffset

from .arrow import ArrowRows
from .batch import RangePartition, read_partition
from .options import SourceOptions, describe_ranges
from .planning import horizon_tracker, plan_databases
from .schema import read_columns

try:
    from pyspark.sql.datasource import DataSourceStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - pgjournal without the spark extra
    DataSourceStreamReader = SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyspark.sql.datasource import InputPartition
    from pyspark.sql.types import StructType

    from pgjournal import Journal
    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.store.export import ExportSQL

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class SliceRangesChanged(ConfigurationError):
    """A checkpoint's offsets are for other slice ranges than the query's ``sliceRanges`` option."""

    def __init__(self, checkpoint: str, option: str) -> None:
        self.checkpoint, self.option = checkpoint, option
        super().__init__(
            f"the checkpoint's offsets are for slice ranges {checkpoint} but option sliceRanges gives {option}: "
            "a checkpoint keeps one offset per slice range, so its ranges cannot change. Restart with the "
            "checkpoint's sliceRanges, or start a new checkpoint (startingOffsets to say where)")


def _key(lo: int, hi: int) -> str:
    return f"{lo}-{hi}"


@dataclass
class _Database:
    """One database of a stream (the one, or each of a sharded journal's), on the driver: its DSN, the stream's
    slice ranges it holds, its store, and its journal and horizon tracker (opened again after pickling)."""

    dsn: str
    ranges: tuple[tuple[int, int], ...]
    store: ExportSQL
    journal: Journal | None = None
    tracker: Any = None

    def connection(self, options: SourceOptions) -> Any:
        if self.journal is None:
            self.journal = options.open_journal_at(self.dsn)
            self.tracker = horizon_tracker(self.journal, options.table)
        return self.journal.read_connection()  # the standby, when the read has one: the bound is fenced there

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
            self.journal = None


class JournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the journal per slice range, bounded by the visibility horizon; decodes with
    ``serializers`` (see :func:`spark.options.reading_registry`). Of a sharded journal, each database's ranges
    (``sliceRanges`` cut at the databases' boundaries) are bounded by that database's own horizon and read from it."""

    def __init__(self, options: SourceOptions, schema: StructType, serializers: SerializerRegistry | None = None
                 ) -> None:
        self.options = options
        self.columns = read_columns(schema, options.table)
        #: Trigger.AvailableNow: the offset the query stops at (taken when it starts).
        self._cap: dict[str, str] | None = None
        # fail before any task: unreachable, unmigrated, unknown type; the planning journals are kept
        planned = plan_databases(options, serializers)
        self._databases = [_Database(d.dsn, d.ranges, d.store, d.journal, horizon_tracker(d.journal, options.table))
                           for d in planned]
        self.converter = ArrowRows(schema, self.columns, planned[0].journal.serializers)
        self.ranges = [r for database in self._databases for r in database.ranges]
        self.keys = [_key(lo, hi) for lo, hi in self.ranges]
        self._starting: dict[str, str] | None = None
        if options.starting_offsets.startswith("{"):
            self._starting = self.check_offset(_json_offset(options.starting_offsets))

    def __getstate__(self) -> dict[str, Any]:
        # Tasks get a copy for read(): no connection pool, no horizon readings.
        return {**self.__dict__, "_databases": [replace(d, journal=None, tracker=None) for d in self._databases]}

    # -- driver side ---------------------------------------------------------------------------------

    def _keyed(self, database: _Database) -> list[tuple[str, int, int]]:
        return [(_key(lo, hi), lo, hi) for lo, hi in database.ranges]

    def check_offset(self, offset: Mapping[str, Any]) -> dict[str, str]:
        """``offset`` parsed and normalised; raise :class:`SliceRangesChanged` for other ranges."""
        if not isinstance(offset, Mapping) or not all(isinstance(v, str) for v in offset.values()):
            raise InvalidArgument(f"a pgjournal stream offset maps slice ranges to timestamp offsets, "
                                  f"got {offset!r}")
        if sorted(offset) != sorted(self.keys):
            ranges = sorted(offset, key=lambda k: int(k.split("-")[0]) if k.split("-")[0].isdigit() else -1)
            raise SliceRangesChanged(f"{len(ranges)} ({','.join(ranges)})",
                                     f"{len(self.keys)} ({describe_ranges(self.ranges)})")
        return {k: str(TimestampOffset.parse(offset[k])) for k in self.keys}

    def initialOffset(self) -> dict[str, str]:
        if self._starting is not None:
            return dict(self._starting)
        earliest = {k: str(TimestampOffset(EPOCH)) for k in self.keys}
        if self.options.starting_offsets == "latest":
            return self.latestOffset(earliest, ReadAllAvailable())
        return earliest

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_events is not None:
            return ReadMaxRows(self.options.max_events)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an ``availableNow`` run: what is committed now, micro-batched by the read limit."""
        starts = {k: str(TimestampOffset(EPOCH)) for k in self.keys}
        self._cap = None
        self._cap = self.latestOffset(starts, ReadAllAvailable())

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        starts = {k: TimestampOffset.parse(v) for k, v in self.check_offset(start).items()}
        caps = {k: TimestampOffset.parse(v) for k, v in self._cap.items()} if self._cap is not None else None
        ends: dict[str, TimestampOffset] = {}
        keyed: list[tuple[datetime, int, str, str]] = []  # with a row limit: the first rows of every range
        for database in self._databases:
            with database.connection(self.options) as conn:
                bound = database.tracker.final_bound(conn, settle=False)
                for key, lo, hi in self._keyed(database):
                    cap = caps[key] if caps else None
                    if isinstance(limit, ReadMaxRows):
                        keyed += [(ts, number, pid, key) for ts, number, pid in conn.execute(
                            *database.store.first_after(lo, hi, starts[key], bound, limit.max_rows,
                                                        entity_type=self.options.entity_type, cap=cap),
                            prepare=False).fetchall()]
                    else:
                        ends[key] = self._newest(conn, database.store, lo, hi, starts[key], cap, bound)
        if isinstance(limit, ReadMaxRows):
            ends = self._limited(starts, keyed, limit.max_rows)
        return {k: str(ends[k]) for k in self.keys}

    def _newest(self, conn: psycopg.Connection, store: ExportSQL, lo: int, hi: int, start: TimestampOffset,
                cap: TimestampOffset | None, bound: datetime) -> TimestampOffset:
        """Everything committed after ``start``: the newest timestamp and every pid at it."""
        entity_type = self.options.entity_type
        row = conn.execute(*store.newest_after(lo, hi, start, bound, entity_type=entity_type, cap=cap),
                           prepare=False).fetchone()
        newest = row[0] if row else None
        if newest is None:
            return start
        # An offset's position (what was consumed at one timestamp), not the gate's rule (each pid once, in order).
        seen = dict(start.seen) if newest == start.timestamp else {}
        rows = conn.execute(*store.numbers_at(lo, hi, start, bound, newest, entity_type=entity_type, cap=cap),
                            prepare=False).fetchall()
        for pid, number in rows:
            seen[pid] = max(number, seen.get(pid, 0))
        return TimestampOffset(newest, seen=seen)

    @staticmethod
    def _limited(starts: dict[str, TimestampOffset], keyed: list[tuple[datetime, int, str, str]], limit: int
                 ) -> dict[str, TimestampOffset]:
        """The first ``limit`` of the ranges' first rows (``keyed``) in (db_timestamp, number, pid) order."""
        keyed.sort()
        ends = dict(starts)
        for ts, number, pid, key in keyed[:limit]:
            current = ends[key]
            # An offset's position (what was consumed at one timestamp), not the gate's rule (each pid once, in order).
            seen = dict(current.seen) if ts == current.timestamp else {}
            seen[pid] = max(number, seen.get(pid, 0))
            ends[key] = TimestampOffset(ts, seen=seen)
        return ends

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[InputPartition]:
        starts, ends = self.check_offset(start), self.check_offset(end)
        partitions: list[InputPartition] = []
        for database in self._databases:
            partitions += [RangePartition(len(partitions) + i, lo, hi, database.store.rows_between(
                               self.columns.read, lo, hi, TimestampOffset.parse(starts[k]),
                               TimestampOffset.parse(ends[k]), entity_type=self.options.entity_type),
                               self.options.read_dsn(database.dsn))
                           for i, (k, lo, hi) in enumerate(
                               (k, lo, hi) for k, lo, hi in self._keyed(database) if starts[k] != ends[k])]
        return partitions

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to release: offsets live in Spark's checkpoint."""

    def stop(self) -> None:
        for database in self._databases:
            database.close()

    # -- tasks ---------------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.converter, partition)


def _json_offset(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"option startingOffsets is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"option startingOffsets must be a JSON object of slice range -> offset, "
                              f"got {text[:200]!r}")
    return value
