"""The online move of a slice range to another database, as decisions without I/O (docs/sharding.md, section 6):
which move is asked for and whether it is allowed, the layout it leaves, and which step comes next given what the
databases' records say. :mod:`pgjournal.shards.move` runs the steps.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pgjournal.errors import InvalidArgument, ShardLayoutMismatch
from pgjournal.model.slices import parse_slice_range
from pgjournal.shards.layout import Layout, SliceRange, aligned, format_range
from pgjournal.store.shard_guard import Leaf


class MoveStep(enum.Enum):
    """What a record says is done (the value is what ``move_step`` holds). The target records its copy's
    progress, the source its seal; both record the switch."""

    PLANNED = "planned"        # both: the move is recorded; the target's copy starts at ``move_next_slice``
    COPIED = "copied"          # target: every chunk of the range copied once
    CAUGHT_UP = "caught_up"    # target: a catch-up pass copied fewer rows than the bound
    CHECKED = "checked"        # target: every slice's digest compared with the source's (before the seal)
    SEALED = "sealed"          # source: its guard no longer admits the range
    VERIFIED = "verified"      # target: the rows changed since the check copied, their digests equal
    SWITCHED = "switched"      # target, then source: the new layout recorded


class Action(enum.Enum):
    """The next thing the mover does."""

    PLAN = "plan"
    COPY = "copy"
    CATCH_UP = "catch up"
    CHECK = "check"
    SEAL = "seal"
    VERIFY = "verify"
    SWITCH = "switch"
    CLEAN_UP = "clean up"
    DONE = "done"


@dataclass(frozen=True)
class Move:
    """A move of ``moved`` from the database ``source`` (holding ``held``) to ``target``; ``before`` and
    ``after`` the layouts it goes between."""

    moved: SliceRange
    source: uuid.UUID
    target: uuid.UUID
    held: SliceRange
    before: Layout
    after: Layout

    @property
    def rest(self) -> SliceRange | None:
        """What the source keeps (``None``: it leaves the layout)."""
        return next((bounds for bounds, member in self.after.members if member == self.source), None)


def parse_moved_range(text: str) -> SliceRange:
    """``--slices A-B``: a range a layout may hold (:func:`~pgjournal.shards.layout.aligned`)."""
    bounds = parse_slice_range(text)
    if not aligned(bounds):
        size = bounds[1] - bounds[0] + 1
        raise InvalidArgument(
            f"slice range {format_range(bounds)} ({size} slices) is not aligned: a moved range holds a "
            "power-of-two number of slices and starts at a multiple of it, e.g. 512-767 or 768-1023")
    return bounds


def plan_move(before: Layout, moved: SliceRange, target: uuid.UUID) -> Move:
    """The move of ``moved`` to the database ``target`` from ``before``; :class:`InvalidArgument` naming why it
    cannot be: the range is not held by one database, the target already holds a range, or the source would
    keep a range that is not aligned."""
    holders = [(bounds, member) for bounds, member in before.members if bounds[0] <= moved[1] and bounds[1] >= moved[0]]
    if len(holders) != 1 or not (holders[0][0][0] <= moved[0] and moved[1] <= holders[0][0][1]):
        shown = ", ".join(format_range(bounds) for bounds, _ in holders)
        raise InvalidArgument(f"slice range {format_range(moved)} is not held by one database (layout version "
                              f"{before.version} holds it in {shown}): move each database's part on its own")
    held, source = holders[0]
    if target in {member for _, member in before.members}:
        where = ", ".join(format_range(b) for b, m in before.members if m == target)
        raise InvalidArgument(f"the target database already holds slices {where} in layout version "
                              f"{before.version}: move to a database outside the layout")
    members: list[tuple[SliceRange, uuid.UUID]] = []
    for bounds, member in before.members:
        if bounds != held:
            members.append((bounds, member))
            continue
        rest = [part for part in ((held[0], moved[0] - 1), (moved[1] + 1, held[1])) if part[0] <= part[1]]
        if len(rest) > 1 or (rest and not aligned(rest[0])):
            raise InvalidArgument(
                f"moving {format_range(moved)} out of {format_range(held)} would leave its database "
                f"{', '.join(map(format_range, rest))}, not one aligned range: move one half of "
                f"{format_range(held)} (or all of it)")
        members.append((moved, target))
        members.extend((part, source) for part in rest)
    after = Layout(before.version + 1, tuple(sorted(members)))
    return Move(moved, source, target, held, before, after)


@dataclass(frozen=True)
class Progress:
    """What the records say: the source's and the target's ``move_step`` (``None``: no move recorded)."""

    source: MoveStep | None
    target: MoveStep | None
    target_recorded: bool


def step_of(text: str | None) -> MoveStep | None:
    if text is None:
        return None
    try:
        return MoveStep(text)
    except ValueError:
        raise ShardLayoutMismatch(f"unreadable move step {text!r} in a shard layout record") from None


def next_action(progress: Progress, *, moved_already: bool) -> Action:
    """The step to run next. ``moved_already``: the records are stable and the layout has the range on the
    target (a finished move run again)."""
    source, target = progress.source, progress.target
    if source is MoveStep.SWITCHED:
        return Action.CLEAN_UP
    if target is MoveStep.SWITCHED:
        return Action.SWITCH  # the target switched first: the source's and the others' records follow
    if moved_already:
        return Action.DONE
    if target is None or source is None:
        return Action.PLAN
    if target is MoveStep.PLANNED:
        return Action.COPY
    if target is MoveStep.COPIED:
        return Action.CATCH_UP
    if target is MoveStep.CAUGHT_UP:
        return Action.CHECK  # also after a seal: the check reads the whole range, which a seal leaves correct
    if target is MoveStep.CHECKED:
        return Action.SEAL if source is MoveStep.PLANNED else Action.VERIFY
    if target is MoveStep.VERIFIED:
        return Action.SWITCH
    raise ShardLayoutMismatch(f"the move's records disagree: the source says {source.value}, the target "
                              f"{target.value}")


def can_roll_back(progress: Progress) -> bool:
    """A move rolls back until the target recorded the new layout; after, it is finished (move back instead)."""
    return progress.target is not MoveStep.SWITCHED and progress.source is not MoveStep.SWITCHED


def owned(layout: Layout, member: uuid.UUID) -> list[SliceRange]:
    """The ranges ``layout`` puts on the database ``member``."""
    return [bounds for bounds, holder in layout.members if holder == member]


def leaves_touching(leaves: Iterable[Leaf], moved: SliceRange) -> list[Leaf]:
    """The leaves whose guard a change of ``moved`` concerns: a partition by slice only when its slices overlap
    ``moved`` (so the seal's lock stops only the range's writers there), every table that is not partitioned."""
    return [leaf for leaf in leaves
            if leaf.bounds is None or (leaf.bounds[0] <= moved[1] and leaf.bounds[1] >= moved[0])]


def chunks(moved: SliceRange, start: int, size: int) -> list[SliceRange]:
    """The copy's slice chunks of ``moved`` from slice ``start`` on."""
    return [(lo, min(lo + size - 1, moved[1])) for lo in range(max(start, moved[0]), moved[1] + 1, size)]


def differing(source: Sequence[tuple[int, ...]], target: Sequence[tuple[int, ...]]) -> list[int]:
    """The slices whose digest rows (``slice, ...``) differ between the two sides."""
    left = {row[0]: tuple(row[1:]) for row in source}
    right = {row[0]: tuple(row[1:]) for row in target}
    return sorted(s for s in left.keys() | right.keys() if left.get(s) != right.get(s))


def unplan(after: Layout, moved: SliceRange, source: uuid.UUID, target: uuid.UUID) -> Move:
    """The move that left ``after`` (found again from the records once they all hold the new layout)."""
    rest = owned(after, source)
    held = (min([moved[0], *(lo for lo, _ in rest)]), max([moved[1], *(hi for _, hi in rest)]))
    members = tuple(sorted([(b, m) for b, m in after.members if m not in (source, target)] + [(held, source)]))
    move = plan_move(Layout(after.version - 1, members), moved, target)
    if move.after != after:
        raise ShardLayoutMismatch(f"layout version {after.version} is not what moving {format_range(moved)} leaves")
    return move
