"""The core's command groups: the module each lives in and its help line, which ``pgjournal --help`` lists
without importing the group (each group's ``typer.Typer`` takes its help from here)."""

from __future__ import annotations

from pgjournal.cli.lazy import Lazy
from pgjournal.server.dsn import SHARDS_ENV

GROUPS: dict[str, Lazy] = {
    "cleanup": Lazy(
        "pgjournal.cli.cleanup:cleanup_app",
        "Delete events, tag view rows and snapshots: per persistence id, or in bulk in batches (before the "
        "snapshot, before a time, a whole entity type, tombstoned persistence ids). A dry run that only counts "
        "unless --execute; a bulk run stopped midway continues when run again."),
    "shard": Lazy(
        "pgjournal.cli.shard:shard_app",
        "A journal sharded by slice range over several databases, with Akka R2DBC's data-partition layout: "
        f"the databases come from --shard RANGE=DSN (once per database) or {SHARDS_ENV} (one RANGE=DSN a line)."),
    "state": Lazy(
        "pgjournal.cli.state:state_app",
        "The durable state store: the latest state of each persistence id with a revision. Writes are "
        "optimistic: --revision must be the current revision + 1 (1 for a new persistence id)."),
    "tags": Lazy("pgjournal.cli.tags:tags_app", "The Cassandra-compatible tag view: read it by tag, reconcile it."),
}


def group_help(name: str) -> str:
    """The help of the core's group ``name``, for its ``typer.Typer``."""
    text = GROUPS[name].help
    assert text is not None
    return text
