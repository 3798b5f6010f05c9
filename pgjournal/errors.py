"""One exception tree, rooted at :class:`JournalError`, that callers can catch by meaning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _Event(Protocol):
    """What an error names of an event (an :class:`~pgjournal.model.envelope.EventEnvelope` has it)."""

    @property
    def persistence_id(self) -> str: ...

    @property
    def seq_nr(self) -> int: ...


class JournalError(Exception):
    """Base of every error pgjournal raises on purpose."""


class ConfigurationError(JournalError, ValueError):
    """A setting, DSN or argument is not what pgjournal expects."""


class InvalidPersistenceId(JournalError, ValueError):
    """A persistence id is empty, too long or contains characters the database cannot store."""


class InvalidArgument(JournalError, ValueError):
    """An argument to a query or write (slice, seq nr, offset, limit, ...) is out of range."""


class SerializationError(JournalError):
    """An event or snapshot could not be encoded, or a stored payload could not be decoded.

    A payload that could not be decoded sets ``ser_id`` and ``manifest``, and ``persistence_id`` and
    ``seq_nr`` when it is an event's (``None`` where not known).
    """

    def __init__(
        self,
        message: str,
        *,
        persistence_id: str | None = None,
        seq_nr: int | None = None,
        ser_id: int | None = None,
        manifest: str | None = None,
    ) -> None:
        super().__init__(message)
        self.persistence_id = persistence_id
        self.seq_nr = seq_nr
        self.ser_id = ser_id
        self.manifest = manifest


class DecryptionError(SerializationError):
    """An encrypted payload that its persistence id's key does not open: tampered bytes, a replaced key or a wrong
    master key. (A payload whose key is *gone* is not an error: readers deliver it as redacted.)"""


class SlowConsumer(JournalError):
    """A firehose consumer fell a whole buffer behind the shared query for longer than allowed and was detached.

    ``offset`` is the offset of the last envelope it received (``None``: it received none and may start again
    from its own start offset); resuming from it, on the firehose or on a query of its own, misses nothing."""

    def __init__(self, message: str, *, offset: object = None) -> None:
        super().__init__(message)
        self.offset = offset


class ConcurrencyConflict(JournalError):
    """Another writer got there first: the sequence number is taken, or the expectation was stale.

    Nothing of the batch was written. ``actual_seq_nr`` is the highest sequence number found after
    the failure (``None`` when it could not be read).
    """

    def __init__(
        self,
        persistence_id: str,
        seq_nr: int,
        *,
        expected_seq_nr: int | None = None,
        actual_seq_nr: int | None = None,
    ) -> None:
        self.persistence_id = persistence_id
        self.seq_nr = seq_nr
        self.expected_seq_nr = expected_seq_nr
        self.actual_seq_nr = actual_seq_nr
        detail = f"sequence number {seq_nr} of persistence id {persistence_id!r} could not be written"
        if expected_seq_nr is not None:
            detail += f": expected the highest sequence number to be {expected_seq_nr}"
            if actual_seq_nr is not None:
                detail += f" but it is {actual_seq_nr}"
        else:
            detail += ": it was written by another writer"
        super().__init__(detail + "; nothing of this batch was written")


class EventNotFound(JournalError, LookupError):
    """``load_envelope``: no event (or only a logically deleted one) at that persistence id and sequence number."""

    def __init__(self, persistence_id: str, seq_nr: int) -> None:
        self.persistence_id = persistence_id
        self.seq_nr = seq_nr
        super().__init__(f"no event at sequence number {seq_nr} of persistence id {persistence_id!r} "
                         "(never written, or deleted)")


class RevisionConflict(ConcurrencyConflict):
    """A durable state write whose revision is not the current revision + 1 (1 for a new persistence id):
    another writer got there first, or the caller's revision was stale. Nothing was written.
    ``actual_revision`` is the current revision found after the failure (0: none; ``None``: unreadable)."""

    def __init__(self, persistence_id: str, revision: int, actual_revision: int | None) -> None:
        JournalError.__init__(
            self,
            f"revision {revision} of the durable state of persistence id {persistence_id!r} could not be written: "
            f"expected the current revision to be {revision - 1}"
            + ("" if actual_revision is None else f" but it is {actual_revision}") + "; nothing was written")
        self.persistence_id = persistence_id
        self.seq_nr = self.revision = revision
        self.expected_seq_nr = self.expected_revision = revision - 1
        self.actual_seq_nr = self.actual_revision = actual_revision


class MissingEventsError(JournalError):
    """A gap in a stream (tag or slice) could not be filled in time."""


class SchemaNotMigrated(JournalError):
    """The database has no pgjournal schema, or an older one than this version needs."""


class DatabaseUnavailable(JournalError):
    """The database server could not be reached or dropped the connection."""


class JournalClosed(JournalError):
    """The journal was closed (by :meth:`~pgjournal.Journal.close` or leaving its ``with`` block): nothing was
    read or written. Not a :class:`DatabaseUnavailable`: waiting does not help, so no retry loop waits it out."""


class ConnectionTimedOut(DatabaseUnavailable):
    """The server did not answer within the client-side limit (``statement_timeout + tcp_user_timeout``): a dead
    or hung network. The connection was closed; a statement sent on it may or may not have run."""


class WriteOutcomeUnknown(JournalError):
    """The connection was lost while a write committed: it may or may not have been written.

    Retrying the same ``append`` with the same ``expected_seq_nr`` is safe: it either writes the
    events or raises :class:`ConcurrencyConflict` because they are already there.
    """


class RetriesExhausted(JournalError):
    """A write kept failing with a transient error (serialization failure 40001, deadlock 40P01, a full lock
    table 53200) past its retry bound. The server rolled every attempt back, so nothing was written; trying again
    later is safe."""


class TransactionAborted(JournalError):
    """An append inside :meth:`Journal.transaction` failed (a conflict, a refused statement) without a savepoint,
    so PostgreSQL aborted the transaction: nothing of it commits. Raised by later appends and when the block
    ends; ``cause`` is the first failure."""

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class HorizonBlocked(JournalError):
    """No visibility horizon above the last one could be proven within the time allowed: journal writers
    whose start this role may not see kept their write lock. ``backends`` are their backend pids."""

    def __init__(self, message: str, *, backends: tuple[int | None, ...] = ()) -> None:
        super().__init__(message)
        self.backends = backends


class InsufficientPrivilege(ConfigurationError):
    """The role lacks a right an operation needs; the message names the right and the command to grant it."""


class MissingTaggedEventsError(MissingEventsError):
    """Tag sequence numbers of a persistence id stayed missing in an ``events_by_tag`` stream."""

    def __init__(self, tag: str, persistence_id: str, missing: Sequence[int], reason: str) -> None:
        self.tag = tag
        self.persistence_id = persistence_id
        self.missing = sorted(missing)
        shown = ", ".join(map(str, self.missing[:20])) + (", ..." if len(self.missing) > 20 else "")
        super().__init__(f"events_by_tag {tag!r}: persistence id {persistence_id!r} is missing tag_pid_sequence_nr "
                         f"{shown} ({len(self.missing)} event(s)) {reason}")


class TagFlushFailed(JournalError):
    """The batched tag writer could not write pending tag view rows (after its retries). The events are in
    the journal; their tag rows are written by a later round, or by recovery (``pgjournal tags recover``)."""


class CircuitOpen(DatabaseUnavailable):
    """The database failed repeatedly: commands fail fast, without touching it, until it answers again.

    Nothing was written. ``retry_after`` is the number of seconds until the breaker lets a trial through.
    """

    def __init__(self, name: str, failures: int, retry_after: float, last_error: str) -> None:
        self.retry_after = retry_after
        super().__init__(
            f"circuit breaker {name!r} is open after {failures} consecutive database failures (last: "
            f"{last_error}); the command was not applied and nothing was written; next trial in "
            f"{retry_after:.1f}s"
        )


class ConflictRetriesExhausted(ConcurrencyConflict):
    """Other writers won the race for the same entity ``attempts`` times in a row; nothing was written."""

    def __init__(self, persistence_id: str, seq_nr: int, attempts: int, actual_seq_nr: int | None) -> None:
        super().__init__(persistence_id, seq_nr, expected_seq_nr=seq_nr - 1, actual_seq_nr=actual_seq_nr)
        self.attempts = attempts
        self.args = (f"command for {persistence_id!r} lost the race to other writers {attempts} times in a row "
                     f"(last try: sequence number {seq_nr}); nothing of it was written. Retry later or raise "
                     "max_conflict_retries",)

    def __str__(self) -> str:
        return str(self.args[0])


class LoadConflict(JournalError):
    """Spark incremental load: Another run of the same load job committed first; nothing of this run was committed."""


class ProjectionFailed(JournalError):
    """A handler kept failing (or the payload does not decode) and the projection is configured to stop
    (``on_failure="stop"``): the offset stays before the event. ``ser_id``/``manifest`` are those stored with
    the event (``None`` when they could not be read)."""

    def __init__(self, projection: str, envelope: _Event, attempts: int, cause: BaseException, *,
                 ser_id: int | None = None, manifest: str | None = None) -> None:
        self.projection = projection
        self.persistence_id = envelope.persistence_id
        self.seq_nr = envelope.seq_nr
        self.ser_id = ser_id
        self.manifest = manifest
        self.cause = cause
        super().__init__(f"projection {projection!r} failed on {envelope.persistence_id!r} seq_nr "
                         f"{envelope.seq_nr} (ser_id {ser_id}, manifest {manifest!r}) after {attempts} "
                         f"attempt(s): {cause!r}")


class LeaseLost(JournalError):
    """A projection worker no longer owns (or may soon lose) a slice it was processing: it stops the range,
    and whoever holds the lease now continues from the stored offsets."""


class ShardLayoutMismatch(ConfigurationError):
    """The databases of a sharded journal (:mod:`pgjournal.shards`) disagree about the slice-range layout: with
    each other (a half-done change), with the settings (stale ranges, swapped DSNs), or with the layout this
    process opened with (it changed since). Nothing was written; reopen with the layout the databases record."""


class NotSeenInTime(JournalError, TimeoutError):
    """A read-your-writes wait ended before what it waited for was seen: a replica's version vector had not
    reached the one asked for, or a projection had not passed the offset, within ``timeout`` seconds. Nothing
    changed; ``waited_for`` and ``seen`` say what was asked and what was there at the end."""

    def __init__(self, message: str, *, waited_for: object, seen: object, timeout: float) -> None:
        self.waited_for = waited_for
        self.seen = seen
        self.timeout = timeout
        super().__init__(message)


class LocationRecovering(JournalError):
    """This location is recovering its replicas from its peers (``pgjournal replication recover``, after a restore
    from an old backup): until that ends, a replicated entity's write here is refused, nothing written, because its
    sequence numbers may be ones the peers already hold from before the loss. ``replica`` is the location's replica
    id; run the recovery again to finish one that stopped."""

    def __init__(self, message: str, *, replica: str) -> None:
        self.replica = replica
        super().__init__(message)


class RecoveryFailed(JournalError):
    """A location's recovery from its peers could not rebuild a replica (the peers' copies are not enough, or the
    replica moved while it ran). Nothing of that replica's part was written; the location stays recovering."""
