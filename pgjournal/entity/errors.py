"""The entity repository's errors live in :mod:`pgjournal.errors` with every other; re-exported here."""

from __future__ import annotations

from pgjournal.errors import CircuitOpen, ConflictRetriesExhausted

__all__ = ["CircuitOpen", "ConflictRetriesExhausted"]
