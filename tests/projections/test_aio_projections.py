"""The asyncio projection runner (``projections.aio``) mirrors the blocking one: exactly-once and grouped
handlers (coroutines writing on the unit's AsyncConnection, in its transaction) keep a read model equal to
the journal across restarts and rescaling, with writers running; at-least-once; failures retried, then stop,
skip or dead-letter; and the offsets are shared with the blocking runner (either continues the other)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from support import FAST
from support.projection_handlers import FAST_PROJECTION
from test_projections import Flaky, stored_seq_nrs

from pgjournal import Journal, ProjectionFailed, slice_ranges
from pgjournal.aio import AsyncJournal
from pgjournal.model.envelope import EventEnvelope
from pgjournal.projections.aio import AsyncRangeRunner, run_range_async
from pgjournal.projections.dead_letters import list_dead_letters
from pgjournal.projections.examples import counter_mismatches, counter_writer, ensure_counter_table
from pgjournal.projections.handlers import AtLeastOnce, ExactlyOnce, Grouped, Handler, Projection, ProjectionSettings
from pgjournal.projections.runner import run_range


async def run_until(journal: AsyncJournal, projection: Projection, ranges: Sequence[tuple[int, int]],
                    done: Callable[[], bool], timeout: float = 20.0) -> list[AsyncRangeRunner]:
    runners = [run_range_async(journal, projection, lo, hi) for lo, hi in ranges]
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not (await asyncio.to_thread(done)) and not any(r.failed or not r.alive for r in runners):
                    await asyncio.sleep(0.05)
    finally:
        for r in runners:
            r.stop()
        for r in runners:
            await r.join(timeout=30)
    return runners


async def append_many(journal: AsyncJournal, entity_type: str, entities: int, events: int, start: int = 0) -> None:
    for i in range(entities):
        await journal.append(f"{entity_type}|e{i}", [{"n": start + k} for k in range(events)])


@pytest.fixture
def sync(dsn: str) -> Any:
    with Journal.open(dsn, **FAST) as opened:
        ensure_counter_table(opened)
        yield opened


@pytest.mark.parametrize("grouped", [False, True], ids=["exactly-once", "grouped"])
async def test_read_model_equals_journal_across_restarts(dsn: str, sync: Journal, grouped: bool) -> None:
    projection = Projection("counts", "Cart", counter_writer("counts", grouped=grouped, max_count=7, max_wait=0.05,
                                                             asynchronous=True), FAST_PROJECTION)
    async with AsyncJournal.open(dsn, **FAST) as journal:
        await append_many(journal, "Cart", 20, 5)
        caught_up = lambda: not counter_mismatches(sync, "counts", "Cart")  # noqa: E731
        runners = await run_until(journal, projection, slice_ranges(2), caught_up)
        assert sum(r.stats.handled for r in runners) == 100
        await append_many(journal, "Cart", 25, 3)
        runners = await run_until(journal, projection, slice_ranges(4), caught_up)
        assert counter_mismatches(sync, "counts", "Cart") == []
        assert sum(r.stats.handled for r in runners) == 75  # the old events were read again and dropped
        assert sum(r.stats.duplicates for r in runners) >= 100


async def test_rescale_with_writers_running_and_the_blocking_runner_continuing(dsn: str, sync: Journal) -> None:
    projection = Projection("scaled", "Acct", counter_writer("scaled", max_count=50, max_wait=0.05,
                                                             asynchronous=True), FAST_PROJECTION)
    async with AsyncJournal.open(dsn, **FAST) as journal:
        stop = asyncio.Event()

        async def write() -> int:
            i = 0
            while not stop.is_set():
                await journal.append(f"Acct|w{i % 40}", [{"i": i}])
                i += 1
                await asyncio.sleep(0.005)
            return i

        writer = asyncio.create_task(write())
        handled = 0
        for n in (4, 8, 2):
            runners = await run_until(journal, projection, slice_ranges(n), lambda: False, timeout=1.5)
            assert not any(r.failed for r in runners)
            handled += sum(r.stats.handled for r in runners)
        stop.set()
        assert await writer > 0
    # The blocking runner continues from the asyncio runner's offsets: nothing lost, nothing twice.
    blocking_projection = Projection("scaled", "Acct", counter_writer("scaled", max_count=50, max_wait=0.05),
                                     FAST_PROJECTION)
    runners = [run_range(sync, blocking_projection, lo, hi) for lo, hi in slice_ranges(2)]
    try:
        for _ in range(400):
            if not counter_mismatches(sync, "scaled", "Acct"):
                break
            await asyncio.sleep(0.05)
    finally:
        for r in runners:
            r.stop()
            r.join(30)
    assert counter_mismatches(sync, "scaled", "Acct") == []
    with sync.connection() as conn:
        total = conn.execute("SELECT count(*) FROM event_journal WHERE entity_type = 'Acct'").fetchone()[0]
    assert handled + sum(r.stats.handled for r in runners) == total


class AsyncFlaky(Flaky):
    """:class:`test_projections.Flaky` with coroutine handlers."""

    def handler(self, mode: str) -> Handler:
        if mode == "exactly-once":
            async def one(conn: Any, env: EventEnvelope) -> None:
                await conn.execute("SELECT 1")  # the unit's connection, inside its transaction
                self.check(env)
                self.handled.append((env.persistence_id, env.seq_nr))
            return ExactlyOnce(one)
        if mode == "grouped":
            async def many(_conn: Any, envs: Sequence[EventEnvelope]) -> None:
                for env in envs:
                    self.check(env)
                self.handled.extend((e.persistence_id, e.seq_nr) for e in envs)
            return Grouped(many, max_count=10, max_wait=0.05)

        async def each(env: EventEnvelope) -> None:
            await asyncio.sleep(0)
            self.check(env)
            self.handled.append((env.persistence_id, env.seq_nr))
        return AtLeastOnce(each, save_every=3, save_interval=0.1)


MODES = ["exactly-once", "grouped", "at-least-once"]


@pytest.mark.parametrize("mode", MODES)
async def test_handler_failure_is_retried_with_backoff(dsn: str, mode: str) -> None:
    async with AsyncJournal.open(dsn, **FAST) as journal:
        await append_many(journal, "Cart", 3, 4)
        flaky = AsyncFlaky("Cart|e1", 3, failures=2)
        settings = ProjectionSettings(attempts=3, backoff=0.05, management_interval=0.2)
        await run_until(journal, Projection("retry", "Cart", flaky.handler(mode), settings), [(0, 1023)],
                        lambda: len(set(flaky.handled)) == 12)
        assert flaky.calls >= 3
        assert sorted(set(flaky.handled)) == sorted((f"Cart|e{i}", s) for i in range(3) for s in range(1, 5))


@pytest.mark.parametrize("mode", MODES)
async def test_handler_failure_stops_and_the_offset_stays_before_the_event(dsn: str, sync: Journal, mode: str
                                                                           ) -> None:
    async with AsyncJournal.open(dsn, **FAST) as journal:
        await append_many(journal, "Cart", 1, 6)
        flaky = AsyncFlaky("Cart|e0", 3, failures=None)
        projection = Projection("failing", "Cart", flaky.handler(mode),
                                ProjectionSettings(attempts=2, backoff=0.01, management_interval=0.2))
        [runner] = await run_until(journal, projection, [(0, 1023)], lambda: False, timeout=3)
        assert isinstance(runner.failed, ProjectionFailed)
        assert (runner.failed.persistence_id, runner.failed.seq_nr) == ("Cart|e0", 3)
        assert stored_seq_nrs(sync, "failing").get("Cart|e0", 0) <= 2
        flaky.failures = 0
        flaky.handled.clear()
        await run_until(journal, projection, [(0, 1023)], lambda: ("Cart|e0", 6) in flaky.handled)
        assert [s for _, s in flaky.handled] == [3, 4, 5, 6]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("on_failure", ["skip", "dead-letter"])
async def test_skip_and_dead_letter(dsn: str, sync: Journal, mode: str, on_failure: str) -> None:
    async with AsyncJournal.open(dsn, **FAST) as journal:
        await append_many(journal, "Cart", 2, 5)
        flaky = AsyncFlaky("Cart|e1", 2, failures=None)
        settings = ProjectionSettings(attempts=2, backoff=0.01, on_failure=on_failure,  # type: ignore[arg-type]
                                      management_interval=0.2)
        name = f"give-up-{on_failure}"
        [runner] = await run_until(journal, Projection(name, "Cart", flaky.handler(mode), settings), [(0, 1023)],
                                   lambda: len(set(flaky.handled)) == 9)
        assert runner.failed is None
        assert sorted(set(flaky.handled)) == sorted({(f"Cart|e{i}", s) for i in range(2) for s in range(1, 6)}
                                                    - {("Cart|e1", 2)})
        if on_failure == "skip":
            assert runner.stats.skipped == 1
        else:
            assert runner.stats.dead_lettered == 1
            [letter] = list_dead_letters(sync, name)
            assert (letter.persistence_id, letter.seq_nr) == ("Cart|e1", 2) and "boom" in letter.error
