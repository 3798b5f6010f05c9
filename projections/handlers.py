"""Handler modes: how envelopes reach user code and when their offsets are stored.

* :class:`ExactlyOnce` — ``handle(conn, envelope)`` runs inside an open transaction on ``conn``; the offset
  rows are written in the same transaction, so the handler's writes and the offset commit together.
* :class:`Grouped` — ``handle(conn, envelopes)`` gets up to ``max_count`` envelopes gathered for at most
  ``max_wait`` seconds (with ``idle_wait``: or until none has come for that long), in one transaction with the
  offsets of all of them.
* :class:`AtLeastOnce` — ``handle(envelope)`` runs with no transaction of ours; offsets are stored after
  processing, every ``save_every`` envelopes or ``save_interval`` seconds. A crash replays at most the
  envelopes processed since the last save.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pgjournal.errors import InvalidArgument
from pgjournal.runtime.backoff import Backoff
from pgjournal.store.timestamp_offsets import OFFSET_TABLE, check_offset_table
from pgjournal.validation import check_name, check_tag_filter

if TYPE_CHECKING:
    import psycopg

    from pgjournal.model.envelope import EventEnvelope

ExactlyOnceHandle = Callable[["psycopg.Connection", "EventEnvelope"], Any]
GroupedHandle = Callable[["psycopg.Connection", "Sequence[EventEnvelope]"], Any]
AtLeastOnceHandle = Callable[["EventEnvelope"], Any]
OnFailure = Literal["stop", "fail", "skip", "dead-letter"]
ON_FAILURE = ("stop", "fail", "skip", "dead-letter")


@dataclass(frozen=True)
class ExactlyOnce:
    handle: ExactlyOnceHandle


@dataclass(frozen=True)
class Grouped:
    handle: GroupedHandle
    max_count: int = 500
    max_wait: float = 0.5
    #: Also hand the group over once no envelope has come for this long (seconds): what the reader had ready
    #: goes at once instead of waiting out ``max_wait`` (latency, where a group's size matters less; a catch-up's
    #: groups still fill, the reader being ahead). ``None``: only ``max_count`` or ``max_wait`` end a group.
    idle_wait: float | None = None

    def __post_init__(self) -> None:
        _positive(self.max_count, "Grouped.max_count", integer=True)
        _positive(self.max_wait, "Grouped.max_wait")
        if self.idle_wait is not None:
            _positive(self.idle_wait, "Grouped.idle_wait")


@dataclass(frozen=True)
class AtLeastOnce:
    handle: AtLeastOnceHandle
    save_every: int = 100
    save_interval: float = 0.5

    def __post_init__(self) -> None:
        _positive(self.save_every, "AtLeastOnce.save_every", integer=True)
        _positive(self.save_interval, "AtLeastOnce.save_interval")


Handler = ExactlyOnce | Grouped | AtLeastOnce


@dataclass(frozen=True)
class ProjectionSettings:
    """Knobs of a projection run. Defaults suit production; tests shorten the intervals."""

    #: Attempts per envelope (or group) before ``on_failure`` applies; 1 = no retry.
    attempts: int = 5
    #: Backoff before retry n: ``min(backoff_max, backoff * 2**(n-1))`` seconds.
    backoff: float = 0.1
    backoff_max: float = 5.0
    #: What happens to an envelope whose handler kept failing, or whose payload does not decode (a poison
    #: event), after ``attempts``: ``stop`` (``fail`` is the same): the run stops with
    #: :class:`~projections.runner.ProjectionFailed` (projection, pid, seq_nr, serializer id and manifest) and
    #: the offset stays before the event. ``dead-letter``: the envelope is stored in ``projection_dead_letter``
    #: (see :mod:`projections.dead_letters`) and counted as processed, in the transaction of its offset.
    #: ``skip``: the event is logged (pid, seq_nr) and counted as processed.
    on_failure: OnFailure = "stop"
    #: Per-pid rows are kept this long behind the latest offset of their slice. At least the backtracking
    #: window plus its distance behind the clock (the runner raises it to that).
    time_window: float = 300.0
    #: How often stored rows older than the window (or superseded) are deleted.
    delete_interval: float = 30.0
    #: How often a running range checks whether the projection was paused.
    management_interval: float = 1.0
    #: How often a running range measures its lag for ``pgjournal_projection_lag_seconds`` (as ``pgjournal
    #: projection status`` does: one index range scan of its entity type's events since its oldest offset).
    lag_interval: float = 5.0
    #: After an infrastructure error (database gone), wait this long before restarting the range.
    restart_backoff: float = 1.0
    #: Seconds before the stored offset a (re)started range reads again, so late commits the previous run
    #: had not found yet are not missed (what is read again is dropped as duplicate). ``None``: the journal's
    #: backtracking window plus its distance behind the clock. Lower it only if no writing transaction runs
    #: longer than that.
    restart_lookback: float | None = None
    #: Where the per-slice offsets live: ``projection_timestamp_offset_store`` (pgjournal's), or
    #: ``akka_projection_timestamp_offset_store`` to share offsets with Akka Projection R2DBC: a projection of
    #: the same name continues from what Akka stored, and Akka from what it stores (move one at a time).
    offset_table: str = OFFSET_TABLE

    def __post_init__(self) -> None:
        check_offset_table(self.offset_table)
        _positive(self.attempts, "attempts", integer=True)
        for name in ("backoff", "backoff_max", "time_window", "delete_interval", "management_interval",
                     "restart_backoff", "lag_interval"):
            _positive(getattr(self, name), name, allow_zero=name in ("backoff", "backoff_max"))
        if self.restart_lookback is not None:
            _positive(self.restart_lookback, "restart_lookback", allow_zero=True)
        if self.on_failure not in ON_FAILURE:
            raise InvalidArgument(f"on_failure must be one of {', '.join(ON_FAILURE)}, got {self.on_failure!r}")

    def backoff_for(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (1 for the first) of a failed handler."""
        return Backoff(self.backoff, 2.0, self.backoff_max).delay(attempt)


@dataclass(frozen=True)
class Projection:
    """A name, an entity type and a handler (with its mode), and perhaps a tag filter. The slice range is given
    when it runs."""

    name: str
    entity_type: str
    handler: Handler
    settings: ProjectionSettings = field(default_factory=ProjectionSettings)
    #: A tag filter: the projection reads only the events carrying any of these tags (``None``: every event),
    #: filtered by the database (``events_by_slices(..., tags=...)``).
    tags: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_name(self.name, "projection name")
        check_name(self.entity_type, "entity type")
        object.__setattr__(self, "tags", check_tag_filter(self.tags))
        if not isinstance(self.handler, ExactlyOnce | Grouped | AtLeastOnce):
            raise InvalidArgument(f"handler must be ExactlyOnce, Grouped or AtLeastOnce, got {self.handler!r}")


def _positive(value: Any, what: str, *, integer: bool = False, allow_zero: bool = False) -> None:
    kinds = int if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        expected = "an integer >= 1" if integer else ("a number >= 0" if allow_zero else "a number > 0")
        raise InvalidArgument(f"{what} must be {expected}, got {value!r}")
