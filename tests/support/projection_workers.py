"""What the projection worker tests share (tests/projections/test_projections_workers.py, tests/shards/):
the environment and stop of worker subprocesses, writers appending to hashed entities until stopped (to a
``Journal`` or a ``ShardedJournal``), and the audit check that two workers never processed one slice in
overlapping leases."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def worker_env(settings: dict[str, Any], **extra: str) -> dict[str, str]:
    """A worker subprocess's environment: ``support`` and this checkout importable, ``settings`` as
    ``PGJOURNAL_<NAME>``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT), env.get("PYTHONPATH", "")])
    for key, value in settings.items():
        env[f"PGJOURNAL_{key.upper()}"] = str(value)
    env.update(extra)
    return env


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM (workers release their leases), then SIGKILL what did not exit within 30 s."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


class Writers:
    """Threads appending to a fixed set of entities until stopped; with ``red_every=n``, one append in n (at
    random) tagged ``red``."""

    def __init__(self, journal: Any, entity_type: str, entities: int, threads: int = 3, red_every: int = 0) -> None:
        self.journal, self.entity_type, self.entities = journal, entity_type, entities
        self.red_every = red_every
        self.stop = threading.Event()
        self.count = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, index: int) -> None:
        rng = random.Random(index)
        while not self.stop.is_set():
            # Hashed ids: "e1", "e2", ... would land in neighbouring slices and leave most ranges empty.
            pid = f"{self.entity_type}|{hashlib.sha1(str(rng.randrange(self.entities)).encode()).hexdigest()[:12]}"
            tags = ["red"] if self.red_every and rng.randrange(self.red_every) == 0 else []
            self.journal.append(pid, [{"n": k} for k in range(rng.randint(1, 3))], tags=tags)
            self.count += 1
            time.sleep(0.005)  # the scenario: writers' pace

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def check_no_overlap(dsn: str) -> int:
    """Per slice, in clock order, epochs never go back and one epoch belongs to one owner. Returns rows."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT slice, at, epoch, owner FROM projection_audit ORDER BY slice, at").fetchall()
    last: dict[int, int] = {}
    owners: dict[tuple[int, int], str] = {}
    for slice_, at, epoch, owner in rows:
        assert epoch >= last.get(slice_, 0), f"slice {slice_}: epoch {epoch} of {owner} at {at} after a later one"
        last[slice_] = epoch
        assert owners.setdefault((slice_, epoch), owner) == owner, f"slice {slice_} epoch {epoch} has two owners"
    return len(rows)
