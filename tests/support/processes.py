"""Results from worker processes that put one item each on a multiprocessing queue."""

from __future__ import annotations

import queue
import time
from typing import Any


def collect(processes: list[Any], results: Any, what: str, timeout: float = 240) -> list[Any]:
    """One result per process; fails as soon as one exited with an error, or after ``timeout`` seconds."""
    collected: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(collected) < len(processes):
        try:
            collected.append(results.get(timeout=1))
        except queue.Empty:
            crashed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            assert not crashed, f"a {what} process failed with exit code {crashed[0]} (traceback above)"
            assert time.monotonic() < deadline, f"the {what} processes did not finish in time"
    return collected
