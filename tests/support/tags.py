"""The tag path's settings and readers of its rows, shared by the tag view's tests and the batched writer's."""

from __future__ import annotations

import threading
from typing import Any

from pgjournal import Journal
from pgjournal.query.by_tag import TagEnvelope
from support.settings import FAST

# Minute buckets and short delays keep these tests quick; the semantics do not depend on the values.
TAGS: dict[str, Any] = dict(
    FAST,
    tag_bucket_size="Minute",
    tag_eventual_consistency_delay=0.05,
    tag_gap_timeout=1.0,
    tag_new_persistence_id_scan_timeout=0.1,
    tag_back_track_interval=0.1,
    tag_back_track_period=5.0,
    tag_back_track_long_interval=1.0,
)


#: The in-statement tag writer (tag rows in the append's statement), for tests about that path.
IN_STATEMENT: dict[str, Any] = dict(TAGS, tag_batch_writer=False)


def tags_written(journal: Any) -> None:
    """The tag rows of ``journal``'s (a Journal or a test Face) tagged appends written now: its batched tag writer
    flushes (the in-statement path wrote them with the appends)."""
    if journal.tag_writer is not None:
        journal.tag_writer.flush()


def tag_rows(journal: Journal, tag: str) -> list[tuple[str, int, int]]:
    with journal.connection() as conn:
        return conn.execute("SELECT persistence_id, sequence_nr, tag_pid_sequence_nr FROM tag_views "
                            "WHERE tag_name = %s ORDER BY persistence_id, sequence_nr", (tag,)).fetchall()


def progress(journal: Journal) -> dict[tuple[str, str], tuple[int, int]]:
    with journal.connection() as conn:
        rows = conn.execute("SELECT persistence_id, tag, sequence_nr, tag_pid_sequence_nr FROM tag_write_progress")
        return {(pid, tag): (seq, tseq) for pid, tag, seq, tseq in rows}


def collect(stream: Any, count: int, timeout: float = 15.0) -> list[TagEnvelope]:
    """``count`` envelopes from a live query (closing it from a timer if they do not come)."""
    timer = threading.Timer(timeout, stream.close)
    timer.start()
    try:
        out = []
        for env in stream:
            out.append(env)
            if len(out) == count:
                break
        return out
    finally:
        timer.cancel()
