"""Tagged appends: the journal rows and their tag view rows in ONE statement, so one transaction.

Guarantee: a tagged event is in ``tag_views`` exactly when it is in ``event_journal`` (no batched tag
writer, no recovery pass). The append statement of :mod:`pgjournal.write.event_writer` is extended with data-modifying
CTEs: ``ins`` inserts the journal rows, ``tv`` one ``tag_views`` row per (event, tag), ``progress`` upserts
``tag_write_progress``. ``tag_pid_sequence_nr`` continues from ``tag_write_progress`` read in the same
statement; two appends racing on one persistence id clash on ``event_journal``'s primary key, so the loser's
whole statement (tag rows and progress included) rolls back and is retried or reported as a conflict.

TimeUUIDs come from the writer's clock (:mod:`pgjournal.model.timeuuid`), one per event, shared by its tags,
raised in the statement above the persistence id's previous one (the SQL: :mod:`pgjournal.store.tags`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from pgjournal.buckets import BucketSize, check_bucket_size, ensure_bucket_size
from pgjournal.model.timeuuid import GENERATOR
from pgjournal.runtime.steps import run
from pgjournal.store.events import text_array
from pgjournal.store.tags import one_tagged_event_sql, tagged_insert_sql
from pgjournal.tags.writer_mode import ensure_mode_step

if TYPE_CHECKING:
    from pgjournal.server.face import Configured, Connected

_bucket_sizes: weakref.WeakKeyDictionary[Configured, BucketSize] = weakref.WeakKeyDictionary()


def bucket_size(journal: Connected, *, record: bool = True) -> BucketSize:
    """The journal's bucket size, checked against the one recorded in the database; a writer (``record``)
    records it when none is. A reader records nothing: reading an empty tag view fixes no size."""
    size = _bucket_sizes.get(journal)
    if size is not None:
        return size
    if not record:
        with journal.connection() as conn:
            check_bucket_size(conn, journal.settings.tag_bucket_size)
        return BucketSize.parse(journal.settings.tag_bucket_size)

    def ensure() -> BucketSize:
        # Writers starting together insert the same settings rows: under SERIALIZABLE all but one fail 40001.
        with journal.connection() as conn:
            recorded = ensure_bucket_size(conn, journal.settings.tag_bucket_size)
            run(ensure_mode_step(journal.settings.batched_tags), conn)
            return recorded

    size = _bucket_sizes[journal] = journal.settings.retry_policy.run(ensure, journal.dialect.retryable_sqlstates)
    return size


def record_bucket_size(journal: Configured) -> Callable[[psycopg.Connection], None] | None:
    """Until a tagged append of ``journal`` committed: what records the bucket size in the append's
    transaction (so an append that fails records nothing); ``None`` after that."""
    if journal in _bucket_sizes:
        return None

    def record(conn: psycopg.Connection) -> None:
        ensure_bucket_size(conn, journal.settings.tag_bucket_size)
        run(ensure_mode_step(journal.settings.batched_tags), conn)

    return record


def bucket_size_recorded(journal: Configured) -> None:
    """A tagged append of ``journal`` committed, so its bucket size is recorded."""
    _bucket_sizes[journal] = BucketSize.parse(journal.settings.tag_bucket_size)


def stamp_time(params: dict[str, Any]) -> None:
    """The writer's clock for the events' TimeUUIDs, read right before the statement runs (each attempt): a
    reading taken before a wait for the persistence id's turn, a pool connection or a retry's pause could
    lag behind the horizon readers already passed. The statement raises it above the persistence id's last
    TimeUUID when needed."""
    params["tv_time"] = GENERATOR.next_ticks(params["tv_count"])


def statement_key(after: str, single: bool, tags: int, meta: bool) -> tuple[Any, ...]:
    """What a tagged statement depends on besides its table, for a writer's cache of them: its shape, and this
    process's TimeUUID low bytes written into it (new after a fork)."""
    return after, single, 2 if tags == 1 else 3, meta, GENERATOR.lsb_bytes


def prepare(journal: Configured, params: dict[str, Any], tags: tuple[str, ...], count: int, *,
            after_latest: bool = False, after: str | None = None, statement: str | None = None) -> str:
    """Add the tag parameters to ``params`` (built by the writer) and return the tagged statement
    (``statement``: the one this function returned for an append of the same shape, which it returns again). The
    bucket size is the journal's setting, checked against the recorded one when the journal opened; the writer
    records it with the first tagged append (:func:`record_bucket_size`)."""
    params["tv_count"] = count
    stamp_time(params)  # the write path stamps again right before each attempt
    if len(tags) == 1:
        params["tv_tag"] = tags[0]
    else:
        params["tv_tags"] = text_array(sorted(tags))  # sorted: racing appends lock progress rows in one order
    if statement is not None:
        return statement
    size = _bucket_sizes.get(journal) or BucketSize.parse(journal.settings.tag_bucket_size)
    table = journal.events.table(params["slice"])
    if len(tags) == 1 and count == 1:  # the common tagged append: its own leaner statement
        return one_tagged_event_sql(table, after=after or ("latest" if after_latest else "expected"),
                                    meta=params.get("meta_payload") is not None, bucket_ms=size.millis,
                                    lsb=GENERATOR.lsb, lsb_bytes=GENERATOR.lsb_bytes, **journal.events.payload_sql)
    return tagged_insert_sql(table, after_latest=after_latest, after=after, single=count == 1,
                             one_tag=len(tags) == 1, bucket_ms=size.millis, lsb=GENERATOR.lsb,
                             lsb_bytes=GENERATOR.lsb_bytes, **journal.events.payload_sql)
