"""Replicated entities' data model and rules, without I/O: Akka's Replicated Event Sourcing, bit-exact.

A replicated entity has one persistence id per replica (location), ``Type|entityId|replicaId``
(:class:`ReplicationId`). Every event in a replica's persistence id carries a :class:`ReplicatedEventMetadata`:
the replica where it was first written (its origin) and its sequence number there, the version vector of the
replica after it, and whether it was concurrent with the replica's state when it arrived. The rules are Akka's
``Running.scala`` (``akka-persistence-typed``), each written once here (:class:`ReplicaState`):

- **a local event** (``handleEventPersist``): its origin is this replica, its origin seq_nr its seq_nr here, its
  vector the replica's with this replica's entry *set to* that seq_nr (not incremented: replicated events count in
  the seq_nr too), never concurrent;
- **a replicated event** (``handleExternalReplicatedEventPersist``), appended with this replica's next seq_nr:
  concurrent when neither its vector nor the replica's dominates, decided once at arrival and stored; its stored
  vector is the merge (pointwise max) of both; its origin and origin seq_nr kept;
- **seen** (``alreadySeen``): an event whose origin is this replica, or whose origin seq_nr is at most the highest
  one this replica holds from that origin, is dropped;
- **recovery** (``ReplayingEvents``): the vector is the last event's, seen per origin the last origin seq_nr of
  each other origin; an event without replication metadata (written before the entity was replicated) counts as a
  local event whose vector is ``{replica: seq_nr}``; a snapshot's :class:`ReplicatedSnapshotMetadata` holds both.

Version vectors compare as Akka's ``VersionVector.compareTo``: SAME, BEFORE, AFTER or CONCURRENT, a missing entry
counting as 0. Akka's code treats a key present with a version below 1 unlike an absent one in some of its paths;
it never writes one (versions are sequence numbers), so a vector here refuses them, which makes Akka's compare and
merge exactly the pointwise ones. Keys are ordered as Java's ``String.compareTo`` (UTF-16 code units, Akka's
``TreeMap``), which is the order of the entries on the wire.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pgjournal.codec import replicated as wire
from pgjournal.errors import InvalidArgument, InvalidPersistenceId, SerializationError
from pgjournal.model.slots import filled, setters
from pgjournal.validation import check_persistence_id

SEPARATOR = "|"
_T = TypeVar("_T")




# -- replication ids ------------------------------------------------------------------------------------


def _part(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidPersistenceId(f"{what} must be a string, got {type(value).__name__} {value!r}")
    if not value:
        raise InvalidPersistenceId(f"{what} must not be empty")
    if SEPARATOR in value:
        raise InvalidPersistenceId(f"{what} {value!r} contains {SEPARATOR!r}, which separates the parts of a "
                                   "replicated persistence id")
    return value


@dataclass(frozen=True, slots=True)
class ReplicationId:
    """Akka's ``ReplicationId``: an entity type, an entity id and a replica id, whose persistence id is
    ``Type|entityId|replicaId``. No part may be empty or contain ``|`` (Akka refuses ``|`` in each; it also lets an
    empty replica id stand for an entity not yet replicated, ``Type|entityId``, which here is a plain persistence id,
    not a replication id)."""

    type_name: str
    entity_id: str
    replica_id: str

    def __post_init__(self) -> None:
        _part(self.type_name, "the entity type of a replication id")
        _part(self.entity_id, "the entity id of a replication id")
        _part(self.replica_id, "the replica id of a replication id")
        check_persistence_id(self.persistence_id)

    @property
    def persistence_id(self) -> str:
        return f"{self.type_name}{SEPARATOR}{self.entity_id}{SEPARATOR}{self.replica_id}"

    def with_replica(self, replica_id: str) -> ReplicationId:
        """The same entity's persistence id in another replica."""
        return ReplicationId(self.type_name, self.entity_id, replica_id)

    @classmethod
    def parse(cls, persistence_id: str) -> ReplicationId:
        """``Type|entityId|replicaId`` back into its parts; anything else raises
        :class:`~pgjournal.errors.InvalidPersistenceId` naming it."""
        check_persistence_id(persistence_id)
        parts = persistence_id.split(SEPARATOR)
        if len(parts) != 3:
            raise InvalidPersistenceId(
                f"a replicated persistence id is Type{SEPARATOR}entityId{SEPARATOR}replicaId (exactly two "
                f"{SEPARATOR!r}), got {persistence_id!r} with {len(parts) - 1}")
        return cls(*parts)

    def __str__(self) -> str:
        return self.persistence_id


def is_replication_id(persistence_id: str) -> bool:
    """Whether ``persistence_id`` has the shape of a replicated one (Akka's ``isReplicationId``: two ``|``)."""
    return persistence_id.count(SEPARATOR) == 2


def _check_replica(value: Any, what: str = "a replica id") -> str:
    if not isinstance(value, str) or not value or SEPARATOR in value:
        raise InvalidArgument(f"{what} must be a non-empty string without {SEPARATOR!r}, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} must be valid Unicode (no lone surrogates), got {value!r}") from None
    return value


def _check_version(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= wire.INT64_MAX:
        raise InvalidArgument(f"{what} must be an int from 1 to {wire.INT64_MAX}, got {value!r}")
    return value


def java_order(key: str) -> bytes:
    """The sort key that orders strings as Java's ``String.compareTo``: by UTF-16 code units (which differs from
    Python's code-point order for characters above U+FFFF against U+E000..U+FFFF)."""
    return key.encode("utf-16-be", "surrogatepass")


# -- version vectors ------------------------------------------------------------------------------------


class Ordering(enum.Enum):
    """How one version vector relates to another (Akka's ``VersionVector.Ordering``)."""

    SAME = "same"
    BEFORE = "before"
    AFTER = "after"
    CONCURRENT = "concurrent"


@dataclass(frozen=True, slots=True, init=False)
class VersionVector:
    """A vector clock over replica ids, immutable: ``entries`` are ``(replica, version)`` in Java's key order,
    each version at least 1. ``VersionVector({"A": 2, "B": 1})``; ``VersionVector()`` is empty."""

    entries: tuple[tuple[str, int], ...]
    _versions: dict[str, int] = field(compare=False, repr=False, hash=False)

    def __init__(self, versions: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        items = versions.items() if isinstance(versions, Mapping) else versions
        checked: dict[str, int] = {}
        for key, version in items:
            checked[_check_replica(key, "a version vector's key")] = _check_version(
                version, f"the version of {key!r} in a version vector")
        entries = tuple(sorted(checked.items(), key=lambda kv: java_order(kv[0])))
        object.__setattr__(self, "entries", entries)
        object.__setattr__(self, "_versions", dict(entries))

    @classmethod
    def _of(cls, entries: tuple[tuple[str, int], ...]) -> VersionVector:
        """A vector of ``entries`` already checked and in Java's key order (the rules' results: no check again)."""
        return filled(cls, _VECTOR, entries, dict(entries))

    def __repr__(self) -> str:
        return f"VersionVector({self._versions!r})"

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def version_at(self, replica: str) -> int:
        """The version of ``replica``, 0 when absent."""
        return self._versions.get(replica, 0)

    def as_dict(self) -> dict[str, int]:
        return dict(self._versions)

    def increment(self, replica: str) -> VersionVector:
        """``replica``'s version plus one (Akka's ``increment``)."""
        return self.updated(replica, self.version_at(replica) + 1)

    def updated(self, replica: str, version: int) -> VersionVector:
        """``replica``'s version set to ``version`` (Akka's ``updated``; a local write's rule)."""
        if replica not in self._versions:
            return VersionVector({**self._versions, replica: version})
        _check_version(version, f"the version of {replica!r} in a version vector")
        return VersionVector._of(tuple((key, version if key == replica else mine) for key, mine in self.entries))

    def merge(self, other: VersionVector) -> VersionVector:
        """The pointwise maximum over both vectors' keys (Akka's ``merge``)."""
        merged = dict(self._versions)
        changed = added = False
        for key, version in other.entries:
            mine = merged.get(key)
            if mine is None:
                added = True
            elif version <= mine:
                continue
            merged[key] = version
            changed = True
        if not changed:
            return self
        # Raised versions keep the keys' order; only a new key sorts them again.
        entries = tuple(sorted(merged.items(), key=lambda kv: java_order(kv[0])) if added else merged.items())
        return VersionVector._of(entries)

    def compare(self, other: VersionVector) -> Ordering:
        """SAME when every version is equal, BEFORE when none is greater here and one is smaller, AFTER the other
        way round, else CONCURRENT (Akka's ``compareTo``)."""
        mine, theirs = self._versions, other._versions
        less = greater = False
        for key, version in mine.items():
            their = theirs.get(key, 0)
            if version < their:
                less = True
            elif version > their:
                greater = True
        if not less and any(key not in mine for key in theirs):  # their versions are at least 1: greater there
            less = True
        if less and greater:
            return Ordering.CONCURRENT
        if less:
            return Ordering.BEFORE
        return Ordering.AFTER if greater else Ordering.SAME

    def concurrent_with(self, other: VersionVector) -> bool:
        """Neither vector dominates (Akka's ``<>``)."""
        return self.compare(other) is Ordering.CONCURRENT

    def dominates(self, other: VersionVector) -> bool:
        """Every version here is at least the other's and one is greater (Akka's ``>``)."""
        return self.compare(other) is Ordering.AFTER

    def to_bytes(self) -> bytes:
        """Akka's ``VersionVector`` message (40 / ``DA``)."""
        return wire.encode_version_vector(self.entries)

    @classmethod
    def from_bytes(cls, payload: bytes) -> VersionVector:
        return _decoding(wire.VERSION_VECTOR, lambda: cls(wire.decode_version_vector(payload)))


EMPTY = VersionVector()
_VECTOR = setters(VersionVector, "entries", "_versions")


# -- metadata -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicatedEventMetadata:
    """Akka's ``ReplicatedEventMetadata``: where an event was first written, its seq_nr there, the replica's
    version vector after it, and whether it was concurrent with the replica's state when it arrived."""

    origin_replica: str
    origin_sequence_nr: int
    version: VersionVector
    concurrent: bool

    def __post_init__(self) -> None:
        _check_replica(self.origin_replica, "the origin replica")
        _check_version(self.origin_sequence_nr, "the origin sequence number")
        if not isinstance(self.version, VersionVector):
            raise InvalidArgument(f"version must be a VersionVector, got {self.version!r}")
        if not isinstance(self.concurrent, bool):
            raise InvalidArgument(f"concurrent must be a bool, got {self.concurrent!r}")

    def to_bytes(self) -> bytes:
        """The payload Akka stores under 40 / ``RE``."""
        return wire.encode_event_metadata(wire.EventMetadataFields(
            self.origin_replica, self.origin_sequence_nr, self.version.entries, self.concurrent))

    @classmethod
    def from_bytes(cls, payload: bytes) -> ReplicatedEventMetadata:
        def decode() -> ReplicatedEventMetadata:
            fields = wire.decode_event_metadata(payload)
            return cls(fields.origin_replica, fields.origin_sequence_nr, VersionVector(fields.version),
                       fields.concurrent)
        return _decoding(wire.EVENT_METADATA, decode)


@dataclass(frozen=True, slots=True)
class ReplicatedSnapshotMetadata:
    """Akka's ``ReplicatedSnapshotMetadata``: the replica's vector and its highest origin seq_nr per other replica
    at the snapshot. Encoded with the seen entries in Java's key order (Akka writes its map's iteration order,
    which a reader does not depend on)."""

    version: VersionVector
    seen_per_replica: Mapping[str, int]

    def __post_init__(self) -> None:
        if not isinstance(self.version, VersionVector):
            raise InvalidArgument(f"version must be a VersionVector, got {self.version!r}")
        seen = {_check_replica(r, "a seen replica id"): _check_version(s, f"the seq_nr seen of {r!r}")
                for r, s in dict(self.seen_per_replica).items()}
        object.__setattr__(self, "seen_per_replica", _FrozenMap(seen))

    def to_bytes(self) -> bytes:
        """The payload Akka stores under 40 / ``RS``."""
        seen = sorted(self.seen_per_replica.items(), key=lambda kv: java_order(kv[0]))
        return wire.encode_snapshot_metadata(wire.SnapshotMetadataFields(self.version.entries, tuple(seen)))

    @classmethod
    def from_bytes(cls, payload: bytes) -> ReplicatedSnapshotMetadata:
        def decode() -> ReplicatedSnapshotMetadata:
            fields = wire.decode_snapshot_metadata(payload)
            return cls(VersionVector(fields.version), dict(fields.seen_per_replica))
        return _decoding(wire.SNAPSHOT_METADATA, decode)


_METADATA = setters(ReplicatedEventMetadata, "origin_replica", "origin_sequence_nr", "version", "concurrent")


def _metadata(origin: str, origin_seq_nr: int, version: VersionVector, concurrent: bool) -> ReplicatedEventMetadata:
    """Metadata the rules make of parts already checked (no check again: they run once per event)."""
    return filled(ReplicatedEventMetadata, _METADATA, origin, origin_seq_nr, version, concurrent)


def local_event_metadata(replica: str, seq_nr: int) -> ReplicatedEventMetadata:
    """What an event stored without replication metadata counts as (written at ``replica`` before the entity was
    replicated): origin ``replica`` at ``seq_nr``, the vector ``{replica: seq_nr}``, not concurrent."""
    _check_replica(replica)
    _check_version(seq_nr, "a sequence number")
    return _metadata(replica, seq_nr, VersionVector._of(((replica, seq_nr),)), False)


class _FrozenMap(Mapping[str, int]):
    """A read-only mapping that hashes and compares by its items."""

    __slots__ = ("_items",)

    def __init__(self, items: dict[str, int]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> int:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other.items())

    def __repr__(self) -> str:
        return repr(self._items)


def _decoding(manifest: str, decode: Callable[[], _T]) -> _T:
    """Run ``decode``; bytes that are not the message, or hold values Akka never writes, raise
    :class:`~pgjournal.errors.SerializationError` naming the serializer and manifest."""
    try:
        return decode()
    except (ValueError, InvalidArgument) as error:
        raise SerializationError(f"not Akka's replicated metadata ({wire.REPLICATED_EVENT_SOURCING} / "
                                 f"{manifest!r}): {error}", ser_id=wire.REPLICATED_EVENT_SOURCING,
                                 manifest=manifest) from error


class ReplicatedEventSourcingSerializer:
    """Akka's serializer 40 for a :class:`~pgjournal.codec.serialization.SerializerRegistry`: rows whose metadata
    Akka wrote (40 / ``RE``, ``RS``, ``DA``) read as these values, and these values are written as Akka writes them::

        registry.register_serializer(REPLICATED_EVENT_SOURCING, ReplicatedEventSourcingSerializer(),
                                     ReplicatedEventMetadata, ReplicatedSnapshotMetadata, VersionVector)

    Akka's ``Counter`` and ``ORSet`` under the same id are not values here yet: their manifests raise."""

    def to_binary(self, obj: Any) -> tuple[str, bytes]:
        if isinstance(obj, ReplicatedEventMetadata):
            return wire.EVENT_METADATA, obj.to_bytes()
        if isinstance(obj, ReplicatedSnapshotMetadata):
            return wire.SNAPSHOT_METADATA, obj.to_bytes()
        if isinstance(obj, VersionVector):
            return wire.VERSION_VECTOR, obj.to_bytes()
        raise SerializationError(f"Akka's serializer {wire.REPLICATED_EVENT_SOURCING} does not write "
                                 f"{type(obj).__qualname__} values")

    def from_binary(self, payload: bytes, manifest: str) -> Any:
        if manifest == wire.EVENT_METADATA:
            return ReplicatedEventMetadata.from_bytes(payload)
        if manifest == wire.SNAPSHOT_METADATA:
            return ReplicatedSnapshotMetadata.from_bytes(payload)
        if manifest == wire.VERSION_VECTOR:
            return VersionVector.from_bytes(payload)
        raise SerializationError(
            f"manifest {manifest!r} of Akka's serializer {wire.REPLICATED_EVENT_SOURCING} is not read here; "
            f"expected {wire.EVENT_METADATA!r}, {wire.SNAPSHOT_METADATA!r} or {wire.VERSION_VECTOR!r}",
            ser_id=wire.REPLICATED_EVENT_SOURCING, manifest=manifest)


def event_metadata_columns(metadata: ReplicatedEventMetadata,
                           others: Iterable[wire.MetadataEntry] = ()) -> tuple[int, str, bytes]:
    """``(meta_ser_id, meta_ser_manifest, meta_payload)`` as Akka R2DBC stores them: 40 / ``RE`` alone, or Akka's
    composite 34 / ``M`` with the replication metadata first when ``others`` ride along."""
    own = metadata.to_bytes()
    rest = tuple(others)
    if not rest:
        return wire.REPLICATED_EVENT_SOURCING, wire.EVENT_METADATA, own
    first = wire.MetadataEntry(wire.REPLICATED_EVENT_SOURCING, wire.EVENT_METADATA, own)
    return wire.PAYLOAD, wire.COMPOSITE_METADATA, wire.encode_composite((first, *rest))


def event_metadata_of(ser_id: int | None, manifest: str | None,
                      payload: bytes | None) -> tuple[ReplicatedEventMetadata | None, tuple[wire.MetadataEntry, ...]]:
    """The replication metadata in a row's ``meta_*`` columns (``None`` when there is none) and the other entries
    of a composite (Akka's ``CompositeMetadata.extract``: the first entry of the type)."""
    if ser_id is None or payload is None:
        return None, ()
    manifest = manifest or ""
    if ser_id == wire.REPLICATED_EVENT_SOURCING and manifest == wire.EVENT_METADATA:
        return ReplicatedEventMetadata.from_bytes(payload), ()
    if ser_id == wire.PAYLOAD and manifest == wire.COMPOSITE_METADATA:
        try:
            entries = wire.decode_composite(payload)
        except ValueError as error:
            raise SerializationError(f"not Akka's composite metadata ({wire.PAYLOAD} / "
                                     f"{wire.COMPOSITE_METADATA!r}): {error}", ser_id=ser_id,
                                     manifest=manifest) from error
        found: ReplicatedEventMetadata | None = None
        others = []
        for entry in entries:
            if found is None and (entry.ser_id, entry.manifest) == (wire.REPLICATED_EVENT_SOURCING,
                                                                    wire.EVENT_METADATA):
                found = ReplicatedEventMetadata.from_bytes(entry.payload)
            else:
                others.append(entry)
        return found, tuple(others)
    return None, (wire.MetadataEntry(ser_id, manifest, bytes(payload)),)


# -- the rules ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """What a replica of one entity knows of replication after its last event: its replica id, its last seq_nr,
    its version vector and the highest origin seq_nr it holds from each other replica. Every method returns a new
    state; none does I/O."""

    replica: str
    seq_nr: int = 0
    version: VersionVector = EMPTY
    seen: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_replica(self.replica)
        if isinstance(self.seq_nr, bool) or not isinstance(self.seq_nr, int) or self.seq_nr < 0:
            raise InvalidArgument(f"a replica's seq_nr must be an int of at least 0, got {self.seq_nr!r}")
        object.__setattr__(self, "seen", _FrozenMap(dict(self.seen)))

    def write_local(self) -> tuple[ReplicaState, ReplicatedEventMetadata]:
        """A new event written here: its metadata, and the state after it."""
        seq_nr = self.seq_nr + 1
        version = self.version.updated(self.replica, seq_nr)
        return _state(self.replica, seq_nr, version, self.seen), _metadata(self.replica, seq_nr, version, False)

    def has_seen(self, metadata: ReplicatedEventMetadata) -> bool:
        """Whether an arriving event is already here: written here, or at most the highest origin seq_nr held
        from its origin."""
        return (metadata.origin_replica == self.replica
                or metadata.origin_sequence_nr <= self.seen.get(metadata.origin_replica, 0))

    def receive(self, metadata: ReplicatedEventMetadata) -> tuple[ReplicaState, ReplicatedEventMetadata] | None:
        """An event arriving from another replica, with the metadata it has there: ``None`` when seen (drop it),
        else the metadata to store with it here (vector merged, concurrent decided now) and the state after it."""
        if self.has_seen(metadata):
            return None
        stored = _metadata(metadata.origin_replica, metadata.origin_sequence_nr, metadata.version.merge(self.version),
                           metadata.version.concurrent_with(self.version))
        return _state(self.replica, self.seq_nr + 1, stored.version, self.seen,
                      (metadata.origin_replica, metadata.origin_sequence_nr)), stored

    def replay(self, seq_nr: int, metadata: ReplicatedEventMetadata | None) -> ReplicaState:
        """The state after a stored event, in recovery; an event stored without replication metadata counts as
        written here with the vector ``{replica: seq_nr}``."""
        if isinstance(seq_nr, bool) or not isinstance(seq_nr, int) or seq_nr <= self.seq_nr:
            raise InvalidArgument(f"a replayed event's seq_nr must be above {self.seq_nr}, got {seq_nr!r}")
        if metadata is None:
            return _state(self.replica, seq_nr, local_event_metadata(self.replica, seq_nr).version, self.seen)
        raised = None if metadata.origin_replica == self.replica else (metadata.origin_replica,
                                                                      metadata.origin_sequence_nr)
        return _state(self.replica, seq_nr, metadata.version, self.seen, raised)

    @classmethod
    def from_snapshot(cls, replica: str, seq_nr: int, metadata: ReplicatedSnapshotMetadata | None) -> ReplicaState:
        """The state a snapshot at ``seq_nr`` restores (empty vector and seen when it has no replication
        metadata, as Akka)."""
        if metadata is None:
            return cls(replica, seq_nr)
        return cls(replica, seq_nr, metadata.version, metadata.seen_per_replica)

    def snapshot_metadata(self) -> ReplicatedSnapshotMetadata:
        """What a snapshot of this state stores."""
        return ReplicatedSnapshotMetadata(self.version, self.seen)


_STATE = setters(ReplicaState, "replica", "seq_nr", "version", "seen")


def _state(replica: str, seq_nr: int, version: VersionVector, seen: Mapping[str, int],
           raised: tuple[str, int] | None = None) -> ReplicaState:
    """The state the rules make of parts already checked, ``seen`` with ``raised`` (origin, seq_nr) set (no check
    again: they run once per event)."""
    if raised is None and isinstance(seen, _FrozenMap):
        frozen = seen  # read-only: shared
    else:
        items = dict(seen._items if isinstance(seen, _FrozenMap) else seen)
        if raised is not None:
            items[raised[0]] = raised[1]
        frozen = _FrozenMap(items)
    return filled(ReplicaState, _STATE, replica, seq_nr, version, frozen)


# -- composite metadata and arrival ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicatedComposite:
    """Akka's ``CompositeMetadata`` (34 / ``M``) whose first entry is the replication metadata (an event's, or a
    snapshot's): the value a row with other metadata beside it reads as, and the value to store it so. ``others``
    stay undecoded."""

    metadata: ReplicatedEventMetadata | ReplicatedSnapshotMetadata
    others: tuple[wire.MetadataEntry, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, ReplicatedEventMetadata | ReplicatedSnapshotMetadata):
            raise InvalidArgument(f"metadata must be a ReplicatedEventMetadata or ReplicatedSnapshotMetadata, got "
                                  f"{self.metadata!r}")
        object.__setattr__(self, "others", tuple(wire.MetadataEntry(*entry) for entry in self.others))

    @property
    def origin_version(self) -> VersionVector | None:
        """The origin's vector stored beside the metadata (40 / ``DA``), ``None`` when there is none."""
        for entry in self.others:
            if (entry.ser_id, entry.manifest) == (wire.REPLICATED_EVENT_SOURCING, wire.VERSION_VECTOR):
                return VersionVector.from_bytes(entry.payload)
        return None


class CompositeMetadataSerializer:
    """Akka's ``PayloadSerializer`` (34) for its manifest ``M``, for a registry: a composite whose entries hold
    replication metadata reads as a :class:`ReplicatedComposite`; its other manifests raise."""

    def to_binary(self, obj: Any) -> tuple[str, bytes]:
        if not isinstance(obj, ReplicatedComposite):
            raise SerializationError(f"Akka's serializer {wire.PAYLOAD} writes ReplicatedComposite values here, not "
                                     f"{type(obj).__qualname__}")
        if isinstance(obj.metadata, ReplicatedSnapshotMetadata):
            first = wire.MetadataEntry(wire.REPLICATED_EVENT_SOURCING, wire.SNAPSHOT_METADATA, obj.metadata.to_bytes())
            return wire.COMPOSITE_METADATA, wire.encode_composite((first, *obj.others))
        _, manifest, payload = event_metadata_columns(obj.metadata, obj.others)
        return manifest, payload

    def from_binary(self, payload: bytes, manifest: str) -> Any:
        if manifest != wire.COMPOSITE_METADATA:
            raise SerializationError(f"manifest {manifest!r} of Akka's serializer {wire.PAYLOAD} is not read here; "
                                     f"expected {wire.COMPOSITE_METADATA!r}", ser_id=wire.PAYLOAD, manifest=manifest)
        found, others = event_metadata_of(wire.PAYLOAD, manifest, payload)
        if found is not None:
            return ReplicatedComposite(found, others)
        for at, entry in enumerate(others):  # a snapshot's: its ReplicatedSnapshotMetadata, the first of the type
            if (entry.ser_id, entry.manifest) == (wire.REPLICATED_EVENT_SOURCING, wire.SNAPSHOT_METADATA):
                return ReplicatedComposite(ReplicatedSnapshotMetadata.from_bytes(entry.payload),
                                           others[:at] + others[at + 1:])
        raise SerializationError("Akka's composite metadata without a ReplicatedEventMetadata or "
                                 "ReplicatedSnapshotMetadata entry is not read here", ser_id=wire.PAYLOAD,
                                 manifest=manifest)


def register_replication_serializers(registry: Any) -> None:
    """Register serializers 40 (:class:`ReplicatedEventSourcingSerializer`) and 34
    (:class:`CompositeMetadataSerializer`) in a :class:`~pgjournal.codec.serialization.SerializerRegistry`, so
    replicated rows read and write as Akka's."""
    registry.register_serializer(wire.REPLICATED_EVENT_SOURCING, ReplicatedEventSourcingSerializer(),
                                 ReplicatedEventMetadata, ReplicatedSnapshotMetadata, VersionVector)
    registry.register_serializer(wire.PAYLOAD, CompositeMetadataSerializer(), ReplicatedComposite)


def peer_row_metadata(ser_id: int | None, manifest: str | None, payload: bytes | None, replica: str, seq_nr: int
                      ) -> tuple[ReplicatedEventMetadata, VersionVector, tuple[wire.MetadataEntry, ...]]:
    """A row of ``replica``'s persistence id read at a peer, as the arrival rule takes it: its replication metadata
    (:func:`local_event_metadata` for one stored without: written there before the entity was replicated), the
    vector it had at its origin (carried beside the metadata, 40 / ``DA``, else the metadata's own), and its other
    metadata entries, kept as they are."""
    found, others = event_metadata_of(ser_id, manifest, payload)
    if found is None:
        found = local_event_metadata(replica, seq_nr)
    origin = found.version
    kept: list[wire.MetadataEntry] = []
    for entry in others:
        if (entry.ser_id, entry.manifest) == (wire.REPLICATED_EVENT_SOURCING, wire.VERSION_VECTOR):
            origin = VersionVector.from_bytes(entry.payload)
        else:
            kept.append(entry)
    return found, origin, tuple(kept)


def split_metadata(value: Any) -> tuple[ReplicatedEventMetadata | None, VersionVector | None]:
    """The replication metadata of an envelope's decoded ``metadata`` and the origin's vector: the one stored beside
    it (40 / ``DA`` in a composite), else the event's own vector when it is the origin's (an event written at its
    origin, or an Akka row that carries no origin vector). ``(None, None)`` for an event without one."""
    if isinstance(value, ReplicatedComposite) and isinstance(value.metadata, ReplicatedEventMetadata):
        return value.metadata, value.origin_version or value.metadata.version
    if isinstance(value, ReplicatedEventMetadata):
        return value, value.version
    return None, None


@dataclass(frozen=True, slots=True)
class Arrival:
    """An arriving event's outcome at a replica: the state after it, the metadata stored with it, the origin's
    vector, and the row's ``(meta_ser_id, meta_ser_manifest, meta_payload)``."""

    state: ReplicaState
    metadata: ReplicatedEventMetadata
    origin_version: VersionVector

    @property
    def stored(self) -> ReplicatedEventMetadata | ReplicatedComposite:
        """The value to append as the row's metadata: the metadata alone (40 / ``RE``), or with the origin's
        vector beside it (34 / ``M``) when the stored vector is not the origin's."""
        if self.origin_version == self.metadata.version:
            return self.metadata
        return ReplicatedComposite(self.metadata, (wire.MetadataEntry(
            wire.REPLICATED_EVENT_SOURCING, wire.VERSION_VECTOR, self.origin_version.to_bytes()),))

    def columns(self) -> tuple[int, str, bytes]:
        """:attr:`stored` as the ``meta_*`` columns hold it."""
        stored = self.stored
        if isinstance(stored, ReplicatedComposite):
            return event_metadata_columns(self.metadata, stored.others)
        return event_metadata_columns(stored)


def arrival(state: ReplicaState, metadata: ReplicatedEventMetadata,
            origin_version: VersionVector | None = None) -> Arrival | None:
    """The arrival rule (:meth:`ReplicaState.receive`) with the origin's vector: ``None`` when seen, else what to
    store. ``origin_version`` is the vector the event had at its origin (:func:`split_metadata` of the row read at
    the peer); the flag is decided against it, so a relay that had seen both sides of a conflict does not hide it,
    and it is kept beside the metadata so the replicas after this one decide the same. ``None``: the vector the
    event arrived with (Akka's rule)."""
    origin = metadata.version if origin_version is None else origin_version
    received = state.receive(metadata if origin is metadata.version else _metadata(
        metadata.origin_replica, metadata.origin_sequence_nr, origin, metadata.concurrent))
    if received is None:
        return None
    after, stored = received
    if origin != metadata.version:  # the relay's additions, which causal order has brought here already
        merged = stored.version.merge(metadata.version)
        stored = _metadata(stored.origin_replica, stored.origin_sequence_nr, merged, stored.concurrent)
        after = _state(after.replica, after.seq_nr, merged, after.seen)
    return Arrival(after, stored, origin)
