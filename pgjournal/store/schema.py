"""The table model (SQLAlchemy Core), the single source for migrations and schema checks.

Column names and types follow the Akka/Pekko Persistence R2DBC schema so that journals written by those
plugins can be read here and the other way round. Physical layout (partitioning, hash sharding, split
points) is the dialect's business: see :mod:`pgjournal.dialects`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, TIMESTAMP, UUID

from pgjournal.store import tables

metadata = MetaData()
TIMESTAMPTZ = TIMESTAMP(timezone=True)


def _meta_columns() -> list[Column[Any]]:
    return [
        Column("meta_ser_id", Integer),
        Column("meta_ser_manifest", String(255)),
        Column("meta_payload", LargeBinary),
    ]


event_journal = Table(
    tables.EVENT_JOURNAL,
    metadata,
    Column("slice", Integer, nullable=False),
    Column("entity_type", String(255), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("db_timestamp", TIMESTAMPTZ, nullable=False),
    Column("event_ser_id", Integer, nullable=False),
    Column("event_ser_manifest", String(255), nullable=False),
    Column("event_payload", LargeBinary, nullable=False),
    Column("deleted", Boolean, nullable=False, server_default="false"),
    Column("writer", String(255), nullable=False),
    Column("adapter_manifest", String(255)),
    Column("tags", ARRAY(Text)),
    *_meta_columns(),
    # The slice is a function of the persistence id, so (persistence_id, seq_nr) is unique on its own;
    # the slice is part of the key only because a table partitioned by slice needs it there.
    PrimaryKeyConstraint("persistence_id", "seq_nr", "slice", name="event_journal_pkey"),
)
# Time-ordered within an entity type; slices are filtered inside the index, so a page of a slice range
# is an ordered index range scan instead of a sort of the whole range.
Index(
    "event_journal_slice_idx",
    event_journal.c.entity_type,
    event_journal.c.db_timestamp,
    event_journal.c.seq_nr,
    event_journal.c.slice,
)
# The same order over the tagged events only (revision 0009): a by-slice page filtered by tag
# (``tags && ...``, which implies ``tags IS NOT NULL``) walks this index and never visits an untagged row; an
# untagged append does not touch it.
TAGGED_INDEX = Index(
    "event_journal_tagged_idx",
    event_journal.c.entity_type,
    event_journal.c.db_timestamp,
    event_journal.c.seq_nr,
    event_journal.c.slice,
    postgresql_where=text("tags IS NOT NULL"),
)

snapshot = Table(
    tables.SNAPSHOT,
    metadata,
    Column("slice", Integer, nullable=False),
    Column("entity_type", String(255), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("db_timestamp", TIMESTAMPTZ),
    Column("write_timestamp", BigInteger, nullable=False),
    Column("ser_id", Integer, nullable=False),
    Column("ser_manifest", String(255), nullable=False),
    Column("snapshot", LargeBinary, nullable=False),
    Column("tags", ARRAY(Text)),
    *_meta_columns(),
    PrimaryKeyConstraint("persistence_id", name="snapshot_pkey"),
)
Index("snapshot_slice_idx", snapshot.c.slice, snapshot.c.entity_type, snapshot.c.db_timestamp)

projection_timestamp_offset_store = Table(
    tables.PROJECTION_TIMESTAMP_OFFSET_STORE,
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("projection_key", String(255), nullable=False),
    Column("slice", Integer, nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("timestamp_offset", TIMESTAMPTZ, nullable=False),
    Column("timestamp_consumed", TIMESTAMPTZ, nullable=False),
    PrimaryKeyConstraint(
        "slice", "projection_name", "timestamp_offset", "persistence_id", "seq_nr",
        name="projection_timestamp_offset_store_pkey",
    ),
)

projection_management = Table(
    tables.PROJECTION_MANAGEMENT,
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("projection_key", String(255), nullable=False),
    Column("paused", Boolean, nullable=False),
    Column("last_updated", BigInteger, nullable=False),
    PrimaryKeyConstraint("projection_name", "projection_key", name="projection_management_pkey"),
)

CORE_TABLES = (event_journal, snapshot, projection_timestamp_offset_store, projection_management)

# -- Cassandra-compatible tag path (revision 0002) -----------------------------------------------------
# ``timestamp`` is the event's TimeUUID. PostgreSQL orders UUIDs bytewise, not in Cassandra's TimeUUID
# order, so that order is kept in ``ts_time`` (100 ns ticks) and ``ts_lsb`` (low bytes as a signed key, see
# pgjournal.model.timeuuid) and the key clusters on them where Cassandra clusters on ``timestamp``.
tag_views = Table(
    tables.TAG_VIEWS,
    metadata,
    Column("tag_name", String(255), nullable=False),
    Column("timebucket", BigInteger, nullable=False),
    Column("ts_time", BigInteger, nullable=False),
    Column("ts_lsb", BigInteger, nullable=False),
    Column("timestamp", UUID(as_uuid=True), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("tag_pid_sequence_nr", BigInteger, nullable=False),
    Column("sequence_nr", BigInteger, nullable=False),
    Column("writer_uuid", String(255), nullable=False),
    Column("ser_id", Integer, nullable=False),
    Column("ser_manifest", String(255), nullable=False),
    Column("event_manifest", String(255), nullable=False, server_default=""),
    Column("event", LargeBinary, nullable=False),
    *_meta_columns(),
    PrimaryKeyConstraint("tag_name", "timebucket", "ts_time", "ts_lsb", "persistence_id", "tag_pid_sequence_nr",
                         name="tag_views_pkey"),
)
# A persistence id's rows in a tag: the gap search looks up exactly the missing numbers, and reconciliation
# deletes a persistence id's tag view without scanning every bucket.
Index("tag_views_pid_idx", tag_views.c.tag_name, tag_views.c.persistence_id, tag_views.c.tag_pid_sequence_nr)

tag_write_progress = Table(
    tables.TAG_WRITE_PROGRESS,
    metadata,
    Column("persistence_id", String(255), nullable=False),
    Column("tag", String(255), nullable=False),
    Column("sequence_nr", BigInteger, nullable=False),
    Column("tag_pid_sequence_nr", BigInteger, nullable=False),
    Column("offset", UUID(as_uuid=True), nullable=False),
    # The ticks of ``offset``: the next tagged append of the persistence id gets later TimeUUIDs.
    Column("ts_time", BigInteger, nullable=False),
    PrimaryKeyConstraint("persistence_id", "tag", name="tag_write_progress_pkey"),
)

tag_scanning = Table(
    tables.TAG_SCANNING,
    metadata,
    Column("persistence_id", String(255), nullable=False),
    Column("sequence_nr", BigInteger, nullable=False),
    PrimaryKeyConstraint("persistence_id", name="tag_scanning_pkey"),
)

# Settings fixed once tagged data exists (the bucket size).
tag_settings = Table(
    tables.TAG_SETTINGS,
    metadata,
    Column("name", String(255), nullable=False),
    Column("value", String(255), nullable=False),
    PrimaryKeyConstraint("name", name="tag_settings_pkey"),
)

TAG_TABLES = (tag_views, tag_write_progress, tag_scanning, tag_settings)

# -- Projection leases (revision 0003) -------------------------------------------------------------------
# One row per (projection, slice): which worker process may consume the slice and until when (database
# clock). ``epoch`` grows each time the slice changes hands: a fencing token for handlers and tests.
projection_lease = Table(
    tables.PROJECTION_LEASE,
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("slice", Integer, nullable=False),
    Column("owner", String(255)),
    Column("epoch", BigInteger, nullable=False, server_default="0"),
    Column("expires_at", TIMESTAMPTZ, nullable=False),
    PrimaryKeyConstraint("projection_name", "slice", name="projection_lease_pkey"),
)

# Live worker processes of a projection (heartbeats): the balancer splits 0..1023 among them.
projection_worker = Table(
    tables.PROJECTION_WORKER,
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("owner", String(255), nullable=False),
    Column("started_at", TIMESTAMPTZ, nullable=False),
    Column("expires_at", TIMESTAMPTZ, nullable=False),
    PrimaryKeyConstraint("projection_name", "owner", name="projection_worker_pkey"),
)

PROJECTION_TABLES = (projection_lease, projection_worker)

# -- Projection dead letters (revision 0004) --------------------------------------------------------------
# Envelopes a projection with ``on_failure="dead-letter"`` could not handle (or decode): kept with their
# payload so they can be inspected and replayed (``pgjournal projection dead-letters NAME --retry``).
projection_dead_letter = Table(
    tables.PROJECTION_DEAD_LETTER,
    metadata,
    Column("projection_name", String(255), nullable=False),
    Column("projection_key", String(255), nullable=False),
    Column("slice", Integer, nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("seq_nr", BigInteger, nullable=False),
    Column("db_timestamp", TIMESTAMPTZ, nullable=False),
    Column("ser_id", Integer, nullable=False),
    Column("manifest", String(255), nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("error", Text, nullable=False),
    Column("failed_at", TIMESTAMPTZ, nullable=False),
    PrimaryKeyConstraint("projection_name", "persistence_id", "seq_nr", name="projection_dead_letter_pkey"),
)

DEAD_LETTER_TABLES = (projection_dead_letter,)

# -- Stored format (revision 0005) -----------------------------------------------------------------------
# Facts about how this database's payloads were written, recorded by migrations and read at open: see
# pgjournal.admin.stored_format. Applications read it; only migrations write it.
pgjournal_format = Table(
    tables.PGJOURNAL_FORMAT,
    metadata,
    Column("name", String(255), nullable=False),
    Column("value", String(255), nullable=False),
    PrimaryKeyConstraint("name", name="pgjournal_format_pkey"),
)

FORMAT_TABLES = (pgjournal_format,)

# -- Durable state (revision 0006) -----------------------------------------------------------------------
# Akka Persistence R2DBC's ``durable_state``: the latest state of each persistence id, one row updated in
# place at every revision. Akka's DDL keys it (persistence_id, revision); pgjournal keys it by persistence_id
# alone, which Akka's statements satisfy as well (they update the one row) and which makes a second row per
# persistence id impossible. A deleted state is a row with an empty payload and ser_id 0, as Akka writes it.
durable_state = Table(
    tables.DURABLE_STATE,
    metadata,
    Column("slice", Integer, nullable=False),
    Column("entity_type", String(255), nullable=False),
    Column("persistence_id", String(255), nullable=False),
    Column("revision", BigInteger, nullable=False),
    Column("db_timestamp", TIMESTAMPTZ, nullable=False),
    Column("state_ser_id", Integer, nullable=False),
    Column("state_ser_manifest", String(255)),
    Column("state_payload", LargeBinary, nullable=False),
    Column("tags", ARRAY(Text)),
    PrimaryKeyConstraint("persistence_id", name="durable_state_pkey"),
)
# Akka's index for changes_by_slices.
Index("durable_state_slice_idx", durable_state.c.slice, durable_state.c.entity_type, durable_state.c.db_timestamp,
      durable_state.c.revision)

STATE_TABLES = (durable_state,)

# -- Payload keys (revision 0007) ------------------------------------------------------------------------
# The data key of each persistence id whose payloads are encrypted (pgjournal.state.keystore.PostgresKeyStore),
# wrapped by a key-encryption key the database never sees. Deleting a row crypto-shreds that persistence id.
payload_keys = Table(
    tables.PAYLOAD_KEYS,
    metadata,
    Column("persistence_id", String(255), nullable=False),
    Column("wrapped_key", LargeBinary, nullable=False),
    Column("created_at", TIMESTAMPTZ, nullable=False),
    PrimaryKeyConstraint("persistence_id", name="pgjournal_payload_keys_pkey"),
)

KEY_TABLES = (payload_keys,)

# -- Batched tag writers (revision 0008) -------------------------------------------------------------------
# One row per running batched tag writer (pgjournal.write.tag_batcher): every tagged event it appended with a
# db_timestamp before ``complete_before`` has its tag view rows; events_by_tag reads no further than the
# oldest of these. ``writer`` is the ``event_journal.writer`` of its events and ``entity_types`` the entity
# types it appended to, so a writer that stopped heartbeating can be recovered from the journal by others.
tag_batch_writers = Table(
    tables.TAG_BATCH_WRITERS,
    metadata,
    Column("id", String(255), nullable=False),
    Column("writer", String(255), nullable=False),
    Column("entity_types", ARRAY(Text), nullable=False),
    Column("complete_before", TIMESTAMPTZ, nullable=False),
    Column("heartbeat", TIMESTAMPTZ, nullable=False),
    PrimaryKeyConstraint("id", name="tag_batch_writers_pkey"),
)

TAG_BATCH_TABLES = (tag_batch_writers,)

# -- Replication (revision 0010) ---------------------------------------------------------------------------
# Per replica persistence id of a replicated entity and per origin replica: the highest origin sequence number
# this location holds from that origin (docs/replication.md, section 4). The replication metadata is protobuf in
# ``meta_payload``, so the journal cannot answer "seen?" by SQL; the replicator writes this row in the transaction
# of the events it appends.
replication_seen = Table(
    tables.REPLICATION_SEEN,
    metadata,
    Column("persistence_id", String(255), nullable=False),
    Column("origin_replica", String(255), nullable=False),
    Column("origin_seq_nr", BigInteger, nullable=False),
    PrimaryKeyConstraint("persistence_id", "origin_replica", name="replication_seen_pkey"),
)

REPLICATION_TABLES = (replication_seen,)
