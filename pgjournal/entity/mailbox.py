"""Per-entity mailboxes: commands to one entity run one at a time, and those that queue up while an append
is in flight are decided together and written in one append (group commit).

The first caller for an idle entity becomes its *leader*: it takes the queued commands (up to
``max_batch``, all for the same repository), runs them, completes every caller, and hands leadership to the
next queued caller, if any. Nobody waits on a thread pool: the callers' own threads do the work.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Pending:
    """One caller's command, and where its outcome goes."""

    owner: Any  # the repository whose entity decides the command
    entity_id: str
    command: Any
    result: Any = None
    error: BaseException | None = None
    completed: bool = False
    wake: threading.Event = field(default_factory=threading.Event)

    def succeed(self, result: Any) -> None:
        self.result, self.completed = result, True

    def fail(self, error: BaseException) -> None:
        self.error, self.completed = error, True


RunBatch = Callable[[str, list[Pending]], None]


class Mailboxes:
    """Queues keyed by persistence id; an entry exists only while someone works on that entity."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._boxes: dict[str, deque[Pending]] = {}

    def submit(self, key: str, item: Pending, run: RunBatch, max_batch: int) -> None:
        """Return once ``item`` is completed (by this thread or by the leader of the moment)."""
        with self._mutex:
            box = self._boxes.get(key)
            lead = box is None
            if box is None:
                box = self._boxes[key] = deque()
            box.append(item)
        while not lead:
            item.wake.wait()
            item.wake.clear()
            if item.completed:
                return
            lead = True  # handed leadership: our command is first in the queue
        self._lead(key, box, run, max_batch)

    def _lead(self, key: str, box: deque[Pending], run: RunBatch, max_batch: int) -> None:
        with self._mutex:
            owner = box[0].owner
            batch: list[Pending] = []
            while box and len(batch) < max_batch and box[0].owner is owner:
                batch.append(box.popleft())
        try:
            run(key, batch)
        except BaseException as exc:
            for item in batch:
                if not item.completed:
                    item.fail(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            with self._mutex:
                successor = box[0] if box else None
                if successor is None:
                    del self._boxes[key]
            for item in batch:
                item.wake.set()
            if successor is not None:
                successor.wake.set()

    def __len__(self) -> int:
        return len(self._boxes)
