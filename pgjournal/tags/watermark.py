"""What readers of the tag view wait for: the batched tag writers' watermark (:mod:`pgjournal.write.tag_batcher`
writes it). ``events_by_tag`` reads no further than :func:`complete_before_step`, the oldest ``complete_before``
of the running writers, so it never passes an event whose tag rows a writer still owes; a current tag query
first flushes the journal's own writer, and :func:`flushed_before_reading` keeps a failed flush from failing the
read. Readers never write (the reader role may only SELECT)."""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import TYPE_CHECKING

from pgjournal.errors import TagFlushFailed
from pgjournal.model.printable import printable_logger
from pgjournal.runtime.steps import Step, statement
from pgjournal.store import tags as store

if TYPE_CHECKING:
    from pgjournal.settings import Settings

#: The batched writer's logger: a silent writer is reported where its own reports are.
log = printable_logger("pgjournal.write.tag_batcher")


def complete_before_step(settings: Settings) -> Step[datetime | None]:
    """For readers: the time before which every batched writer's tag rows are written (None: no batched
    writer). A writer silent for ``tag_writer_timeout`` holds it back until it is recovered; it is logged once."""
    rows = yield statement(store.watermark(settings.tag_writer_timeout))
    mark = rows[0]
    for name in mark.silent or ():
        if name not in _warned:
            _warned.add(name)
            log.warning("batched tag writer %s has been silent for more than tag_writer_timeout (%g s): "
                        "events_by_tag waits for its tag rows; a running batched writer recovers them, or run "
                        "`pgjournal tags recover`", name, settings.tag_writer_timeout)
    return mark.complete_before  # type: ignore[no-any-return]


_warned: set[str] = set()


def flushed_before_reading() -> contextlib.AbstractContextManager[None]:
    """Around the flush a current tag query makes before it reads (read-your-writes in the process): a flush
    that fails (logged and counted already) does not fail the read; the watermark keeps it from passing the
    events whose rows are still pending."""
    return contextlib.suppress(TagFlushFailed)
