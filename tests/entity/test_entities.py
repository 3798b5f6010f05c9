"""Event-sourced entities on a real PostgreSQL: consistency under contention, recovery, snapshots, honest
write failures (injected with a TCP proxy we can cut, or a wrapper around the real append) and the breaker.
What both repositories offer runs on both faces (``face.entities``); test_aio_entities.py keeps the asyncio-only."""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg.conninfo
import pytest
from support import FAST
from support.eventually import eventually
from support.faces import Face, Kind, open_face

from pgjournal import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidArgument,
    Journal,
    SerializerRegistry,
    WriteOutcomeUnknown,
)
from pgjournal.entity import (
    BreakerState,
    CircuitBreaker,
    CircuitOpen,
    ConflictRetriesExhausted,
    DomainError,
    Entity,
    EntityRepository,
    persist,
)
from pgjournal.examples.shopping_cart import (
    AddItem,
    AdjustQuantity,
    Cart,
    CartRejected,
    CheckOut,
    GetCart,
    ItemAdded,
    RemoveItem,
    ShoppingCart,
    run_workload,
)

# -- a bank account: a rule that depends on the current state (no overdraft) -----------------------------


@dataclass(frozen=True)
class Balance:
    amount: int = 0
    operations: int = 0


class Account(Entity[Balance]):
    """Commands are ``("deposit"|"withdraw", amount, command_id)``; events are JSON dicts."""

    name = "account"
    initial_state = Balance()
    types = (Balance,)

    def handle(self, state: Balance, command: Any) -> Any:
        kind, amount, command_id = command
        if kind == "withdraw" and amount > state.amount:
            raise DomainError(f"cannot withdraw {amount}: balance is {state.amount}")
        if kind == "batch":  # several events from one command
            return persist(*({"kind": "deposit", "amount": 1, "id": f"{command_id}.{i}"} for i in range(amount)))
        return persist({"kind": kind, "amount": amount, "id": command_id}, reply=command_id)

    def apply(self, state: Balance, event: Any) -> Balance:
        sign = -1 if event["kind"] == "withdraw" else 1
        return Balance(state.amount + sign * event["amount"], state.operations + 1)


def replay(journal: Journal | Face, pid: str) -> tuple[Balance, list[dict[str, Any]]]:
    """A sequential replay of everything stored, checking the rule at every step."""
    state, events = Balance(), []
    for expected_seq, envelope in enumerate(journal.query.current_events_by_persistence_id(pid), start=1):
        assert envelope.seq_nr == expected_seq
        state = Account().apply(state, envelope.event)
        assert state.amount >= 0, f"overdraft at seq_nr {envelope.seq_nr}: a decision used a stale state"
        events.append(envelope.event)
    return state, events


def hammer(repo: Any, entity_id: str, commands: int, seed: int) -> tuple[list[str], int]:
    """Random deposits and withdrawals; returns the ids of accepted commands and the rejection count."""
    rng = random.Random(seed)
    accepted, rejected = [], 0
    for _ in range(commands):
        command = (rng.choice(["deposit", "withdraw", "withdraw"]), rng.randint(1, 10), uuid.uuid4().hex)
        try:
            result = repo.handle(entity_id, command)
        except DomainError:
            rejected += 1
            continue
        assert result.reply == command[2]
        accepted.append(command[2])
    return accepted, rejected


# -- domain rules --------------------------------------------------------------------------------------


def test_cart_rules_reject_bad_commands_and_write_nothing(face: Face) -> None:
    carts = face.entities(ShoppingCart)
    assert carts.handle("c1", AddItem("socks", 2)).seq_nr == 1
    bad = [AddItem("socks", 1), AddItem("mug", 0), AddItem("mug", 100), RemoveItem("mug"), AdjustQuantity("mug", 2),
           AdjustQuantity("socks", 0), "nonsense"]
    for command in bad:
        with pytest.raises(CartRejected):
            carts.handle("c1", command)
    with pytest.raises(CartRejected, match="empty cart"):
        carts.handle("c2", CheckOut())
    assert face.highest_seq_nr("cart|c1") == 1
    assert face.highest_seq_nr("cart|c2") == 0
    assert carts.handle("c1", CheckOut()).state == Cart({"socks": 2}, checked_out=True)
    with pytest.raises(CartRejected, match="checked out"):
        carts.handle("c1", AddItem("mug", 1))
    got = carts.handle("c1", GetCart())
    assert (got.reply, got.seq_nr, got.events) == (Cart({"socks": 2}, True), 2, ())
    stored = [e.event for e in face.query.current_events_by_persistence_id("cart|c1")]
    assert stored[0] == ItemAdded("socks", 2)  # registered dataclasses come back as themselves
    assert carts.load("c1").state == Cart({"socks": 2}, True)


def test_a_handler_that_returns_nonsense_writes_nothing(face: Face) -> None:
    class Broken(Entity[int]):
        name = "broken"
        initial_state = 0

        def handle(self, state: int, command: Any) -> Any:
            return 42

    with pytest.raises(InvalidArgument, match="returned int 42"):
        face.entities(Broken).handle("x", "go")
    assert face.highest_seq_nr("broken|x") == 0


def test_entity_names_and_ids_are_checked(face: Face) -> None:
    class Piped(Account):
        name = "a|b"

    with pytest.raises(InvalidArgument, match=r"must not contain '\|'"):
        face.entities(Piped)
    with pytest.raises(InvalidArgument, match="entity id"):
        face.entities(Account).handle("", ("deposit", 1, "x"))
    for bad in ({"snapshot_every": -1}, {"cache_size": "10"}, {"max_batch": 0}, {"unknown_outcome_timeout": -1}):
        with pytest.raises(ConfigurationError, match=next(iter(bad))):
            face.entities(Account, **bad)
    assert face.entities(Account).snapshot_every == 100
    repo = face.entities(Account)
    repo.handle("with|pipe", ("deposit", 1, "x"))  # the entity type is what precedes the first '|'
    assert [e.entity_type for e in face.query.current_events_by_persistence_id("account|with|pipe")] == ["account"]


# -- consistency ---------------------------------------------------------------------------------------


def test_many_threads_on_two_journals_lose_no_update(face_kind: Kind, dsn: str) -> None:
    """Two Journals (two writer ids, two lock tables: optimistic concurrency decides between them), four
    threads each, all on one account."""
    with open_face(face_kind, dsn, **FAST) as first, open_face(face_kind, dsn, **FAST) as second:
        repos = [first.entities(Account, snapshot_every=7), second.entities(Account, cache_size=1)]
        results: list[tuple[list[str], int]] = []
        threads = [threading.Thread(target=lambda r=repos[i % 2], s=i: results.append(hammer(r, "hot", 40, s)))
                   for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        accepted = [cid for ids, _ in results for cid in ids]
        state, events = replay(first, "account|hot")
        assert sorted(e["id"] for e in events) == sorted(accepted)  # every accepted command once, nothing else
        assert state.operations == len(accepted) == first.highest_seq_nr("account|hot")
        assert sum(rejected for _, rejected in results) + len(accepted) == 320
        for repo in repos:
            assert repo.load("hot").state == state
        assert sum(repo.status()["conflicts"] for repo in repos) > 0  # type: ignore[misc]


def test_queued_commands_are_decided_in_order_and_written_in_one_append(journal: Journal) -> None:
    gate, entered = threading.Event(), threading.Event()

    class Gated(Account):
        def handle(self, state: Balance, command: Any) -> Any:
            if command[0] == "gate":
                entered.set()
                gate.wait(10)
                command = ("deposit", *command[1:])
            if command[0] == "bug":
                raise RuntimeError("a bug in one handler")
            return super().handle(state, command)

    repo = EntityRepository(journal, Gated)
    outcomes: dict[str, Any] = {}

    def send(command: tuple[str, int, str]) -> None:
        try:
            outcomes[command[2]] = repo.handle("a", command)
        except Exception as exc:
            outcomes[command[2]] = exc

    first = threading.Thread(target=send, args=(("gate", 5, "g"),))
    first.start()
    assert entered.wait(10)
    queued = [("deposit", 1, "d1"), ("withdraw", 7, "w-refused"), ("bug", 1, "b"), ("withdraw", 6, "w"),
              ("deposit", 2, "d2")]
    threads = []
    for command in queued:  # one at a time, so the queue order is known
        threads.append(threading.Thread(target=send, args=(command,)))
        threads[-1].start()
        eventually(lambda: len(repo._mailboxes._boxes["account|a"]) >= len(threads), "the command queued",
                   interval=0.001)
    gate.set()
    for thread in [first, *threads]:
        thread.join()
    assert isinstance(outcomes["w-refused"], DomainError) and isinstance(outcomes["b"], RuntimeError)
    assert [(outcomes[c].seq_nr, outcomes[c].state.amount) for c in ("g", "d1", "w", "d2")] == \
        [(1, 5), (2, 6), (3, 0), (4, 2)]
    assert repo.status()["batched"] == 5
    stored = list(journal.query.current_events_by_persistence_id("account|a"))
    assert [e.event["id"] for e in stored] == ["g", "d1", "w", "d2"]
    assert len({e.db_timestamp for e in stored[1:]}) == 1  # one append, one transaction
    assert repo.handle("a", ("deposit", 1, "next")).state == Balance(3, 5)


def test_many_threads_on_one_journal_batch_and_lose_no_update(face: Face) -> None:
    repo = face.entities(Account, snapshot_every=10)
    results: list[tuple[list[str], int]] = []
    threads = [threading.Thread(target=lambda s=i: results.append(hammer(repo, "hot", 40, s))) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    accepted = [cid for ids, _ in results for cid in ids]
    state, events = replay(face, "account|hot")
    assert sorted(e["id"] for e in events) == sorted(accepted)
    assert sum(rejected for _, rejected in results) + len(accepted) == 320
    assert repo.load("hot").state == state
    assert repo.status()["batched"] > 0


def test_a_conflict_drops_the_cached_state_and_reruns_the_handler(face_kind: Kind, dsn: str) -> None:
    with open_face(face_kind, dsn, **FAST) as first, open_face(face_kind, dsn, **FAST) as second:
        mine, theirs = first.entities(Account), second.entities(Account)
        mine.handle("a", ("deposit", 10, "d1"))  # cached at seq_nr 1
        theirs.handle("a", ("withdraw", 10, "w1"))  # seq_nr 2, unknown to `mine`
        with pytest.raises(DomainError, match="balance is 0"):  # decided against the current state
            mine.handle("a", ("withdraw", 5, "w2"))
        result = mine.handle("a", ("deposit", 1, "d2"))
        assert (result.seq_nr, result.state) == (3, Balance(1, 3))


def test_a_refusal_or_a_read_is_never_decided_on_a_stale_cached_state(face_kind: Kind, dsn: str) -> None:
    with open_face(face_kind, dsn, **FAST) as first, open_face(face_kind, dsn, **FAST) as second:
        mine, theirs = first.entities(Account), second.entities(Account)
        mine.handle("a", ("deposit", 1, "d1"))  # cached: balance 1
        theirs.handle("a", ("deposit", 10, "d2"))
        assert mine.handle("a", ("withdraw", 5, "w")).state == Balance(6, 3)  # the stale state would refuse
        theirs.handle("a", ("deposit", 4, "d3"))
        with pytest.raises(DomainError, match="balance is 10"):
            mine.handle("a", ("withdraw", 11, "w2"))


def test_conflict_retries_are_bounded(dsn: str) -> None:
    with Journal.open(dsn, **FAST) as first, Journal.open(dsn, **FAST) as second:
        repo = EntityRepository(first, Account, max_conflict_retries=2)
        real_append = first.append

        def racing_append(pid: str, events: Any, **kwargs: Any) -> Any:
            second.append(pid, [{"kind": "deposit", "amount": 1, "id": "rival"}])  # always first
            return real_append(pid, events, **kwargs)

        first.append = racing_append  # type: ignore[method-assign]
        with pytest.raises(ConflictRetriesExhausted, match="3 times in a row") as caught:
            repo.handle("a", ("deposit", 5, "mine"))
        assert caught.value.attempts == 3
        assert [e.event["id"] for e in first.query.current_events_by_persistence_id("account|a")] == ["rival"] * 3


# -- recovery and snapshots --------------------------------------------------------------------------------


def test_recovery_from_a_snapshot_equals_a_full_replay(face_kind: Kind, dsn: str) -> None:
    with open_face(face_kind, dsn, buffer_size=7, **FAST) as journal:  # pages of 7: replay in many batches
        repo = journal.entities(Account, snapshot_every=10)
        for i in range(95):
            repo.handle("acc", ("deposit" if i % 3 else "withdraw", i % 5, str(i)) if i else ("deposit", 50, "0"))
        repo.handle("acc", ("batch", 4, "b"))  # 95 → 99: no multiple of 10 crossed
        repo.handle("acc", ("batch", 3, "c"))  # 99 → 102: crosses 100, snapshot at 102
        snapshot = journal.load_snapshot("account|acc")
        assert snapshot is not None and snapshot.seq_nr == 102
        assert snapshot.metadata == {"entity": "account", "version": 1}
        repo.handle("acc", ("deposit", 1, "last"))
        from_snapshot = journal.entities(Account).load("acc")
        assert (from_snapshot.snapshot_seq_nr, from_snapshot.replayed, from_snapshot.seq_nr) == (102, 1, 103)
        journal.delete_snapshot("account|acc")
        full = journal.entities(Account).load("acc")
        assert (full.snapshot_seq_nr, full.replayed) == (None, 103)
        assert from_snapshot.state == full.state == replay(journal, "account|acc")[0]


@pytest.mark.parametrize("problem", ["version", "entity", "undecodable", "rejected"])
def test_an_unusable_snapshot_is_ignored_with_a_warning(face_kind: Kind, dsn: str, problem: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    class Custom:
        def to_binary(self, obj: Any) -> tuple[str, bytes]:
            return "x", b"x"

        def from_binary(self, payload: bytes, manifest: str) -> Any:
            return "x"

    class Picky(Account):
        def from_snapshot(self, data: Any) -> Balance:
            raise ValueError("no thanks")

    other = SerializerRegistry()
    other.register_serializer(4242, Custom(), bytearray)
    with open_face(face_kind, dsn, **FAST) as journal, \
            open_face(face_kind, dsn, serializers=other, **FAST) as foreign:
        repo = journal.entities(Picky if problem == "rejected" else Account, snapshot_every=1000)
        for i in range(5):
            repo.handle("a", ("deposit", 2, str(i)))
        bogus, metadata = Balance(999, 999), {"entity": "account", "version": 1}
        if problem == "version":
            metadata = {"entity": "account", "version": 99}
        elif problem == "entity":
            metadata = {"entity": "other", "version": 1}
        if problem == "undecodable":
            foreign.save_snapshot("account|a", 5, bytearray(b"?"), metadata=metadata)
        else:
            journal.save_snapshot("account|a", 5, bogus, metadata=metadata)
        with caplog.at_level(logging.WARNING, logger="pgjournal.entity"):
            recovered = repo.load("a")
        assert "ignoring the snapshot of 'account|a'" in caplog.text
        assert (recovered.snapshot_seq_nr, recovered.replayed, recovered.state) == (None, 5, Balance(10, 5))


@pytest.mark.parametrize("rival_writes", ["before", "after"])
def test_recovery_is_consistent_while_another_writer_appends(dsn: str, rival_writes: str) -> None:
    """A write landing between recovery's reads (before or after it reads the highest sequence number)
    must not give a stale state a newer sequence number."""
    with Journal.open(dsn, **FAST) as journal, Journal.open(dsn, **FAST) as rival:
        repo = EntityRepository(journal, Account, cache_size=0, snapshot_every=1)
        repo.handle("a", ("deposit", 5, "d"))  # snapshot at 1: replay after it is empty
        real_highest, calls = journal.highest_seq_nr, [0]

        def highest_then_rival_writes(pid: str) -> int:
            calls[0] += 1
            if calls[0] == 1 and rival_writes == "before":
                rival.append(pid, [{"kind": "withdraw", "amount": 5, "id": "r"}], expected_seq_nr=1)
            value = real_highest(pid)
            if calls[0] == 1 and rival_writes == "after":
                rival.append(pid, [{"kind": "withdraw", "amount": 5, "id": "r"}], expected_seq_nr=1)
            return value

        journal.highest_seq_nr = highest_then_rival_writes  # type: ignore[method-assign]
        with pytest.raises(DomainError, match="balance is 0"):
            repo.handle("a", ("withdraw", 5, "w"))
        assert replay(journal, "account|a")[0] == Balance(0, 2)
        assert repo.status()["conflicts"] == (1 if rival_writes == "after" else 0)


def test_recovery_after_deleted_events_continues_after_them(face: Face) -> None:
    repo = face.entities(Account, snapshot_every=0)
    for i in range(3):
        repo.handle("a", ("deposit", 1, str(i)))
    face.delete_events("account|a", 3)
    repo.evict()
    assert repo.handle("a", ("deposit", 5, "after")).seq_nr == 4


def test_the_cache_is_bounded_and_lru(face: Face) -> None:
    repo = face.entities(Account, cache_size=2)
    for entity_id in ("a", "b", "a", "c"):
        repo.handle(entity_id, ("deposit", 1, entity_id))
    assert repo.status()["cached"] == 2
    # "b" was evicted: a write behind the repository's back is found by recovery, not by a conflict
    face.append("account|b", [{"kind": "deposit", "amount": 7, "id": "side"}], expected_seq_nr=1)
    assert repo.handle("b", ("withdraw", 8, "w")).state == Balance(0, 3)


# -- write failures ------------------------------------------------------------------------------------------


def inject(journal: Journal, *, write_first: bool, fail_after: type[Exception] | None = None,
           before: Any = None) -> list[int]:
    """Make the next ``journal.append`` lose its answer: optionally perform it for real, then raise
    WriteOutcomeUnknown; later appends raise ``fail_after`` if given. Returns a call counter."""
    real_append, calls = journal.append, [0]

    def append(pid: str, events: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            if before is not None:
                before(pid)
            if write_first:
                real_append(pid, events, **kwargs)
            raise WriteOutcomeUnknown("injected: connection lost during commit")
        if fail_after is not None:
            raise fail_after("injected: still unreachable")
        return real_append(pid, events, **kwargs)

    journal.append = append  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("write_first", [True, False])
def test_an_unknown_outcome_is_settled_before_answering(journal: Journal, write_first: bool) -> None:
    repo = EntityRepository(journal, Account)
    repo.handle("a", ("deposit", 5, "d0"))
    calls = inject(journal, write_first=write_first)
    result = repo.handle("a", ("deposit", 3, "d1"))
    assert calls[0] == 2
    assert (result.seq_nr, result.state) == (2, Balance(8, 2))
    assert [e["id"] for e in replay(journal, "account|a")[1]] == ["d0", "d1"]  # written exactly once


def test_an_unknown_outcome_where_another_writer_won_reruns_the_command(dsn: str) -> None:
    with Journal.open(dsn, **FAST) as journal, Journal.open(dsn, **FAST) as rival:
        repo = EntityRepository(journal, Account)
        repo.handle("a", ("deposit", 5, "d0"))
        inject(journal, write_first=False,
               before=lambda pid: rival.append(pid, [{"kind": "withdraw", "amount": 5, "id": "r"}]))
        with pytest.raises(DomainError, match="balance is 0"):  # re-decided on the state with the rival's event
            repo.handle("a", ("withdraw", 1, "w"))
        assert [e["id"] for e in replay(journal, "account|a")[1]] == ["d0", "r"]


def test_an_unknown_outcome_that_cannot_be_settled_is_reported_as_unknown(journal: Journal) -> None:
    repo = EntityRepository(journal, Account, unknown_outcome_timeout=0.3,
                            breaker=CircuitBreaker(max_failures=100))
    repo.handle("a", ("deposit", 5, "d0"))
    inject(journal, write_first=True, fail_after=DatabaseUnavailable)
    started = time.monotonic()
    with pytest.raises(WriteOutcomeUnknown, match=r"did not answer within 0\.3s"):
        repo.handle("a", ("deposit", 1, "d1"))
    assert time.monotonic() - started < 2
    del journal.append  # back to the real one
    assert repo.load("a").state == Balance(6, 2)  # it had been written; the caller was told "unknown"


class Proxy:
    """A loopback TCP proxy to the database that a test can cut, restore, or make drop a connection right
    after it forwards (or instead of forwarding) the next statement containing a marker."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._trap: tuple[bytes, bool] | None = None
        self._mute: socket.socket | None = None
        self.sprung = threading.Event()
        self.restore()

    def restore(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self.port = self._listener.getsockname()[1]
        self._listener.listen()
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and break every open one."""
        self._kill(self._listener)  # shutdown wakes the accepting thread, so the port is free again
        with self._lock:
            socks, self._socks = list(self._socks), set()
        for sock in socks:
            self._kill(sock)

    def drop_on(self, marker: bytes, *, forward: bool) -> None:
        self._trap = (marker, forward)

    @staticmethod
    def _kill(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            with self._lock:
                self._socks.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if not upstream and self._mute is src:  # the server's answer after the commit: drop it
                    self.sprung.set()
                    break
                trap = self._trap
                if upstream and trap is not None and trap[0] in data:
                    self._trap = None
                    if not trap[1]:  # the statement never reaches the server
                        self.sprung.set()
                        break
                    self._mute = dst
                dst.sendall(data)
        except OSError:
            pass
        self._kill(src)
        self._kill(dst)


@pytest.fixture
def proxy(dsn: str) -> Iterator[tuple[Proxy, str]]:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    proxy = Proxy(str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    yield proxy, psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))
    proxy.cut()


@pytest.mark.parametrize("forward", [True, False])
def test_a_connection_lost_during_the_append_is_settled_by_reading_back(
        proxy: tuple[Proxy, str], dsn: str, forward: bool, caplog: pytest.LogCaptureFixture) -> None:
    cutter, via_proxy = proxy
    with Journal.open(via_proxy, notify=False, connect_timeout=2) as journal:
        repo = EntityRepository(journal, Account, snapshot_every=0)
        repo.handle("a", ("deposit", 5, "d0"))
        # The trap waits for the append's own parameters (the event's id), not the statement text: a pool
        # connection that ran the append before sends only the prepared statement's name.
        cutter.drop_on(b'"d1"', forward=forward)
        with caplog.at_level(logging.INFO, logger="pgjournal.entity"):
            result = repo.handle("a", ("deposit", 3, "d1"))
        assert cutter.sprung.is_set()
        assert "lost its connection" in caplog.text
        assert ("had been written" if forward else "had not been written") in caplog.text
        assert (result.seq_nr, result.state) == (2, Balance(8, 2))
    with Journal.open(dsn) as direct:
        assert [e["id"] for e in replay(direct, "account|a")[1]] == ["d0", "d1"]


def test_the_breaker_fails_fast_while_the_database_is_unreachable_and_closes_when_it_returns(
        proxy: tuple[Proxy, str], dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    cutter, via_proxy = proxy
    breaker = CircuitBreaker("test", max_failures=2, reset_timeout=0.5, max_reset_timeout=2.0)
    with Journal.open(via_proxy, notify=False, connect_timeout=1) as journal, \
            caplog.at_level(logging.INFO, logger="pgjournal.entity"):
        repo = EntityRepository(journal, Account, breaker=breaker, unknown_outcome_timeout=1)
        repo.handle("a", ("deposit", 5, "d0"))
        cutter.cut()
        for _ in range(2):
            repo.evict()  # recovery reads first: these fail before anything is sent to be written
            with pytest.raises(DatabaseUnavailable) as failed:
                repo.handle("a", ("deposit", 1, "lost"))
            assert not isinstance(failed.value, CircuitOpen)
        assert breaker.state is BreakerState.OPEN
        assert "circuit breaker 'test' open after 2 consecutive database failures" in caplog.text
        started = time.monotonic()
        with pytest.raises(CircuitOpen, match="nothing was written"):
            repo.handle("a", ("deposit", 1, "fast"))
        assert time.monotonic() - started < 0.1
        assert repo.status()["breaker"]["state"] == "open"  # type: ignore[index]
        cutter.restore()
        handled = []

        def trial() -> bool:
            """A trial once the pause is over. The pool reconnects with its own backoff, so the first trial may
            still find no connection (nothing sent, the breaker reopens): try again at the next half-open."""
            if breaker.state is not BreakerState.HALF_OPEN:
                return False
            try:
                handled.append(repo.handle("a", ("deposit", 1, "back")))
            except DatabaseUnavailable:
                return False
            return True

        eventually(trial, "a trial that finds the database back", timeout=30)
        assert handled[0].state == Balance(6, 2)
        assert breaker.state is BreakerState.CLOSED
        assert "closed: the database answers again" in caplog.text
    with Journal.open(dsn) as direct:
        assert [e["id"] for e in replay(direct, "account|a")[1]] == ["d0", "back"]


def test_a_failed_trial_reopens_the_breaker_for_longer() -> None:
    breaker = CircuitBreaker("unit", max_failures=1, reset_timeout=0.2, max_reset_timeout=0.6)
    with pytest.raises(DatabaseUnavailable), breaker.guard():
        raise DatabaseUnavailable("down")
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(CircuitOpen), breaker.guard():
        pytest.fail("ran while open")
    eventually(lambda: breaker.state is BreakerState.HALF_OPEN, "the first pause (0.2 s) over", timeout=5)
    with pytest.raises(DatabaseUnavailable), breaker.guard():  # the trial fails: open, pause doubled
        raise DatabaseUnavailable("still down")
    reopened = time.monotonic()
    assert breaker.state is BreakerState.OPEN
    time.sleep(0.22)  # the scenario: longer than the first pause, shorter than the doubled one
    assert breaker.state is BreakerState.OPEN or time.monotonic() - reopened >= 0.4  # 0.4 s now
    eventually(lambda: breaker.state is BreakerState.HALF_OPEN, "the doubled pause (0.4 s) over", timeout=5)
    assert time.monotonic() - reopened >= 0.4
    with breaker.guard():  # trial succeeds
        pass
    assert breaker.status()["state"] == "closed"
    with pytest.raises(DomainError), breaker.guard():  # a refusal is not a database failure
        raise DomainError("no")
    assert breaker.state is BreakerState.CLOSED


# -- the demo workload -----------------------------------------------------------------------------------


def test_the_cart_workload_counts_match_the_journal(journal: Journal) -> None:
    seen: list[tuple[str, Any]] = []
    counts = run_workload(journal, carts=10, threads=4, commands=300, seed=7,
                          on_command=lambda cart_id, command, outcome: seen.append((cart_id, outcome)))
    assert counts.commands == len(seen) == 300
    assert counts.accepted + counts.rejected == 300 and counts.failed == 0
    assert counts.rejected > 0 and counts.checkouts > 0
    pids = list(journal.query.current_persistence_ids())
    assert sum(journal.highest_seq_nr(pid) for pid in pids) == counts.events == counts.accepted
    repo = EntityRepository(journal, ShoppingCart)
    for pid in pids:
        cart = repo.load(pid.partition("|")[2]).state
        assert all(1 <= q <= 99 for q in cart.items.values())


# -- the README example, verbatim ----------------------------------------------------------------------------


def test_the_readme_entity_works(journal: Journal) -> None:
    from dataclasses import replace

    from pgjournal import DomainError, Entity, EntityRepository, persist

    @dataclass(frozen=True)
    class Wallet:
        balance: int = 0

    class WalletEntity(Entity[Wallet]):
        name = "wallet"                          # persistence ids are "wallet|<entity id>"
        initial_state = Wallet()
        types = (Wallet,)                        # stored as JSON in snapshots

        def handle(self, state, command):        # decide: the events to persist, or refuse
            kind, amount = command
            if kind == "pay" and amount > state.balance:
                raise DomainError(f"cannot pay {amount}: the balance is {state.balance}")
            return persist({"kind": kind, "amount": amount}, reply="ok")

        def apply(self, state, event):           # evolve: after each command and during recovery
            sign = -1 if event["kind"] == "pay" else 1
            return replace(state, balance=state.balance + sign * event["amount"])

    wallets = EntityRepository(journal, WalletEntity, snapshot_every=100)
    wallets.handle("alice", ("top up", 50))
    result = wallets.handle("alice", ("pay", 20))
    assert (result.reply, result.state.balance, result.seq_nr) == ("ok", 30, 2)
    with pytest.raises(DomainError, match="the balance is 30"):
        wallets.handle("alice", ("pay", 100))
    assert journal.highest_seq_nr("wallet|alice") == 2


# -- the mailbox on its own (no database) -----------------------------------------------------------------


def test_mailbox_batches_are_bounded_ordered_and_survive_a_failing_leader() -> None:
    from pgjournal.entity.mailbox import Mailboxes, Pending

    boxes, seen, batches = Mailboxes(), [], []
    lock = threading.Lock()

    def run(_key: str, batch: list[Pending]) -> None:
        batches.append(len(batch))
        time.sleep(0.002)  # the scenario: the leader's work takes a moment, so followers queue up
        for item in batch:
            if item.command % 10 == 0:
                raise RuntimeError(f"leader failed on {item.command}")  # the rest of the batch fails too
            item.succeed(item.command)
        with lock:
            seen.extend(item.command for item in batch)

    outcomes: dict[int, Any] = {}

    def send(n: int) -> None:
        item = Pending(None, "e", n)
        boxes.submit("k", item, run, max_batch=4)
        assert item.completed
        outcomes[n] = item.error or item.result

    threads = [threading.Thread(target=send, args=(n,)) for n in range(1, 60)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(outcomes) == 59 and len(boxes) == 0
    assert max(batches) <= 4 and any(size > 1 for size in batches)
    assert all(isinstance(outcomes[n], RuntimeError) for n in range(10, 60, 10))
    assert all(outcomes[n] == n for n in seen)
