"""Two processes (four threads each) hammering one entity: optimistic concurrency across processes loses no
update, and every decision was taken on the current state (the no-overdraft rule holds at every step)."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

from support import FAST
from support.processes import collect
from test_entities import Account, hammer, replay

from pgjournal import Journal
from pgjournal.entity import EntityRepository

THREADS = 4
COMMANDS = 40  # per thread


def worker(dsn: str, index: int, start: Any, results: Any) -> None:
    with Journal.open(dsn, **FAST) as journal:
        repo = EntityRepository(journal, Account, snapshot_every=10)
        outcomes: list[tuple[list[str], int]] = []
        threads = [threading.Thread(target=lambda s=index * 100 + t: outcomes.append(hammer(repo, "hot", COMMANDS, s)))
                   for t in range(THREADS)]
        start.wait()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results.put(([cid for ids, _ in outcomes for cid in ids], sum(r for _, r in outcomes),
                     len(outcomes) == THREADS, repo.status()["conflicts"]))


def test_two_processes_hammering_one_entity_lose_no_update(dsn: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    processes = [ctx.Process(target=worker, args=(dsn, i, start, results)) for i in range(2)]
    for process in processes:
        process.start()
    collected: list[Any] = collect(processes, results, "worker")
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    assert all(complete for _, _, complete, _ in collected), "a worker thread died (see its traceback above)"
    accepted = [cid for ids, _, _, _ in collected for cid in ids]
    rejected = sum(r for _, r, _, _ in collected)
    assert len(accepted) + rejected == 2 * THREADS * COMMANDS
    assert len(accepted) > 2 * COMMANDS  # both processes got plenty through
    assert sum(conflicts for *_, conflicts in collected) > 0  # they did race: optimistic concurrency decided
    with Journal.open(dsn, **FAST) as journal:
        state, events = replay(journal, "account|hot")  # checks: contiguous seq_nrs, never an overdraft
        assert sorted(e["id"] for e in events) == sorted(accepted)  # each accepted command once, no other
        assert state.operations == len(accepted)
        recovered = EntityRepository(journal, Account).load("hot")
        assert recovered.state == state and recovered.snapshot_seq_nr is not None
