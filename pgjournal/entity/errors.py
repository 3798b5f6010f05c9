"""Errors of the entity repository, placed in the journal's tree so callers can catch them by meaning."""

from __future__ import annotations

from ..errors import ConcurrencyConflict, DatabaseUnavailable


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
