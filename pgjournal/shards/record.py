"""Reading and writing the layout record of each database (docs/sharding.md, section 3), as steps, so the
blocking and asyncio faces share them."""

from __future__ import annotations

from collections.abc import Sequence

from pgjournal.errors import ShardLayoutMismatch
from pgjournal.runtime.steps import Step, first_of, statement
from pgjournal.shards.layout import Layout, Record, ShardSettings, format_range
from pgjournal.store import shard_layout as sql


def read_record_step() -> Step[Record | None]:
    """The database's record; ``None`` when it has none (never migrated as a shard)."""
    if not (yield from first_of(sql.layout_table_exists())):
        return None
    row = yield from first_of(sql.layout_record())
    if row is None:
        return None
    return Record(Layout.parse(row.version, row.layout), row.database_id, row.state)


def write_first_record_step(layout: Layout, index: int) -> Step[Record | None]:
    """Record ``layout`` in the database holding ``layout.members[index]`` unless it has a record; the record
    it holds afterwards (the caller checks it is this one)."""
    yield statement(sql.create_layout_table())
    yield statement(sql.record_first_layout(layout.version, layout.text(), layout.members[index][1]))
    return (yield from read_record_step())


def first_layout(settings: ShardSettings, records: Sequence[Record | None]) -> Layout:
    """The layout to record where records are missing: the one recorded elsewhere when a first recording was
    interrupted (its ids kept), else version 1 with new ids. A recorded layout other than the settings' is
    :class:`ShardLayoutMismatch` (changing a layout is a move, not a migration)."""
    present = [record.layout for record in records if record is not None]
    if not present:
        return Layout.new(settings)
    layout = present[0]
    if any(other != layout for other in present) or layout.ranges != settings.ranges:
        shown = "; ".join(f"{settings.where(i)}: version {r.layout.version} "
                          f"({', '.join(map(format_range, r.layout.ranges))})"
                          for i, r in enumerate(records) if r is not None)
        raise ShardLayoutMismatch(
            f"the databases record another shard layout than the settings' "
            f"({', '.join(map(format_range, settings.ranges))}): {shown}; migrate does not change a layout")
    return layout
