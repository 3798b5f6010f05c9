BEGIN;

CREATE TABLE pgjournal_version (
    version_num VARCHAR(32) NOT NULL, 
    CONSTRAINT pgjournal_version_pkc PRIMARY KEY (version_num)
);

-- Running upgrade  -> 0001

CREATE TABLE event_journal (
    slice INTEGER NOT NULL, 
    entity_type VARCHAR(255) NOT NULL, 
    persistence_id VARCHAR(255) NOT NULL, 
    seq_nr BIGINT NOT NULL, 
    db_timestamp TIMESTAMP WITH TIME ZONE NOT NULL, 
    event_ser_id INTEGER NOT NULL, 
    event_ser_manifest VARCHAR(255) NOT NULL, 
    event_payload BYTEA NOT NULL, 
    deleted BOOLEAN DEFAULT 'false' NOT NULL, 
    writer VARCHAR(255) NOT NULL, 
    adapter_manifest VARCHAR(255), 
    tags TEXT[], 
    meta_ser_id INTEGER, 
    meta_ser_manifest VARCHAR(255), 
    meta_payload BYTEA, 
    CONSTRAINT event_journal_pkey PRIMARY KEY (persistence_id, seq_nr)
);

CREATE INDEX event_journal_slice_idx ON event_journal (entity_type, db_timestamp, seq_nr, slice) USING HASH WITH (bucket_count = 16) STORING (deleted);

CREATE TABLE snapshot (
    slice INTEGER NOT NULL, 
    entity_type VARCHAR(255) NOT NULL, 
    persistence_id VARCHAR(255) NOT NULL, 
    seq_nr BIGINT NOT NULL, 
    db_timestamp TIMESTAMP WITH TIME ZONE, 
    write_timestamp BIGINT NOT NULL, 
    ser_id INTEGER NOT NULL, 
    ser_manifest VARCHAR(255) NOT NULL, 
    snapshot BYTEA NOT NULL, 
    tags TEXT[], 
    meta_ser_id INTEGER, 
    meta_ser_manifest VARCHAR(255), 
    meta_payload BYTEA, 
    CONSTRAINT snapshot_pkey PRIMARY KEY (persistence_id)
);

CREATE INDEX snapshot_slice_idx ON snapshot (slice, entity_type, db_timestamp);

CREATE TABLE projection_timestamp_offset_store (
    projection_name VARCHAR(255) NOT NULL, 
    projection_key VARCHAR(255) NOT NULL, 
    slice INTEGER NOT NULL, 
    persistence_id VARCHAR(255) NOT NULL, 
    seq_nr BIGINT NOT NULL, 
    timestamp_offset TIMESTAMP WITH TIME ZONE NOT NULL, 
    timestamp_consumed TIMESTAMP WITH TIME ZONE NOT NULL, 
    CONSTRAINT projection_timestamp_offset_store_pkey PRIMARY KEY (slice, projection_name, timestamp_offset, persistence_id, seq_nr)
);

CREATE TABLE projection_management (
    projection_name VARCHAR(255) NOT NULL, 
    projection_key VARCHAR(255) NOT NULL, 
    paused BOOLEAN NOT NULL, 
    last_updated BIGINT NOT NULL, 
    CONSTRAINT projection_management_pkey PRIMARY KEY (projection_name, projection_key)
);

INSERT INTO pgjournal_version (version_num) VALUES ('0001') RETURNING pgjournal_version.version_num;

-- Running upgrade 0001 -> 0002

CREATE TABLE tag_views (
    tag_name VARCHAR(255) NOT NULL, 
    timebucket BIGINT NOT NULL, 
    ts_time BIGINT NOT NULL, 
    ts_lsb BIGINT NOT NULL, 
    timestamp UUID NOT NULL, 
    persistence_id VARCHAR(255) NOT NULL, 
    tag_pid_sequence_nr BIGINT NOT NULL, 
    sequence_nr BIGINT NOT NULL, 
    writer_uuid VARCHAR(255) NOT NULL, 
    ser_id INTEGER NOT NULL, 
    ser_manifest VARCHAR(255) NOT NULL, 
    event_manifest VARCHAR(255) DEFAULT '' NOT NULL, 
    event BYTEA NOT NULL, 
    meta_ser_id INTEGER, 
    meta_ser_manifest VARCHAR(255), 
    meta_payload BYTEA, 
    CONSTRAINT tag_views_pkey PRIMARY KEY (tag_name, timebucket, ts_time, ts_lsb, persistence_id, tag_pid_sequence_nr)
);

CREATE INDEX tag_views_pid_idx ON tag_views (tag_name, persistence_id, tag_pid_sequence_nr);

CREATE TABLE tag_write_progress (
    persistence_id VARCHAR(255) NOT NULL, 
    tag VARCHAR(255) NOT NULL, 
    sequence_nr BIGINT NOT NULL, 
    tag_pid_sequence_nr BIGINT NOT NULL, 
    "offset" UUID NOT NULL, 
    ts_time BIGINT NOT NULL, 
    CONSTRAINT tag_write_progress_pkey PRIMARY KEY (persistence_id, tag)
);

CREATE TABLE tag_scanning (
    persistence_id VARCHAR(255) NOT NULL, 
    sequence_nr BIGINT NOT NULL, 
    CONSTRAINT tag_scanning_pkey PRIMARY KEY (persistence_id)
);

CREATE TABLE tag_settings (
    name VARCHAR(255) NOT NULL, 
    value VARCHAR(255) NOT NULL, 
    CONSTRAINT tag_settings_pkey PRIMARY KEY (name)
);

UPDATE pgjournal_version SET version_num='0002' WHERE pgjournal_version.version_num = '0001';

-- Running upgrade 0002 -> 0003

CREATE TABLE projection_lease (
    projection_name VARCHAR(255) NOT NULL, 
    slice INTEGER NOT NULL, 
    owner VARCHAR(255), 
    epoch BIGINT DEFAULT '0' NOT NULL, 
    expires_at TIMESTAMP WITH TIME ZONE NOT NULL, 
    CONSTRAINT projection_lease_pkey PRIMARY KEY (projection_name, slice)
);

CREATE TABLE projection_worker (
    projection_name VARCHAR(255) NOT NULL, 
    owner VARCHAR(255) NOT NULL, 
    started_at TIMESTAMP WITH TIME ZONE NOT NULL, 
    expires_at TIMESTAMP WITH TIME ZONE NOT NULL, 
    CONSTRAINT projection_worker_pkey PRIMARY KEY (projection_name, owner)
);

UPDATE pgjournal_version SET version_num='0003' WHERE pgjournal_version.version_num = '0002';

-- Running upgrade 0003 -> 0004

CREATE TABLE projection_dead_letter (
    projection_name VARCHAR(255) NOT NULL, 
    projection_key VARCHAR(255) NOT NULL, 
    slice INTEGER NOT NULL, 
    persistence_id VARCHAR(255) NOT NULL, 
    seq_nr BIGINT NOT NULL, 
    db_timestamp TIMESTAMP WITH TIME ZONE NOT NULL, 
    ser_id INTEGER NOT NULL, 
    manifest VARCHAR(255) NOT NULL, 
    payload BYTEA NOT NULL, 
    error TEXT NOT NULL, 
    failed_at TIMESTAMP WITH TIME ZONE NOT NULL, 
    CONSTRAINT projection_dead_letter_pkey PRIMARY KEY (projection_name, persistence_id, seq_nr)
);

UPDATE pgjournal_version SET version_num='0004' WHERE pgjournal_version.version_num = '0003';

-- Running upgrade 0004 -> 0005

CREATE TABLE pgjournal_format (
    name VARCHAR(255) NOT NULL, 
    value VARCHAR(255) NOT NULL, 
    CONSTRAINT pgjournal_format_pkey PRIMARY KEY (name)
);

INSERT INTO pgjournal_format (name, value) SELECT 'legacy_json_ser_id', '33' WHERE EXISTS (SELECT 1 FROM event_journal WHERE event_ser_id = 33) OR EXISTS (SELECT 1 FROM event_journal WHERE meta_ser_id = 33) OR EXISTS (SELECT 1 FROM snapshot WHERE ser_id = 33) OR EXISTS (SELECT 1 FROM snapshot WHERE meta_ser_id = 33) OR EXISTS (SELECT 1 FROM tag_views WHERE ser_id = 33) OR EXISTS (SELECT 1 FROM tag_views WHERE meta_ser_id = 33);

UPDATE pgjournal_version SET version_num='0005' WHERE pgjournal_version.version_num = '0004';

-- Running upgrade 0005 -> 0006

CREATE TABLE durable_state (
    slice INTEGER NOT NULL, 
    entity_type VARCHAR(255) NOT NULL, 
    persistence_id VARCHAR(255) NOT NULL, 
    revision BIGINT NOT NULL, 
    db_timestamp TIMESTAMP WITH TIME ZONE NOT NULL, 
    state_ser_id INTEGER NOT NULL, 
    state_ser_manifest VARCHAR(255), 
    state_payload BYTEA NOT NULL, 
    tags TEXT[], 
    CONSTRAINT durable_state_pkey PRIMARY KEY (persistence_id)
);

CREATE INDEX durable_state_slice_idx ON durable_state (slice, entity_type, db_timestamp, revision);

UPDATE pgjournal_version SET version_num='0006' WHERE pgjournal_version.version_num = '0005';

-- Running upgrade 0006 -> 0007

CREATE TABLE pgjournal_payload_keys (
    persistence_id VARCHAR(255) NOT NULL, 
    wrapped_key BYTEA NOT NULL, 
    created_at TIMESTAMP WITH TIME ZONE NOT NULL, 
    CONSTRAINT pgjournal_payload_keys_pkey PRIMARY KEY (persistence_id)
);

UPDATE pgjournal_version SET version_num='0007' WHERE pgjournal_version.version_num = '0006';

-- Running upgrade 0007 -> 0008

CREATE TABLE tag_batch_writers (
    id VARCHAR(255) NOT NULL, 
    writer VARCHAR(255) NOT NULL, 
    entity_types TEXT[] NOT NULL, 
    complete_before TIMESTAMP WITH TIME ZONE NOT NULL, 
    heartbeat TIMESTAMP WITH TIME ZONE NOT NULL, 
    CONSTRAINT tag_batch_writers_pkey PRIMARY KEY (id)
);

UPDATE pgjournal_version SET version_num='0008' WHERE pgjournal_version.version_num = '0007';

-- Running upgrade 0008 -> 0009

CREATE INDEX IF NOT EXISTS event_journal_tagged_idx ON event_journal (entity_type, db_timestamp, seq_nr, slice) USING HASH WITH (bucket_count = 16) STORING (deleted, tags) WHERE tags IS NOT NULL;

UPDATE pgjournal_version SET version_num='0009' WHERE pgjournal_version.version_num = '0008';

-- Running upgrade 0009 -> 0010

CREATE TABLE replication_seen (
    persistence_id VARCHAR(255) NOT NULL, 
    origin_replica VARCHAR(255) NOT NULL, 
    origin_seq_nr BIGINT NOT NULL, 
    CONSTRAINT replication_seen_pkey PRIMARY KEY (persistence_id, origin_replica)
);

UPDATE pgjournal_version SET version_num='0010' WHERE pgjournal_version.version_num = '0009';

COMMIT;

