"""SQL of bulk reads by slice range: what Spark's native source (``format("pgjournal")``) runs.

Two tables read alike, one row per event (``event_journal``) or per persistence id's latest state
(``durable_state``): a slice range's rows below a bound (a batch read), a range's rows between two stream
offsets (a micro-batch), the newest offset after a start (a stream's ``latestOffset``), and a payload sample
(to infer a schema). Each method returns ``(sql, params)`` and runs nothing. A stream offset is a
:class:`~pgjournal.model.offsets.TimestampOffset`: rows after it are those at later timestamps, or at its timestamp
with a number (``seq_nr`` / ``revision``) above what its ``seen`` map holds for their persistence id.

The select list is the caller's choice of columns (column pruning): a read that does not ask for the payload
does not read it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgjournal.errors import InvalidArgument
from pgjournal.store.durable_state import DELETED_SER_ID
from pgjournal.store.events import read_payload

if TYPE_CHECKING:
    from pgjournal.model.offsets import TimestampOffset
    from pgjournal.store.tables import Slicing

Query = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class BulkTable:
    """A table as bulk reads see it: its output columns in order and how each is selected."""

    name: str
    #: The per-persistence-id number that orders rows at one timestamp (``seq_nr``, ``revision``).
    number: str
    #: Output column -> select expression (``None``: the column itself).
    columns: dict[str, str | None]
    #: ``(ser_id, manifest, payload)`` columns: what decoding a payload needs.
    serialized: tuple[str, str, str]
    #: A condition every row read must meet (``None``: every row).
    live: str | None = None


EVENTS = BulkTable(
    "event_journal", "seq_nr",
    {"slice": None, "entity_type": None, "persistence_id": None, "seq_nr": None, "db_timestamp": None,
     "writer": None, "tags": "COALESCE(tags, '{}') AS tags", "event_ser_id": None, "event_ser_manifest": None,
     "event_payload": None},
    ("event_ser_id", "event_ser_manifest", "event_payload"), live="NOT deleted")
STATES = BulkTable(
    "durable_state", "revision",
    {"slice": None, "entity_type": None, "persistence_id": None, "revision": None, "db_timestamp": None,
     "tags": "COALESCE(tags, '{}') AS tags", "state_ser_id": None, "state_ser_manifest": None,
     "state_payload": None, "deleted": f"(state_ser_id = {DELETED_SER_ID}) AS deleted"},
    ("state_ser_id", "state_ser_manifest", "state_payload"))
TABLES = {t.name: t for t in (EVENTS, STATES)}

_SEEN = ("COALESCE((SELECT s.seq FROM unnest(%({p}_pids)s::text[], %({p}_seqs)s::bigint[]) AS s(pid, seq) "
         "WHERE s.pid = persistence_id), 0)")
#: After a start offset (exclusive): later timestamps, or the same one for what its ``seen`` does not cover.
AFTER_START = ("db_timestamp >= %(from_ts)s AND NOT (db_timestamp = %(from_ts)s AND {number} <= "
               f"{_SEEN.format(p='from')})")
#: Up to an end offset (inclusive): earlier timestamps, or the same one for what its ``seen`` covers.
UP_TO_END = f"db_timestamp <= %(to_ts)s AND NOT (db_timestamp = %(to_ts)s AND {{number}} > {_SEEN.format(p='to')})"

#: Columns whose filters become SQL (pushdown), with the SQL type of their values; plus the table's number.
PUSHABLE = {"entity_type": "varchar", "slice": "int", "persistence_id": "varchar", "db_timestamp": "timestamptz"}
COMPARISONS = {"EqualTo": "=", "GreaterThan": ">", "GreaterThanOrEqual": ">=", "LessThan": "<",
               "LessThanOrEqual": "<=", "In": "= ANY"}


def offset_params(prefix: str, offset: TimestampOffset) -> dict[str, Any]:
    """An offset as the parameters of :data:`AFTER_START` (``from``) or :data:`UP_TO_END` (``to``)."""
    return {f"{prefix}_ts": offset.timestamp, f"{prefix}_pids": list(offset.seen),
            f"{prefix}_seqs": list(offset.seen.values())}


class ExportSQL:
    """Bulk reads of one table (:data:`EVENTS` or :data:`STATES`) in one dialect; ``jsonb``: the payload
    columns that are JSONB (Akka's option), read back as their JSON text's bytes."""

    def __init__(self, dialect: Slicing, table: str = EVENTS.name, jsonb: frozenset[str] = frozenset()) -> None:
        if table not in TABLES:
            raise InvalidArgument(f"bulk reads know the tables {', '.join(TABLES)}, got {table!r}")
        self._dialect = dialect
        self.table = TABLES[table]
        #: A tag filter: only rows carrying any of these tags (``None``: every row; see :meth:`with_tags`).
        self.tags: tuple[str, ...] | None = None
        self._select = {name: expr or (read_payload(name, True) if name in jsonb else name)
                        for name, expr in self.table.columns.items()}

    @property
    def pushable(self) -> dict[str, str]:
        """Columns whose comparisons :meth:`condition` turns into SQL, with their SQL types."""
        return {**PUSHABLE, self.table.number: "bigint"}

    def select_list(self, columns: Sequence[str]) -> str:
        unknown = [c for c in columns if c not in self._select]
        if unknown or not columns:
            raise InvalidArgument(f"{self.table.name} has the columns {', '.join(self._select)}, got "
                                  f"{', '.join(columns) or 'none'}")
        return ", ".join(self._select[c] for c in columns)

    def with_tags(self, tags: tuple[str, ...] | None) -> ExportSQL:
        """These reads of only the rows carrying any of ``tags`` (``None``: every row). Every read, a stream's
        offsets included, is of the filtered rows: a stream's next offset is its newest tagged row, and the next
        micro-batch starts after it (on ``event_journal``, through the tagged events' index)."""
        filtered = copy.copy(self)
        filtered.tags = tags
        return filtered

    def _base(self, lo: int, hi: int, entity_type: str | None) -> tuple[list[str], dict[str, Any]]:
        slices, params = self._dialect.slice_condition(lo, hi)
        conditions = [slices]
        if self.table.live:
            conditions.append(self.table.live)
        if self.tags is not None:
            conditions.append("tags && %(tags)s::text[]")
            params["tags"] = list(self.tags)
        if entity_type is not None:
            conditions.append("entity_type = %(entity_type)s")
            params["entity_type"] = entity_type
        return conditions, params

    def _statement(self, select: str, conditions: list[str], tail: str = "") -> str:
        return f"SELECT {select} FROM {self.table.name} WHERE {' AND '.join(conditions)} {tail}".rstrip()

    # -- batch -----------------------------------------------------------------------------------------

    def rows_below(self, columns: Sequence[str], lo: int, hi: int, until: datetime, *,
                   entity_type: str | None = None, since: datetime | None = None,
                   pushed: Sequence[Query] = ()) -> Query:
        """``columns`` of the rows of slices ``lo..hi`` with ``db_timestamp`` in ``[since, until)``, also
        meeting the ``pushed`` conditions (from :meth:`condition`)."""
        conditions, params = self._base(lo, hi, entity_type)
        conditions.append("db_timestamp < %(until)s")
        params["until"] = until
        if since is not None:
            conditions.append("db_timestamp >= %(since)s")
            params["since"] = since
        for sql, values in pushed:
            conditions.append(sql)
            params.update(values)
        return self._statement(self.select_list(columns), conditions), params

    def condition(self, column: str, kind: str, values: Sequence[Any], name: str) -> Query | None:
        """``column <kind> values`` as a condition with placeholder ``name`` (``None``: not pushable here).
        ``kind`` is a Spark filter's name (``EqualTo``, ``GreaterThan``, ..., ``In``)."""
        sql_type = self.pushable.get(column)
        if sql_type is None or kind not in COMPARISONS or not values:
            return None
        if kind == "In":
            return f"{column} = ANY(%({name})s::{sql_type}[])", {name: list(values)}
        return f"{column} {COMPARISONS[kind]} %({name})s::{sql_type}", {name: values[0]}

    # -- streams ---------------------------------------------------------------------------------------

    def _after(self, lo: int, hi: int, entity_type: str | None, start: TimestampOffset,
               end: TimestampOffset | None, bound: datetime | None) -> tuple[list[str], dict[str, Any]]:
        conditions, params = self._base(lo, hi, entity_type)
        conditions.append(AFTER_START.format(number=self.table.number))
        params.update(offset_params("from", start))
        if end is not None:
            conditions.append(UP_TO_END.format(number=self.table.number))
            params.update(offset_params("to", end))
        if bound is not None:
            conditions.append("db_timestamp < %(bound)s")
            params["bound"] = bound
        return conditions, params

    def rows_between(self, columns: Sequence[str], lo: int, hi: int, start: TimestampOffset, end: TimestampOffset,
                     *, entity_type: str | None = None) -> Query:
        """``columns`` of the rows of slices ``lo..hi`` after ``start`` and up to ``end`` (a micro-batch)."""
        conditions, params = self._after(lo, hi, entity_type, start, end, None)
        return self._statement(self.select_list(columns), conditions), params

    def newest_after(self, lo: int, hi: int, start: TimestampOffset, bound: datetime, *,
                     entity_type: str | None = None, cap: TimestampOffset | None = None) -> Query:
        """One row: the newest ``db_timestamp`` after ``start``, below ``bound`` (and up to ``cap``)."""
        conditions, params = self._after(lo, hi, entity_type, start, cap, bound)
        return self._statement("max(db_timestamp)", conditions), params

    def numbers_at(self, lo: int, hi: int, start: TimestampOffset, bound: datetime, at: datetime, *,
                   entity_type: str | None = None, cap: TimestampOffset | None = None) -> Query:
        """``(persistence_id, highest number)`` of the rows after ``start`` at timestamp ``at``."""
        conditions, params = self._after(lo, hi, entity_type, start, cap, bound)
        conditions.append("db_timestamp = %(at)s")
        params["at"] = at
        return self._statement(f"persistence_id, max({self.table.number})", conditions,
                               "GROUP BY persistence_id"), params

    def first_after(self, lo: int, hi: int, start: TimestampOffset, bound: datetime, limit: int, *,
                    entity_type: str | None = None, cap: TimestampOffset | None = None) -> Query:
        """``(db_timestamp, number, persistence_id)`` of the first ``limit`` rows after ``start``, in order."""
        conditions, params = self._after(lo, hi, entity_type, start, cap, bound)
        params["limit"] = limit
        number = self.table.number
        return self._statement(f"db_timestamp, {number}, persistence_id", conditions,
                               f"ORDER BY db_timestamp, {number}, persistence_id LIMIT %(limit)s"), params

    # -- planning --------------------------------------------------------------------------------------

    def has_entity_type(self, entity_type: str) -> Query:
        """A row when ``entity_type`` has a row in the table."""
        return f"SELECT 1 FROM {self.table.name} WHERE entity_type = %(entity_type)s LIMIT 1", {
            "entity_type": entity_type}

    def entity_types(self, limit: int) -> Query:
        """The table's entity types, in order, at most ``limit``."""
        return f"SELECT DISTINCT entity_type FROM {self.table.name} ORDER BY 1 LIMIT %(limit)s", {"limit": limit}

    def payload_sample(self, entity_type: str | None, sample: int) -> Query:
        """``(ser_id, manifest, payload, persistence_id)`` of up to ``sample`` rows (of ``entity_type``, or of
        every type): what decoding a payload needs (an encrypted one is opened with its persistence id's key)."""
        conditions = [self.table.live or "TRUE",
                      "(%(entity_type)s::varchar IS NULL OR entity_type = %(entity_type)s)"]
        return self._statement(self.select_list((*self.table.serialized, "persistence_id")), conditions,
                               "LIMIT %(sample)s"), {
            "entity_type": entity_type, "sample": sample}
