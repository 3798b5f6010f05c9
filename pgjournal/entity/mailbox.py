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
        self._mutex: Any = threading.Lock()
        self._boxes: dict[str, deque[Pending]] = {}

    def submit(self, key: str, item: Pending, run: RunBatch, max_batch: int) -> None:
        """Return once ``item`` is completed (by this thread or by the leader of the moment)."""
        box, lead = self._enqueue(key, item)
        while not lead:
            item.wake.wait()
            item.wake.clear()
            if item.completed:
                return
            lead = True  # handed leadership: our command is first in the queue
        batch = self._take(box, max_batch)
        try:
            run(key, batch)
        except BaseException as exc:
            self._fail(batch, exc)
        finally:
            self._hand_over(key, box, batch)

    # -- the rules, shared with AsyncMailboxes ----------------------------------------------------------

    def _enqueue(self, key: str, item: Pending) -> tuple[deque[Pending], bool]:
        """Queue ``item``; whether its caller leads (the entity was idle)."""
        with self._mutex:
            box = self._boxes.get(key)
            lead = box is None
            if box is None:
                box = self._boxes[key] = deque()
            box.append(item)
        return box, lead

    def _take(self, box: deque[Pending], max_batch: int) -> list[Pending]:
        """The leader's batch: the queued commands of the first one's repository, up to ``max_batch``."""
        with self._mutex:
            owner = box[0].owner
            batch: list[Pending] = []
            while box and len(batch) < max_batch and box[0].owner is owner:
                batch.append(box.popleft())
        return batch

    @staticmethod
    def _fail(batch: list[Pending], exc: BaseException) -> None:
        for item in batch:
            if not item.completed:
                item.fail(exc)
        if not isinstance(exc, Exception):
            raise exc

    def _hand_over(self, key: str, box: deque[Pending], batch: list[Pending]) -> None:
        """Wake the callers of ``batch`` and hand leadership to the next queued caller (or drop the queue)."""
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
