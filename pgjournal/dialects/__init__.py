"""Everything that differs between PostgreSQL, YugabyteDB and CockroachDB, in one place."""

from __future__ import annotations

from pgjournal.dialects.base import Dialect
from pgjournal.dialects.cockroach import CockroachDialect
from pgjournal.dialects.postgres import PostgresDialect
from pgjournal.dialects.yugabyte import YugabyteDialect
from pgjournal.errors import ConfigurationError

DIALECTS: dict[str, type[Dialect]] = {
    "postgres": PostgresDialect,
    "yugabyte": YugabyteDialect,
    "cockroach": CockroachDialect,
}


def get_dialect(name: str) -> Dialect:
    """The dialect called ``name`` (``postgres``, ``yugabyte`` or ``cockroach``)."""
    try:
        return DIALECTS[name]()
    except (KeyError, TypeError):
        raise ConfigurationError(f"dialect must be one of {', '.join(DIALECTS)}, got {name!r}") from None


__all__ = ["DIALECTS", "Dialect", "get_dialect"]
