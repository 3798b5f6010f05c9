"""SQL over ``snapshot`` for by-slice reads (``events_by_slices_starting_from_snapshots``)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..dialects import Dialect

#: Columns of :func:`snapshots_by_slices` rows, in order.
SNAPSHOT_COLUMNS = ("slice, entity_type, persistence_id, seq_nr, db_timestamp, ser_id, ser_manifest, snapshot, tags, "
                    "meta_ser_id, meta_ser_manifest, meta_payload")


def snapshots_by_slices(dialect: Dialect, entity_type: str, min_slice: int, max_slice: int, since: datetime
                        ) -> tuple[str, dict[str, Any]]:
    """The snapshots of an entity type in a slice range taken at an event at or after ``since``, in time order
    (snapshot_slice_idx). A snapshot saved without its event's timestamp (NULL) cannot be placed in time and
    is left out: its persistence id's events are read in full instead."""
    slices, params = dialect.slice_condition(min_slice, max_slice)
    return (f"SELECT {SNAPSHOT_COLUMNS} FROM snapshot WHERE entity_type = %(entity_type)s AND {slices} "
            "AND db_timestamp >= %(since)s ORDER BY db_timestamp, persistence_id",
            {**params, "entity_type": entity_type, "since": since})
