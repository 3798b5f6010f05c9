"""Projections over a journal sharded by slice range (docs/sharding.md): a range runs on the journal of the one
database holding its slices, so its offsets, leases and the handler's transaction are in that database."""

from __future__ import annotations

from typing import Any, TypeVar

from pgjournal.model.slices import check_slice_range
from pgjournal.shards import AsyncShardedJournal, ShardedJournal

J = TypeVar("J")


def range_journal(journal: J, min_slice: int, max_slice: int) -> Any:
    """The journal a projection of ``min_slice..max_slice`` runs on: a sharded journal's (blocking or asyncio)
    journal of the database holding the range (a range across databases is
    :class:`~pgjournal.errors.InvalidArgument`, naming the databases' ranges); any other journal as given."""
    check_slice_range(min_slice, max_slice)
    if isinstance(journal, ShardedJournal | AsyncShardedJournal):
        return journal.journal_for_slices(min_slice, max_slice)
    return journal
