"""Values for replicated entities' states that converge whatever the order concurrent events arrive in.

Each is immutable and updated by the event handler from an event and its
:class:`~pgjournal.entity.replicated.ReplicationContext`; two replicas that applied the same events, in any order
that keeps causality (the order every replica's persistence id has), hold equal values:

- :class:`PNCounter`: increments and decrements per replica; the value is their sum;
- :class:`ORSet`: an add-wins (observed-remove) set: a remove takes away the additions it observed, so an
  addition concurrent with it stays;
- :class:`LwwRegister`: a last-writer-wins register ordered by (timestamp, replica id);
- :class:`ConcurrentVersions`: the value of a register whose concurrent writes are all kept (each with the vector
  it was written with) until a later write that has seen them resolves them (Eventuate's ``ConcurrentVersions``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pgjournal.errors import InvalidArgument
from pgjournal.model.replication import Ordering, VersionVector, java_order

T = TypeVar("T")


def _check_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__} {value!r}")
    return value


def _check_replica(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"a replica id must be a non-empty string, got {value!r}")
    return value


def _nonzero(counts: Mapping[str, int]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v}


@dataclass(frozen=True, slots=True)
class PNCounter:
    """A counter of increments and decrements per replica (a PN counter): ``value`` is their sum. Updated per event
    (``counter.update(ctx.origin_replica, delta)``); ``merge`` joins two states (the pointwise maximum of each
    replica's increments and decrements), for states exchanged whole."""

    increments: Mapping[str, int] = field(default_factory=dict)
    decrements: Mapping[str, int] = field(default_factory=dict)

    @property
    def value(self) -> int:
        return sum(self.increments.values()) - sum(self.decrements.values())

    def update(self, replica: str, delta: int) -> PNCounter:
        _check_replica(replica)
        _check_int(delta, "a counter's delta")
        if delta >= 0:
            return PNCounter({**self.increments, replica: self.increments.get(replica, 0) + delta}, self.decrements)
        return PNCounter(self.increments, {**self.decrements, replica: self.decrements.get(replica, 0) - delta})

    def merge(self, other: PNCounter) -> PNCounter:
        def join(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
            return {k: max(a.get(k, 0), b.get(k, 0)) for k in a.keys() | b.keys()}
        return PNCounter(join(self.increments, other.increments), join(self.decrements, other.decrements))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PNCounter):
            return NotImplemented
        return (_nonzero(self.increments), _nonzero(self.decrements)) == (_nonzero(other.increments),
                                                                          _nonzero(other.decrements))

    def __hash__(self) -> int:
        return hash(self.value)


@dataclass(frozen=True, slots=True, order=True)
class Dot:
    """One addition's identity: the replica where its event was written and the event's sequence number there
    (a replicated event's origin replica and origin sequence number: unique per entity)."""

    replica: str
    counter: int

    def as_list(self) -> list[Any]:
        """``[replica, counter]``, for an event's JSON."""
        return [self.replica, self.counter]

    @classmethod
    def of(cls, value: Any) -> Dot:
        """A :class:`Dot`, or ``[replica, counter]`` back into one."""
        if isinstance(value, Dot):
            return value
        if isinstance(value, list | tuple) and len(value) == 2:
            return cls(_check_replica(value[0]), _check_int(value[1], "a dot's counter"))
        raise InvalidArgument(f"a dot is [replica, counter], got {value!r}")


@dataclass(frozen=True, slots=True)
class ORSet(Generic[T]):
    """An add-wins set (observed-remove): each element maps to the dots of the additions that hold it. ``add``
    records a new dot (``ctx.dot``); a remove command records the dots it observed (:meth:`observed`) in its event,
    and ``remove`` takes away those only, so an addition the remover had not seen stays."""

    entries: Mapping[T, frozenset[Dot]] = field(default_factory=dict)

    @property
    def elements(self) -> frozenset[T]:
        return frozenset(self.entries)

    def __contains__(self, element: object) -> bool:
        return element in self.entries

    def __iter__(self) -> Iterator[T]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def observed(self, element: T) -> frozenset[Dot]:
        """The dots a remove of ``element`` decided now takes away."""
        return self.entries.get(element, frozenset())

    def add(self, element: T, dot: Dot) -> ORSet[T]:
        return ORSet({**self.entries, element: self.observed(element) | {Dot.of(dot)}})

    def remove(self, element: T, observed: Iterable[Dot | Any]) -> ORSet[T]:
        left = self.observed(element) - {Dot.of(d) for d in observed}
        entries = {k: v for k, v in self.entries.items() if k != element}
        if left:
            entries[element] = left
        return ORSet(entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ORSet):
            return NotImplemented
        return dict(self.entries) == dict(other.entries)

    def __hash__(self) -> int:
        return hash(frozenset(self.entries))


@dataclass(frozen=True, slots=True)
class LwwRegister(Generic[T]):
    """A last-writer-wins register: of two writes, the one with the greater (timestamp, replica id) wins, replica
    ids compared as Akka's ``LwwTime`` (Java's string order). A write decided here takes :meth:`next_timestamp`, so
    a replica's own writes move forward even when its clock does not."""

    value: T
    timestamp: int = 0
    replica: str = ""

    def _key(self) -> tuple[int, bytes]:
        return self.timestamp, java_order(self.replica)

    def next_timestamp(self, now: int) -> int:
        """The timestamp of a write decided at ``now`` (in any unit, e.g. milliseconds): after this one's."""
        return max(_check_int(now, "a timestamp"), self.timestamp + 1)

    def update(self, value: T, timestamp: int, replica: str) -> LwwRegister[T]:
        """The register after a write of ``value`` at ``(timestamp, replica)``: that write when it is later."""
        other = LwwRegister(value, _check_int(timestamp, "a timestamp"), _check_replica(replica))
        return other if other._key() > self._key() else self

    def merge(self, other: LwwRegister[T]) -> LwwRegister[T]:
        return other if other._key() > self._key() else self


@dataclass(frozen=True, slots=True)
class Version(Generic[T]):
    """One of the concurrent versions: a value, the vector it was written with (its origin's, after the write),
    and the replica that wrote it."""

    value: T
    vector: VersionVector
    replica: str


@dataclass(frozen=True, slots=True)
class ConcurrentVersions(Generic[T]):
    """A value whose concurrent writes are all kept (Eventuate's ``ConcurrentVersions``): a write replaces the
    versions its vector has seen (those before it) and stays beside those it is concurrent with. One version: no
    conflict. Several: a conflict, which a later command resolves by writing the value it chooses (that write has
    seen them all, so it replaces them). Nothing is dropped that no write has seen.

    ``update(value, ctx.origin_version, ctx.origin_replica)`` in the event handler: the origin's vector, not the
    replica's (which has merged in what the replica held, so would seem to have seen the local versions)."""

    versions: tuple[Version[T], ...] = ()

    @property
    def conflict(self) -> bool:
        return len(self.versions) > 1

    @property
    def values(self) -> tuple[T, ...]:
        return tuple(v.value for v in self.versions)

    @property
    def value(self) -> T:
        """The one value; raises :class:`~pgjournal.errors.InvalidArgument` when there is none or a conflict."""
        if len(self.versions) != 1:
            raise InvalidArgument(f"{len(self.versions)} concurrent versions {self.values!r}, not one: resolve the "
                                  "conflict by writing the value to keep")
        return self.versions[0].value

    def update(self, value: T, vector: VersionVector, replica: str) -> ConcurrentVersions[T]:
        if not isinstance(vector, VersionVector):
            raise InvalidArgument(f"a version's vector must be a VersionVector, got {vector!r}")
        kept: list[Version[T]] = []
        for version in self.versions:
            order = version.vector.compare(vector)
            if order in (Ordering.BEFORE, Ordering.SAME):
                continue  # seen by the new write: replaced
            if order is Ordering.AFTER:
                return self  # the new write is older than a version kept (it cannot arrive so in causal order)
            kept.append(version)
        kept.append(Version(value, vector, _check_replica(replica)))
        # One order whatever the arrival order, so equal sets of versions are equal values.
        kept.sort(key=lambda v: (java_order(v.replica), v.vector.entries))
        return ConcurrentVersions(tuple(kept))
