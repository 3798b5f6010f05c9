"""One exception tree, rooted at :class:`JournalError`, that callers can catch by meaning."""

from __future__ import annotations


class JournalError(Exception):
    """Base of every error pgjournal raises on purpose."""


class ConfigurationError(JournalError, ValueError):
    """A setting, DSN or argument is not what pgjournal expects."""


class InvalidPersistenceId(JournalError, ValueError):
    """A persistence id is empty, too long or contains characters the database cannot store."""


class InvalidArgument(JournalError, ValueError):
    """An argument to a query or write (slice, seq nr, offset, limit, ...) is out of range."""


class SerializationError(JournalError):
    """An event or snapshot could not be encoded, or a stored payload could not be decoded."""


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


class MissingEventsError(JournalError):
    """A gap in a stream (tag or slice) could not be filled in time."""


class SchemaNotMigrated(JournalError):
    """The database has no pgjournal schema, or an older one than this version needs."""


class DatabaseUnavailable(JournalError):
    """The database server could not be reached or dropped the connection."""


class ConnectionTimedOut(DatabaseUnavailable):
    """The server did not answer within the client-side limit (``statement_timeout + tcp_user_timeout``): a dead
    or hung network. The connection was closed; a statement sent on it may or may not have run."""


class WriteOutcomeUnknown(JournalError):
    """The connection was lost while a write committed: it may or may not have been written.

    Retrying the same ``append`` with the same ``expected_seq_nr`` is safe: it either writes the
    events or raises :class:`ConcurrencyConflict` because they are already there.
    """


class RetriesExhausted(JournalError):
    """A write kept failing with a transient error (serialization failure 40001, deadlock 40P01) past its
    retry bound. The server rolled every attempt back, so nothing was written; trying again later is safe."""
