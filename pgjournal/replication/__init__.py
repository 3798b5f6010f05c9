"""Replication across locations (add-on): a general event processor (read a journal by slices, this database's
or another's; write events here; offsets in the same transaction) and the replicator built on it, which brings
every event of a replicated entity from each peer location into this location's replica exactly once and in
causal order (docs/replication.md)."""

from .cleanup import ReplicatedCleanup
from .processor import AsStored, EventProcessor, ProcessorRunner, Stored, append_events
from .replicator import (
    Candidate,
    ReplicationFilter,
    Replicator,
    load_filter,
    location_private,
    stream_name,
    writer_of,
)
from .workers import Peer, ReplicationWorker, run_replication

__all__ = [
    "AsStored",
    "Candidate",
    "EventProcessor",
    "Peer",
    "ProcessorRunner",
    "ReplicatedCleanup",
    "ReplicationFilter",
    "ReplicationWorker",
    "Replicator",
    "Stored",
    "append_events",
    "load_filter",
    "location_private",
    "run_replication",
    "stream_name",
    "writer_of",
]
