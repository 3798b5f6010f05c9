"""The convergent values of replicated entities (pgjournal/entity/crdt.py), without a database: replicas simulated
in memory with the replica rules of pgjournal/model/replication.py (a local write, an arrival with the origin's
vector), each replica pulling every event a peer holds in the peer's order, as the replicator does. Whatever the
interleaving of writes and deliveries, once every replica has pulled everything, all replicas' states are equal;
a conflict the handler does not merge stays as concurrent versions until a command resolves it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgjournal.entity import DomainError, persist
from pgjournal.entity.crdt import ConcurrentVersions, Dot, LwwRegister, ORSet, PNCounter
from pgjournal.entity.model import effect_of
from pgjournal.entity.replicated import CommandContext, ReplicatedEntity, ReplicationContext
from pgjournal.errors import InvalidArgument
from pgjournal.model.replication import (
    ReplicaState,
    ReplicatedEventMetadata,
    VersionVector,
    arrival,
    split_metadata,
)

pytestmark = pytest.mark.mode_independent

REPLICAS = ("A", "B", "C")


# -- the entities (also used by test_replicated_entities.py, against the database) ------------------------


class Votes(ReplicatedEntity[PNCounter]):
    name = "Votes"
    replicas = REPLICAS
    initial_state = PNCounter()

    def handle(self, state: PNCounter, command: Any, context: CommandContext) -> Any:
        return persist({"delta": command}, reply=state.value + command)

    def apply(self, state: PNCounter, event: Any, context: ReplicationContext) -> PNCounter:
        return state.update(context.origin_replica, event["delta"])


class Labels(ReplicatedEntity[ORSet[str]]):
    name = "Labels"
    replicas = REPLICAS
    initial_state: ORSet[str] = ORSet()

    def handle(self, state: ORSet[str], command: Any, context: CommandContext) -> Any:
        verb, label = command
        if verb == "add":
            return [{"add": label}]
        if label not in state:
            return None
        return [{"remove": label, "dots": [d.as_list() for d in sorted(state.observed(label))]}]

    def apply(self, state: ORSet[str], event: Any, context: ReplicationContext) -> ORSet[str]:
        if "add" in event:
            return state.add(event["add"], context.dot)
        return state.remove(event["remove"], [Dot.of(d) for d in event["dots"]])


class Title(ReplicatedEntity[LwwRegister[Any]]):
    name = "Title"
    replicas = REPLICAS
    initial_state: LwwRegister[Any] = LwwRegister(None)

    def handle(self, state: LwwRegister[Any], command: Any, context: CommandContext) -> Any:
        value, now = command
        return [{"set": value, "ts": state.next_timestamp(now), "replica": context.replica_id}]

    def apply(self, state: LwwRegister[Any], event: Any, context: ReplicationContext) -> LwwRegister[Any]:
        return state.update(event["set"], event["ts"], event["replica"])


class Document(ReplicatedEntity[ConcurrentVersions[str]]):
    """A text whose concurrent edits are kept side by side; ``("resolve", text)`` only while there is a conflict."""

    name = "Document"
    replicas = REPLICAS
    initial_state: ConcurrentVersions[str] = ConcurrentVersions()

    def handle(self, state: ConcurrentVersions[str], command: Any, context: CommandContext) -> Any:
        verb, *rest = command
        if verb == "get":
            return persist(reply=state.values)
        if verb == "resolve" and not state.conflict:
            raise DomainError(f"nothing to resolve: one version {state.values!r}")
        return [{"text": rest[0]}]

    def apply(self, state: ConcurrentVersions[str], event: Any, context: ReplicationContext
              ) -> ConcurrentVersions[str]:
        return state.update(event["text"], context.origin_version, context.origin_replica)


# -- replicas in memory -----------------------------------------------------------------------------------


@dataclass
class Replica:
    entity: ReplicatedEntity[Any]
    name: str
    state: Any = None
    replica: ReplicaState = field(init=False)
    #: (event, stored metadata value): this replica's persistence id.
    log: list[tuple[Any, Any]] = field(default_factory=list)
    #: how far this replica has read each peer's log
    read: dict[str, int] = field(default_factory=dict)
    contexts: list[ReplicationContext] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = self.entity.new_state()
        self.replica = ReplicaState(self.name)

    def command(self, command: Any) -> Any:
        context = CommandContext(self.name, frozenset(REPLICAS), self.replica.seq_nr, self.replica.version)
        effect = effect_of(self.entity, command, self.entity.handle(self.state, command, context))  # type: ignore[arg-type]
        for event in effect.events:
            self.replica, metadata = self.replica.write_local()
            self._apply(event, metadata, metadata.version, metadata)
        return effect.reply

    def pull(self, peer: Replica) -> bool:
        """Read the next event of ``peer``'s log; whether there was one."""
        at = self.read.get(peer.name, 0)
        if at >= len(peer.log):
            return False
        self.read[peer.name] = at + 1
        event, stored = peer.log[at]
        metadata, origin = split_metadata(stored)
        assert metadata is not None
        arrived = arrival(self.replica, metadata, origin)
        if arrived is not None:
            self.replica = arrived.state
            self._apply(event, arrived.metadata, arrived.origin_version, arrived.stored)
        return True

    def _apply(self, event: Any, metadata: ReplicatedEventMetadata, origin: VersionVector, stored: Any) -> None:
        context = ReplicationContext(self.name, frozenset(REPLICAS), metadata.origin_replica,
                                     metadata.origin_sequence_nr, metadata.concurrent, False, self.replica.seq_nr,
                                     self.replica.version, origin)
        self.contexts.append(context)
        self.state = self.entity.apply(self.state, event, context)
        self.log.append((event, stored))

    def replayed(self) -> Any:
        """The state recovery rebuilds from the log (the stored metadata only)."""
        state, replica = self.entity.new_state(), ReplicaState(self.name)
        for event, stored in self.log:
            metadata, origin = split_metadata(stored)
            assert metadata is not None and origin is not None
            replica = replica.replay(replica.seq_nr + 1, metadata)
            state = self.entity.apply(state, event, ReplicationContext(
                self.name, frozenset(REPLICAS), metadata.origin_replica, metadata.origin_sequence_nr,
                metadata.concurrent, True, replica.seq_nr, replica.version, origin))
        return state


def settle(replicas: dict[str, Replica]) -> None:
    moved = True
    while moved:
        moved = False
        for here in replicas.values():
            for peer in replicas.values():
                if peer is not here:
                    while here.pull(peer):
                        moved = True


def run(entity: ReplicatedEntity[Any], actions: list[tuple[Any, ...]]) -> dict[str, Replica]:
    replicas = {name: Replica(entity, name) for name in REPLICAS}
    for action in actions:
        if action[0] == "write":
            with contextlib.suppress(DomainError):
                replicas[action[1]].command(action[2])
        else:
            replicas[action[1]].pull(replicas[action[2]])
    settle(replicas)
    return replicas


def check_converged(replicas: dict[str, Replica]) -> Any:
    states = {name: r.state for name, r in replicas.items()}
    first = next(iter(states.values()))
    assert all(state == first for state in states.values()), states
    for r in replicas.values():
        assert r.replayed() == r.state
        # every origin event exactly once in every replica, in its origin's order
        dots = [(c.origin_replica, c.origin_sequence_nr) for c in r.contexts]
        assert len(dots) == len(set(dots))
        for origin in REPLICAS:
            mine = [n for o, n in dots if o == origin]
            assert mine == sorted(mine)
    vectors = {r.replica.version for r in replicas.values()}
    assert len(vectors) == 1, vectors
    return first


peers = st.sampled_from([(a, b) for a in REPLICAS for b in REPLICAS if a != b])


def actions_of(commands: st.SearchStrategy[Any]) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    write = st.tuples(st.just("write"), st.sampled_from(REPLICAS), commands)
    pull = peers.map(lambda p: ("pull", *p))
    return st.lists(st.one_of(write, pull, pull), max_size=60)


@settings(max_examples=150, deadline=None)
@given(actions_of(st.integers(-5, 5)))
def test_counters_converge_to_the_sum_of_every_delta(actions: list[tuple[Any, ...]]) -> None:
    state = check_converged(run(Votes(), actions))
    assert state.value == sum(a[2] for a in actions if a[0] == "write")


@settings(max_examples=150, deadline=None)
@given(actions_of(st.tuples(st.sampled_from(["add", "remove"]), st.sampled_from(["x", "y", "z"]))))
def test_add_wins_sets_converge(actions: list[tuple[Any, ...]]) -> None:
    check_converged(run(Labels(), actions))


@settings(max_examples=150, deadline=None)
@given(actions_of(st.tuples(st.sampled_from(["p", "q", "r"]), st.integers(0, 5))))
def test_last_writer_wins_registers_converge_to_the_greatest_timestamp_and_replica(
        actions: list[tuple[Any, ...]]) -> None:
    replicas = run(Title(), actions)
    state = check_converged(replicas)
    written = [(event["ts"], event["replica"], event["set"]) for r in replicas.values() for event, stored in r.log
               if split_metadata(stored)[0].origin_replica == r.name]  # type: ignore[union-attr]
    if written:
        assert (state.timestamp, state.replica, state.value) == max(written)


@settings(max_examples=150, deadline=None)
@given(actions_of(st.tuples(st.just("set"), st.sampled_from(["p", "q", "r", "s"]))))
def test_concurrent_versions_converge_and_keep_every_write_no_other_write_has_seen(
        actions: list[tuple[Any, ...]]) -> None:
    replicas = run(Document(), actions)
    state = check_converged(replicas)
    # The versions kept are exactly the writes whose origin vector no other write's dominates.
    writes = [(stored, event) for r in replicas.values() for event, stored in r.log
              if split_metadata(stored)[0].origin_replica == r.name]  # type: ignore[union-attr]
    vectors = [split_metadata(s)[1] for s, _ in writes]
    maximal = sorted(event["text"] for (s, event), v in zip(writes, vectors, strict=True)
                     if not any(o.dominates(v) for o in vectors))  # type: ignore[union-attr]
    assert sorted(state.values) == maximal


def test_an_add_concurrent_with_a_remove_wins() -> None:
    replicas = {name: Replica(Labels(), name) for name in REPLICAS}
    replicas["A"].command(("add", "x"))
    settle(replicas)
    replicas["A"].command(("remove", "x"))  # A removed the addition it saw
    replicas["B"].command(("add", "x"))  # meanwhile B added x again
    settle(replicas)
    assert {r.state.elements for r in replicas.values()} == {frozenset({"x"})}


def test_a_conflict_is_kept_until_a_command_resolves_it() -> None:
    replicas = {name: Replica(Document(), name) for name in REPLICAS}
    replicas["A"].command(("set", "draft"))
    settle(replicas)
    replicas["A"].command(("set", "from A"))
    replicas["B"].command(("set", "from B"))
    settle(replicas)
    for r in replicas.values():
        assert r.state.conflict and sorted(r.command(("get",))) == ["from A", "from B"]
        with pytest.raises(InvalidArgument, match="2 concurrent versions"):
            _ = r.state.value
    assert [c.concurrent for c in replicas["C"].contexts] == [False, False, True]
    replicas["C"].command(("resolve", "merged"))
    settle(replicas)
    assert {r.state.value for r in replicas.values()} == {"merged"}
    with pytest.raises(DomainError, match="nothing to resolve"):
        replicas["A"].command(("resolve", "again"))


def test_a_relayed_event_is_concurrent_where_its_origin_had_not_seen_the_other_side() -> None:
    """A writes a1 and C writes c1 at once; B holds both and relays c1 to A. The vector B stores for c1 has seen
    a1, but c1's origin had not: A flags c1 concurrent (the origin's vector travels beside the metadata), and A's
    versions are both writes, as B's and C's."""
    a, b, c = (Replica(Document(), name) for name in REPLICAS)
    a.command(("set", "a1"))
    c.command(("set", "c1"))
    b.pull(a)
    b.pull(c)
    a.pull(b)  # a1 itself: seen
    a.pull(b)  # c1, relayed
    assert a.contexts[-1].concurrent and a.contexts[-1].origin_replica == "C"
    assert sorted(a.state.values) == ["a1", "c1"] == sorted(b.state.values)
    c.pull(b)
    c.pull(b)
    assert sorted(c.state.values) == ["a1", "c1"]


def test_the_crdt_values_refuse_bad_input() -> None:
    with pytest.raises(InvalidArgument, match="delta must be an int"):
        PNCounter().update("A", 1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"a dot is \[replica, counter\]"):
        Dot.of("A:1")
    with pytest.raises(InvalidArgument, match="a timestamp must be an int"):
        LwwRegister(None).update("v", "soon", "A")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="must be a VersionVector"):
        ConcurrentVersions().update("v", {"A": 1}, "A")  # type: ignore[arg-type]
    assert LwwRegister("x", 5, "A").next_timestamp(3) == 6
    assert LwwRegister("x", 5, "B").update("y", 5, "A").value == "x"  # same time: the greater replica id wins
