"""The asyncio entity repository (``AsyncEntityRepository``) where it differs from the blocking one: queued tasks
decided in order and written in one append, many tasks losing no update, conflicts and unknown outcomes injected
into the asyncio append, cancellation. Domain rules, stale caches, recovery and snapshots run on both faces in
test_entities.py (the ``face`` fixture)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.aio import SETTINGS, eventually
from test_entities import Account, Balance

from pgjournal import WriteOutcomeUnknown
from pgjournal.aio import AsyncJournal
from pgjournal.entity import AsyncEntityRepository, ConflictRetriesExhausted, DomainError


@pytest.fixture
async def aj(dsn: str) -> AsyncIterator[AsyncJournal]:
    async with AsyncJournal.open(dsn, **SETTINGS) as opened:
        yield opened


async def replay(journal: AsyncJournal, pid: str) -> tuple[Balance, list[dict[str, Any]]]:
    state, events = Balance(), []
    async for envelope in journal.query.current_events_by_persistence_id(pid):
        state = Account().apply(state, envelope.event)
        assert state.amount >= 0, f"overdraft at seq_nr {envelope.seq_nr}: a decision used a stale state"
        events.append(envelope.event)
    return state, events


async def test_queued_commands_are_decided_in_order_and_written_in_one_append(aj: AsyncJournal) -> None:
    gate, entered = asyncio.Event(), asyncio.Event()

    class Gated(Account):
        def handle(self, state: Balance, command: Any) -> Any:
            if command[0] == "bug":
                raise RuntimeError("a bug in one handler")
            return super().handle(state, command)

    repo = AsyncEntityRepository(aj, Gated)
    real_append = aj.append

    async def gated_append(*args: Any, **kwargs: Any) -> Any:  # the first append waits: the others queue
        entered.set()
        await gate.wait()
        return await real_append(*args, **kwargs)

    aj.append = gated_append  # type: ignore[method-assign]
    first = asyncio.create_task(repo.handle("a", ("deposit", 5, "g")))
    await entered.wait()
    queued = [("deposit", 1, "d1"), ("withdraw", 7, "w-refused"), ("bug", 1, "b"), ("withdraw", 6, "w"),
              ("deposit", 2, "d2")]
    tasks = [asyncio.create_task(repo.handle("a", command)) for command in queued]
    await asyncio.sleep(0.05)  # every task queued behind the first (the loop ran them up to their wait)
    aj.append = real_append  # type: ignore[method-assign]
    gate.set()
    outcomes = dict(zip(["g", *(c[2] for c in queued)], await asyncio.gather(first, *tasks, return_exceptions=True),
                        strict=True))
    assert isinstance(outcomes["w-refused"], DomainError) and isinstance(outcomes["b"], RuntimeError)
    assert [(outcomes[c].seq_nr, outcomes[c].state.amount) for c in ("g", "d1", "w", "d2")] == \
        [(1, 5), (2, 6), (3, 0), (4, 2)]
    assert repo.status()["batched"] == 5
    stored = [e async for e in aj.query.current_events_by_persistence_id("account|a")]
    assert [e.event["id"] for e in stored] == ["g", "d1", "w", "d2"]
    assert len({e.db_timestamp for e in stored[1:]}) == 1  # one append


async def hammer(repo: AsyncEntityRepository[Balance], entity_id: str, commands: int, seed: int
                 ) -> tuple[list[str], int]:
    rng = random.Random(seed)
    accepted, rejected = [], 0
    for _ in range(commands):
        command = (rng.choice(["deposit", "withdraw", "withdraw"]), rng.randint(1, 10), uuid.uuid4().hex)
        try:
            result = await repo.handle(entity_id, command)
        except DomainError:
            rejected += 1
            continue
        assert result.reply == command[2]
        accepted.append(command[2])
    return accepted, rejected


async def test_many_tasks_on_two_journals_lose_no_update(dsn: str) -> None:
    async with AsyncJournal.open(dsn, **SETTINGS) as one, AsyncJournal.open(dsn, **SETTINGS) as two:
        repos = [AsyncEntityRepository(one, Account, snapshot_every=10), AsyncEntityRepository(two, Account)]
        results = await asyncio.gather(*(hammer(repos[i % 2], "hot", 30, i) for i in range(10)))
        accepted = [cid for ids, _ in results for cid in ids]
        state, events = await replay(one, "account|hot")
        assert sorted(e["id"] for e in events) == sorted(accepted)
        assert sum(rejected for _, rejected in results) + len(accepted) == 300
        assert (await repos[0].load("hot")).state == state
        assert repos[0].status()["batched"] > 0


async def test_conflict_retries_are_bounded(dsn: str) -> None:
    async with AsyncJournal.open(dsn, **SETTINGS) as first, AsyncJournal.open(dsn, **SETTINGS) as second:
        repo = AsyncEntityRepository(first, Account, max_conflict_retries=2)
        real_append = first.append

        async def racing_append(pid: str, events: Any, **kwargs: Any) -> Any:
            await second.append(pid, [{"kind": "deposit", "amount": 1, "id": "rival"}])  # always first
            return await real_append(pid, events, **kwargs)

        first.append = racing_append  # type: ignore[method-assign]
        with pytest.raises(ConflictRetriesExhausted) as caught:
            await repo.handle("a", ("deposit", 5, "mine"))
        assert caught.value.attempts == 3


@pytest.mark.parametrize("write_first", [True, False])
async def test_an_unknown_outcome_is_settled_before_answering(aj: AsyncJournal, write_first: bool) -> None:
    repo = AsyncEntityRepository(aj, Account)
    await repo.handle("a", ("deposit", 5, "d0"))
    real_append, calls = aj.append, [0]

    async def append(pid: str, events: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            if write_first:
                await real_append(pid, events, **kwargs)
            raise WriteOutcomeUnknown("injected: connection lost during commit")
        return await real_append(pid, events, **kwargs)

    aj.append = append  # type: ignore[method-assign]
    result = await repo.handle("a", ("deposit", 3, "d1"))
    assert calls[0] == 2 and (result.seq_nr, result.state) == (2, Balance(8, 2))
    assert [e["id"] for e in (await replay(aj, "account|a"))[1]] == ["d0", "d1"]  # written exactly once


async def test_cancelling_waiting_and_leading_callers(aj: AsyncJournal) -> None:
    repo = AsyncEntityRepository(aj, Account)
    gate, appending = asyncio.Event(), asyncio.Event()
    real_append = aj.append

    async def held_append(*args: Any, **kwargs: Any) -> Any:
        appending.set()
        await gate.wait()
        return await real_append(*args, **kwargs)

    aj.append = held_append  # type: ignore[method-assign]
    leader = asyncio.create_task(repo.handle("a", ("deposit", 5, "lead")))
    # The order built, not timed: the leader holds its batch (in its append) before the others queue behind it.
    await asyncio.wait_for(appending.wait(), 30)
    waiting = [asyncio.create_task(repo.handle("a", ("deposit", 1, f"w{i}"))) for i in range(3)]

    async def queued() -> bool:
        return len(repo._amailboxes._boxes.get(repo.persistence_id("a"), ())) == 3

    await eventually(queued, "the three callers queued behind the leader")
    waiting[1].cancel()  # withdrawn: never decided
    leader.cancel()  # its batch ends; the next waiting caller leads
    with pytest.raises(asyncio.CancelledError):
        await leader
    aj.append = real_append  # type: ignore[method-assign]
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert isinstance(results[1], asyncio.CancelledError)
    assert [r.reply for r in (results[0], results[2])] == ["w0", "w2"]
    assert [e["id"] for e in (await replay(aj, "account|a"))[1]] == ["w0", "w2"]

    async def idle() -> bool:
        return len(repo._amailboxes) == 0

    await eventually(idle, "no mailbox left behind")
