"""``spark.readStream.format("pgjournal")``: the journal as a Structured Streaming source.

The offset is a JSON map from slice range (``"0-127"``) to a :class:`~pgjournal.offsets.TimestampOffset`
string: the ``db_timestamp`` of the last event delivered in that range and, in ``seen``, every persistence id
delivered *at exactly that timestamp* with its highest sequence number. A micro-batch reads, per range, the
rows after its start offset and up to and including its end offset in ``(db_timestamp, seq_nr,
persistence_id)`` order: events sharing a timestamp are told apart by ``seen``, so a batch cut between two of
them (``maxEventsPerTrigger``) delivers the rest in the next one and none twice.

``latestOffset`` never passes the visibility horizon (a :class:`~pgjournal.horizon.HorizonTracker` kept by
the reader for the life of the query): every row it admits is committed and visible, and no transaction
still open can add a row at or below it. So re-reading a micro-batch after a restart from the checkpoint
gives the same rows, and a checkpointed sink gets every event exactly once.

Offsets are per slice range, so a checkpoint is tied to the query's ``sliceRanges``: a restart with other
ranges raises :class:`SliceRangesChanged` naming both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgjournal.errors import ConfigurationError, InvalidArgument
from pgjournal.offsets import TimestampOffset

from .source import (
    SELECT_LIST,
    ArrowRows,
    RangePartition,
    SourceOptions,
    check_entity_type_known,
    describe_ranges,
    stream_rows,
)

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

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_SEEN = ("COALESCE((SELECT s.seq FROM unnest(%({p}_pids)s::text[], %({p}_seqs)s::bigint[]) AS s(pid, seq) "
         "WHERE s.pid = persistence_id), 0)")
#: After the start offset (exclusive): later timestamps, or the same one for what ``seen`` does not cover.
AFTER_START = (f"db_timestamp >= %(from_ts)s AND NOT (db_timestamp = %(from_ts)s AND seq_nr <= "
               f"{_SEEN.format(p='from')})")
#: Up to the end offset (inclusive): earlier timestamps, or the same one for what ``seen`` covers.
UP_TO_END = (f"db_timestamp <= %(to_ts)s AND NOT (db_timestamp = %(to_ts)s AND seq_nr > "
             f"{_SEEN.format(p='to')})")
RANGE = "slice BETWEEN %(lo)s AND %(hi)s AND NOT deleted"
ENTITY = " AND entity_type = %(entity_type)s"


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


def _offset_params(prefix: str, offset: TimestampOffset) -> dict[str, Any]:
    return {f"{prefix}_ts": offset.timestamp, f"{prefix}_pids": list(offset.seen),
            f"{prefix}_seqs": list(offset.seen.values())}


class JournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the journal per slice range, bounded by the visibility horizon."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.converter = ArrowRows(schema)
        self.keys = [_key(lo, hi) for lo, hi in options.ranges]
        self._journal: Journal | None = None
        self._tracker: Any = None
        #: Trigger.AvailableNow: the offset the query stops at (taken when it starts).
        self._cap: dict[str, str] | None = None
        with self._connection() as conn:  # fail before any task: unreachable, unmigrated, unknown type
            check_entity_type_known(conn, options.entity_type, options.dsn)
        self._starting: dict[str, str] | None = None
        if options.starting_offsets.startswith("{"):
            self._starting = self.check_offset(_json_offset(options.starting_offsets))

    def __getstate__(self) -> dict[str, Any]:
        # Tasks get a copy for read(): no connection pool, no horizon readings.
        return {**self.__dict__, "_journal": None, "_tracker": None}

    # -- driver side ---------------------------------------------------------------------------------

    def _connection(self) -> Any:
        if self._journal is None:
            self._journal = self.options.open_journal()
            self._tracker = self._journal.horizon_tracker()
        return self._journal.connection()

    def check_offset(self, offset: Mapping[str, Any]) -> dict[str, str]:
        """``offset`` parsed and normalised; raise :class:`SliceRangesChanged` for other ranges."""
        if not isinstance(offset, Mapping) or not all(isinstance(v, str) for v in offset.values()):
            raise InvalidArgument(f"a pgjournal stream offset maps slice ranges to timestamp offsets, "
                                  f"got {offset!r}")
        if sorted(offset) != sorted(self.keys):
            ranges = sorted(offset, key=lambda k: int(k.split("-")[0]) if k.split("-")[0].isdigit() else -1)
            raise SliceRangesChanged(f"{len(ranges)} ({','.join(ranges)})",
                                     f"{len(self.keys)} ({describe_ranges(self.options.ranges)})")
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
        with self._connection() as conn:
            assert self._journal is not None
            bound = self._tracker.final_bound(conn, settle=False)
            if isinstance(limit, ReadMaxRows):
                ends = self._limited(conn, starts, caps, bound, limit.max_rows)
            else:
                ends = {k: self._newest(conn, k, lo, hi, starts[k], caps[k] if caps else None, bound)
                        for k, (lo, hi) in zip(self.keys, self.options.ranges, strict=True)}
        return {k: str(ends[k]) for k in self.keys}

    def _where(self, lo: int, hi: int, start: TimestampOffset, cap: TimestampOffset | None, bound: datetime
               ) -> tuple[str, dict[str, Any]]:
        where = f"{RANGE}{ENTITY if self.options.entity_type is not None else ''} AND {AFTER_START} " \
                "AND db_timestamp < %(bound)s"
        params = {"lo": lo, "hi": hi, "entity_type": self.options.entity_type, "bound": bound,
                  **_offset_params("from", start)}
        if cap is not None:
            where += f" AND {UP_TO_END}"
            params.update(_offset_params("to", cap))
        return where, params

    def _newest(self, conn: psycopg.Connection, key: str, lo: int, hi: int, start: TimestampOffset,
                cap: TimestampOffset | None, bound: datetime) -> TimestampOffset:
        """Everything committed after ``start``: the newest timestamp and every pid at it."""
        where, params = self._where(lo, hi, start, cap, bound)
        row = conn.execute(_statement("SELECT max(db_timestamp)", where), params, prepare=False).fetchone()
        newest = row[0] if row else None
        if newest is None:
            return start
        seen = dict(start.seen) if newest == start.timestamp else {}
        rows = conn.execute(_statement("SELECT persistence_id, max(seq_nr)", where,
                                       "AND db_timestamp = %(newest)s GROUP BY persistence_id"),
                            {**params, "newest": newest}, prepare=False).fetchall()
        for pid, seq_nr in rows:
            seen[pid] = max(seq_nr, seen.get(pid, 0))
        return TimestampOffset(newest, seen=seen)

    def _limited(self, conn: psycopg.Connection, starts: dict[str, TimestampOffset],
                 caps: dict[str, TimestampOffset] | None, bound: datetime, limit: int) -> dict[str, TimestampOffset]:
        """The first ``limit`` events after the starts, over all ranges in (db_timestamp, seq_nr, pid) order."""
        keyed: list[tuple[datetime, int, str, str]] = []
        for key, (lo, hi) in zip(self.keys, self.options.ranges, strict=True):
            where, params = self._where(lo, hi, starts[key], caps[key] if caps else None, bound)
            rows = conn.execute(_statement("SELECT db_timestamp, seq_nr, persistence_id", where,
                                           "ORDER BY db_timestamp, seq_nr, persistence_id LIMIT %(limit)s"),
                                {**params, "limit": limit}, prepare=False).fetchall()
            keyed.extend((ts, seq_nr, pid, key) for ts, seq_nr, pid in rows)
        keyed.sort()
        ends = dict(starts)
        for ts, seq_nr, pid, key in keyed[:limit]:
            current = ends[key]
            seen = dict(current.seen) if ts == current.timestamp else {}
            seen[pid] = max(seq_nr, seen.get(pid, 0))
            ends[key] = TimestampOffset(ts, seen=seen)
        return ends

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[InputPartition]:
        starts, ends = self.check_offset(start), self.check_offset(end)
        return [RangePartition(i, lo, hi, start=starts[k], end=ends[k])
                for i, (k, (lo, hi)) in enumerate(zip(self.keys, self.options.ranges, strict=True))
                if starts[k] != ends[k]]

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to release: offsets live in Spark's checkpoint."""

    def stop(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    # -- tasks ---------------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition) and partition.start and partition.end
        start, end = TimestampOffset.parse(partition.start), TimestampOffset.parse(partition.end)
        where = f"{RANGE}{ENTITY if self.options.entity_type is not None else ''} AND {AFTER_START} AND {UP_TO_END}"
        params = {"lo": partition.lo, "hi": partition.hi, "entity_type": self.options.entity_type,
                  **_offset_params("from", start), **_offset_params("to", end)}
        return stream_rows(self.options.dsn, _statement(f"SELECT {SELECT_LIST}", where), params,
                           self.converter, self.options.batch_rows)


def _json_offset(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"option startingOffsets is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"option startingOffsets must be a JSON object of slice range -> offset, "
                              f"got {text[:200]!r}")
    return value


def _statement(select: str, where: str, tail: str = "") -> str:
    """A statement over the journal from the module's constant fragments (values always go as parameters)."""
    return f"{select} FROM event_journal WHERE {where} {tail}".rstrip()
