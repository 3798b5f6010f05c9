"""Filter pushdown of a ``format("pgjournal")`` batch read: the filters on ``entity_type``, ``slice``,
``persistence_id``, ``db_timestamp`` and ``seq_nr`` / ``revision`` that the store can write as SQL conditions
(:meth:`pgjournal.store.export.ExportSQL.condition`), and the slices they leave, so that slice filters drop
whole partitions. PySpark's Python Data Source API has no pushdown for stream readers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgjournal.store.export import ExportSQL

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter

#: Spark setting that must be on for pushFilters to be called (else Spark refuses the reader).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


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
