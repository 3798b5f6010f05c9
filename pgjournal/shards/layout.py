"""Which database holds which slices: the settings naming each database's DSN, checked against Akka R2DBC's
data-partition layout, and the layout recorded in the databases (docs/sharding.md).

Akka's database of a slice (``R2dbcSettings.connectionFactorySettings(slice)``) is ``dataPartition(slice) /
(partitions / databases)`` with ``dataPartition(slice) = slice / (1024 / partitions)``; both counts are powers
of two, so it is ``slice / (1024 / databases)``: it depends on the number of databases only.
"""

from __future__ import annotations

import bisect
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pgjournal.errors import ConfigurationError, InvalidArgument, SchemaNotMigrated, ShardLayoutMismatch
from pgjournal.model.slices import NUMBER_OF_SLICES, check_slice_range, parse_slice_range, slice_ranges
from pgjournal.server.dsn import SHARDS_ENV as SHARDS_ENV  # the databases, named beside PGJOURNAL_DSN
from pgjournal.server.dsn import check_dsn, mask_dsn

SliceRange = tuple[int, int]
#: The key of a database holding no range in ``PGJOURNAL_SHARDS`` and ``--shard`` (``spare=DSN``).
SPARE = "spare"
#: The key prefix of a database's hot standby in the text form: ``replica:0-511=DSN``.
REPLICA = "replica:"


def akka_database_index(slice_: int, databases: int) -> int:
    """Akka R2DBC's database (connection factory) of ``slice_`` among ``databases``: ``slice / (1024 / n)``."""
    return slice_ // (NUMBER_OF_SLICES // databases)


def akka_data_partition(slice_: int, partitions: int) -> int:
    """Akka R2DBC's data partition (the table suffix ``event_journal_<p>``) of ``slice_``."""
    return slice_ // (NUMBER_OF_SLICES // partitions)


def format_range(bounds: SliceRange) -> str:
    return f"{bounds[0]}-{bounds[1]}"


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def aligned(bounds: SliceRange) -> bool:
    """A range a layout may hold: a power-of-two number of slices, starting at a multiple of that number (so
    every layout, before and after any move of such a range, is a tiling of aligned ranges)."""
    size = bounds[1] - bounds[0] + 1
    return _power_of_two(size) and bounds[0] % size == 0


def akka_compatible(ranges: Sequence[SliceRange]) -> bool:
    """Akka R2DBC can follow the layout: ``slice_ranges(n)``, n equal ranges in order (a move of part of a
    range makes layouts Akka's data partitions cannot express)."""
    return _power_of_two(len(ranges)) and list(ranges) == slice_ranges(len(ranges))


def check_ranges(ranges: Sequence[SliceRange]) -> tuple[SliceRange, ...]:
    """``ranges`` sorted, or :class:`ConfigurationError` naming the overlap, the gap, or a range that is not
    aligned (see :func:`aligned`). Akka's layouts (:func:`akka_compatible`) are the aligned tilings of equal
    ranges; the others are the layouts a move of part of a range leaves."""
    ordered = sorted(ranges)
    if not ordered:
        raise ConfigurationError("a sharded journal needs at least one database (RANGE=DSN), got none")
    expected = 0
    for previous, current in zip([None, *ordered], ordered, strict=False):
        if previous is not None and current[0] <= previous[1]:
            raise ConfigurationError(
                f"shard ranges {format_range(previous)} and {format_range(current)} overlap (slices "
                f"{format_range((current[0], min(previous[1], current[1])))} would be in two databases)")
        if current[0] > expected:
            raise ConfigurationError(f"slices {format_range((expected, current[0] - 1))} are in no shard range; "
                                     f"the ranges must cover 0-{NUMBER_OF_SLICES - 1}")
        expected = current[1] + 1
    if expected < NUMBER_OF_SLICES:
        raise ConfigurationError(f"slices {format_range((expected, NUMBER_OF_SLICES - 1))} are in no shard range; "
                                 f"the ranges must cover 0-{NUMBER_OF_SLICES - 1}")
    for bounds in ordered:
        if not aligned(bounds):
            raise ConfigurationError(
                f"shard range {format_range(bounds)} is not aligned: a range holds a power-of-two number of "
                "slices and starts at a multiple of it (e.g. 0-511, 512-767, 768-1023; Akka R2DBC's layouts are "
                "n equal ranges)")
    return tuple(ordered)


@dataclass(frozen=True)
class ShardSettings:
    """The databases of a sharded journal: ``ranges[i]`` is held by the database at ``dsns[i]``; ``spares``: the
    DSNs of databases holding no range yet (a move's future target), which the journal opens too so that it can
    follow a move to one of them without new settings (docs/sharding.md, section 8); ``replicas``: (DSN, standby
    DSN) pairs, a hot standby of a database for its by-slice reads (``Journal.open(dsn, replica=)``, section 7)."""

    ranges: tuple[SliceRange, ...]
    dsns: tuple[str, ...]
    spares: tuple[str, ...] = ()
    replicas: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if len(self.ranges) != len(self.dsns):
            raise ConfigurationError(f"{len(self.ranges)} shard ranges but {len(self.dsns)} DSNs")
        if isinstance(self.spares, str):
            raise ConfigurationError(f"shard spares must be a list of DSNs, got the string {mask_dsn(self.spares)!r}")
        object.__setattr__(self, "spares", tuple(self.spares))
        seen: dict[str, SliceRange] = {}
        for bounds, dsn in zip(self.ranges, self.dsns, strict=True):
            check_dsn(dsn)
            if dsn in seen:
                raise ConfigurationError(f"shard ranges {format_range(seen[dsn])} and {format_range(bounds)} name "
                                         f"the same DSN {mask_dsn(dsn)!r}: each range needs its own database")
            seen[dsn] = bounds
        spares: set[str] = set()
        for dsn in self.spares:
            check_dsn(dsn)
            if dsn in seen:
                raise ConfigurationError(f"the spare DSN {mask_dsn(dsn)!r} is also the DSN of shard range "
                                         f"{format_range(seen[dsn])}: a spare is a database holding no range")
            if dsn in spares:
                raise ConfigurationError(f"the spare DSN {mask_dsn(dsn)!r} is given twice")
            spares.add(dsn)
        standbys: set[str] = set()
        for primary, standby in self.replicas:
            check_dsn(standby)
            if primary not in seen and primary not in spares:
                raise ConfigurationError(f"the replica {mask_dsn(standby)!r} is given for {mask_dsn(primary)!r}, "
                                         "which is no database of these settings")
            if standby in seen or standby in spares or standby in standbys:
                raise ConfigurationError(f"the replica DSN {mask_dsn(standby)!r} is given twice, or is also a "
                                         "database's DSN: each database has its own standby")
            standbys.add(standby)
        if len({primary for primary, _ in self.replicas}) != len(self.replicas):
            raise ConfigurationError("a database is given two replicas: one standby per database")
        ordered = check_ranges(self.ranges)
        if ordered != self.ranges:  # keep the DSNs with their ranges, in slice order
            pairs = sorted(zip(self.ranges, self.dsns, strict=True))
            object.__setattr__(self, "ranges", tuple(r for r, _ in pairs))
            object.__setattr__(self, "dsns", tuple(d for _, d in pairs))

    @classmethod
    def of(cls, databases: Mapping[str, str] | Sequence[str], spares: Sequence[str] = (),
           replicas: Mapping[str, str] | None = None) -> ShardSettings:
        """From ``{"0-511": dsn, "512-1023": dsn}`` or from a list of DSNs, database ``i`` holding Akka's range
        ``i`` (the order of ``connection-factory-<a>-<b>``); ``spares``: databases holding no range;
        ``replicas``: ``{"0-511": standby_dsn}``, the hot standby of the database of a range (see the class)."""
        if isinstance(databases, str):
            raise ConfigurationError("shard databases must be a mapping of RANGE to DSN or a list of DSNs, "
                                     f"got the string {mask_dsn(databases)!r}")
        if isinstance(databases, Mapping):
            ranges = tuple(_range_key(text) for text in databases)
            dsns = tuple(databases.values())
        else:
            dsns = tuple(databases)
            if not _power_of_two(len(dsns)):
                raise ConfigurationError(
                    f"{len(dsns)} databases: the number of databases must be a power of two dividing "
                    f"{NUMBER_OF_SLICES} (Akka R2DBC's data-partition.number-of-databases), e.g. 1, 2, 4, 8")
            ranges = tuple(slice_ranges(len(dsns)))
        pairs = []
        for text, standby in (replicas or {}).items():
            bounds = _range_key(text)
            if bounds not in ranges:
                raise ConfigurationError(f"the replica of shard range {text!r}: no database holds that range (the "
                                         f"ranges are {', '.join(map(format_range, ranges))})")
            pairs.append((dsns[ranges.index(bounds)], standby))
        return cls(ranges, dsns, tuple(spares), tuple(pairs))

    def replica_of(self, dsn: str) -> str | None:
        """The hot standby given for the database at ``dsn`` (``None``: its by-slice reads stay on it)."""
        return next((standby for primary, standby in self.replicas if primary == dsn), None)

    @classmethod
    def parse(cls, text: str) -> ShardSettings:
        """``RANGE=DSN`` entries, one per line or separated by ``;`` (the form of :data:`SHARDS_ENV`); a database
        holding no range is given as ``spare=DSN`` (as often as there are spares)."""
        entries: dict[str, str] = {}
        spares: list[str] = []
        replicas: dict[str, str] = {}
        for line in text.replace(";", "\n").splitlines():
            if not line.strip():
                continue
            bounds, sep, dsn = line.strip().partition("=")
            if not sep:
                raise ConfigurationError(f"shard entry {mask_dsn(line.strip())!r} must look like RANGE=DSN, "
                                         "e.g. 0-511=postgresql://host/db")
            key = bounds.strip()
            if key.lower() == SPARE:
                spares.append(dsn.strip())
                continue
            target = entries
            if key.lower().startswith(REPLICA):
                target, key = replicas, key[len(REPLICA):].strip()
            if key in target:
                raise ConfigurationError(f"shard {'replica of range' if target is replicas else 'range'} {key!r} is "
                                         "given twice")
            target[key] = dsn.strip()
        return cls.of(entries, spares, replicas)

    @classmethod
    def from_env(cls) -> ShardSettings:
        text = os.environ.get(SHARDS_ENV)
        if text is None or not text.strip():
            raise ConfigurationError(f"{SHARDS_ENV} is not set: give the databases as RANGE=DSN, one per line")
        return cls.parse(text)

    @property
    def count(self) -> int:
        return len(self.ranges)

    @property
    def akka_compatible(self) -> bool:
        return akka_compatible(self.ranges)

    def index_of(self, slice_: int) -> int:
        """The database holding ``slice_`` (Akka's formula when the layout is Akka's)."""
        if self.akka_compatible:
            return akka_database_index(slice_, self.count)
        return bisect.bisect_right(self.ranges, (slice_, NUMBER_OF_SLICES)) - 1

    def index_of_range(self, min_slice: int, max_slice: int) -> int:
        """The one database holding ``min_slice..max_slice``; :class:`InvalidArgument` for a range across
        databases (as Akka refuses a range across data partitions)."""
        check_slice_range(min_slice, max_slice)
        first, last = self.index_of(min_slice), self.index_of(max_slice)
        if first != last:
            held = [format_range(self.ranges[i]) for i in range(first, last + 1)]
            raise InvalidArgument(
                f"slice range {min_slice}-{max_slice} spans {len(held)} databases ({', '.join(held)}): a query "
                "reads one database; run one query per database range (ranges_within), or at least "
                f"{self.count} projection instances")
        return first

    def ranges_within(self, min_slice: int, max_slice: int) -> list[SliceRange]:
        """``min_slice..max_slice`` cut at the databases' boundaries: one sub-range per database."""
        check_slice_range(min_slice, max_slice)
        return [(max(lo, min_slice), min(hi, max_slice)) for lo, hi in self.ranges
                if lo <= max_slice and hi >= min_slice]

    def where(self, index: int) -> str:
        """A database named for messages: its range and masked DSN."""
        return f"{format_range(self.ranges[index])} ({mask_dsn(self.dsns[index])})"


# -- the layout record --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """A layout as recorded: its version and, per range in slice order, the id of the database holding it."""

    version: int
    members: tuple[tuple[SliceRange, uuid.UUID], ...]

    @property
    def ranges(self) -> tuple[SliceRange, ...]:
        return tuple(bounds for bounds, _ in self.members)

    def text(self) -> str:
        """The canonical form stored in ``layout``: ``0-511=<uuid>;512-1023=<uuid>``."""
        return ";".join(f"{format_range(bounds)}={member}" for bounds, member in self.members)

    @classmethod
    def parse(cls, version: int, text: str) -> Layout:
        members = []
        try:
            for entry in text.split(";"):
                bounds, _, member = entry.partition("=")
                members.append((parse_slice_range(bounds), uuid.UUID(member)))
        except (InvalidArgument, ValueError):
            raise ShardLayoutMismatch(f"unreadable shard layout record {text!r} (version {version})") from None
        return cls(version, tuple(members))

    @classmethod
    def new(cls, settings: ShardSettings) -> Layout:
        """Version 1 of the settings' layout, each database with a new id."""
        return cls(1, tuple((bounds, uuid.uuid4()) for bounds in settings.ranges))


@dataclass(frozen=True)
class Record:
    """What one database records: the layout and its own id."""

    layout: Layout
    database_id: uuid.UUID
    state: str = "stable"


def _range_key(text: str) -> SliceRange:
    try:
        return parse_slice_range(text)
    except InvalidArgument as exc:
        raise ConfigurationError(f"shard range {text!r}: {exc} (a database holding no range yet is given as "
                                 f"{SPARE}=DSN, a database's hot standby as {REPLICA}RANGE=DSN)") from None


def agreed_layout(settings: ShardSettings, records: Sequence[Record | None]) -> Layout:
    """The layout every database records, checked against the settings; :class:`ShardLayoutMismatch` naming
    what differs. ``records[i]`` is the record of the database at ``settings.dsns[i]``; ``None``: it has none
    (raises :class:`SchemaNotMigrated` then, naming the command that writes it)."""
    missing = [settings.where(i) for i, record in enumerate(records) if record is None]
    if missing:
        raise SchemaNotMigrated(f"no shard layout record in the database(s) of {', '.join(missing)}; run "
                                "`pgjournal shard migrate` (pgjournal.shards.migrate_all) with these settings")
    present = [record for record in records if record is not None]
    first = present[0].layout
    for i, record in enumerate(present):
        if record.layout != first:
            raise ShardLayoutMismatch(
                f"the databases disagree about the shard layout: {settings.where(0)} records version "
                f"{first.version} ({_ranges(first)}), {settings.where(i)} records version "
                f"{record.layout.version} ({_ranges(record.layout)}); a layout change is half done")
    if first.ranges != settings.ranges:
        raise ShardLayoutMismatch(
            f"the settings name ranges {', '.join(map(format_range, settings.ranges))} but the databases record "
            f"{_ranges(first)} (version {first.version}): use the recorded layout")
    for i, record in enumerate(present):
        expected = first.members[i][1]
        if record.database_id != expected:
            holder = next((format_range(b) for b, m in first.members if m == record.database_id), None)
            what = (f"the database the layout puts on {holder}" if holder is not None
                    else "a database that is not in the layout")
            raise ShardLayoutMismatch(f"the DSN given for {settings.where(i)} reaches {what} (database id "
                                      f"{record.database_id}, expected {expected}): DSNs swapped or wrong")
    return first


def _ranges(layout: Layout) -> str:
    return ", ".join(map(format_range, layout.ranges))

