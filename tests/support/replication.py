"""Locations of a replicated journal for tests: writers of local events with replication metadata, and the
checks every replica's persistence id must pass (docs/replication.md, section 5)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psycopg
import psycopg.errors

from pgjournal import Journal
from pgjournal.model.replication import (
    Ordering,
    ReplicatedEventMetadata,
    ReplicationId,
    VersionVector,
    event_metadata_columns,
    event_metadata_of,
)
from pgjournal.replication import Stored, append_events, writer_of
from pgjournal.replication.replicator import replica_state
from pgjournal.store import replication as sql


def write_local(journal: Journal, rid: ReplicationId, event: object, tags: Sequence[str] | None = None
                ) -> ReplicatedEventMetadata:
    """Append one local event to ``rid``'s persistence id with its metadata (Akka's local write rule), computed from
    the last event in the same transaction; taking the replicator's lock half the time, so both the lock and the
    race for a sequence number (a writer that does not lock) are exercised."""
    pid = rid.persistence_id
    for _ in range(100):
        try:
            with journal.connection() as conn, conn.transaction():
                if hash((pid, threading.get_ident(), id(event))) % 2:
                    conn.execute(*sql.lock([pid]))
                state = replica_state(conn, journal, rid.replica_id, pid)
                _, meta = state.write_local()
                ser_id, manifest, payload = event_metadata_columns(meta)
                append_events(conn, journal, pid, [event], expected=state.seq_nr,
                              metadata=Stored(ser_id, manifest, payload), tags=tags)
            return meta
        except psycopg.errors.UniqueViolation:
            continue
    raise AssertionError(f"no local write to {pid!r} in 100 attempts")


@dataclass(frozen=True)
class Row:
    seq_nr: int
    writer: str
    meta: ReplicatedEventMetadata
    payload: bytes
    #: The origin's vector: stored beside the metadata (40 / DA) when it is not the stored one.
    origin_version: VersionVector


def rows_of(journal: Journal, pid: str) -> list[Row]:
    with journal.connection() as conn:
        found = conn.execute(
            "SELECT seq_nr, writer, meta_ser_id, meta_ser_manifest, meta_payload, event_payload FROM event_journal "
            "WHERE persistence_id = %s ORDER BY seq_nr", (pid,)).fetchall()
    out = []
    for seq_nr, writer, ser_id, manifest, meta, payload in found:
        decoded, others = event_metadata_of(ser_id, manifest, bytes(meta))
        assert decoded is not None, f"{pid} seq_nr {seq_nr} has no replication metadata"
        beside = [VersionVector.from_bytes(e.payload) for e in others if (e.ser_id, e.manifest) == (40, "DA")]
        out.append(Row(seq_nr, writer, decoded, bytes(payload), beside[0] if beside else decoded.version))
    return out


def check_replicas(journals: Mapping[str, Journal], entity_type: str, entity_ids: Sequence[str], *,
                   converged: bool) -> int:
    """Every check of docs/replication.md section 5 over the replicas of each entity; returns the number of
    origin events. ``converged``: every replica also holds every origin event (quiet and healed)."""
    total = 0
    for entity_id in entity_ids:
        logs = {r: rows_of(j, ReplicationId(entity_type, entity_id, r).persistence_id) for r, j in journals.items()}
        # The origin events and their vectors where they were written.
        origin: dict[tuple[str, int], VersionVector] = {}
        for replica, log in logs.items():
            for row in log:
                if row.meta.origin_replica == replica:
                    assert row.meta.origin_sequence_nr == row.seq_nr and not row.meta.concurrent
                    origin[(replica, row.seq_nr)] = row.meta.version
        total += len(origin)
        for replica, log in logs.items():
            pid = ReplicationId(entity_type, entity_id, replica).persistence_id
            assert [r.seq_nr for r in log] == list(range(1, len(log) + 1)), f"{pid}: seq_nrs not contiguous"
            keys = [(r.meta.origin_replica, r.meta.origin_sequence_nr) for r in log]
            assert len(keys) == len(set(keys)), f"{pid}: an origin event twice"
            assert set(keys) <= set(origin), f"{pid}: an event that is no origin's"
            if converged:
                assert set(keys) == set(origin), f"{pid}: misses {sorted(set(origin) - set(keys))[:5]}"
            previous = VersionVector()
            before: set[tuple[str, int]] = set()
            for row, key in zip(log, keys, strict=True):
                assert row.meta.version.compare(previous) is Ordering.AFTER, f"{pid} {row.seq_nr}: vector not after"
                if key[0] != replica:
                    # Recompute the arrival from the copy the stream read (its writer names the peer); recovery
                    # from the peers writes an arrival with the origin's vector alone.
                    at_origin = origin[key]
                    if row.writer.startswith("recovery:"):
                        arrived = at_origin
                    else:
                        peer = row.writer.removeprefix("replication:")
                        assert row.writer == writer_of(peer), row.writer
                        arrived = next(r.meta.version for r in logs[peer]
                                       if (r.meta.origin_replica, r.meta.origin_sequence_nr) == key)
                    # The flag is decided against the origin's vector (carried by relays), the relay's added.
                    assert row.meta.version == at_origin.merge(previous).merge(arrived), f"{pid} {row.seq_nr}: vector"
                    assert row.meta.concurrent == at_origin.concurrent_with(previous), f"{pid} {row.seq_nr}: flag"
                    assert row.origin_version == at_origin, f"{pid} {row.seq_nr}: origin vector not carried"
                # Causal order: every origin event the origin's vector covers is before it.
                vector = origin[key]
                causes = {k for k in origin if k != key and k[1] <= vector.version_at(k[0])}
                missing = causes - before
                assert not missing, f"{pid} seq_nr {row.seq_nr} {key} before its causes {sorted(missing)[:5]}"
                before.add(key)
                previous = row.meta.version
        if converged:
            finals = {r: log[-1].meta.version if log else None for r, log in logs.items()}
            assert len(set(map(repr, finals.values()))) == 1, f"{entity_id}: not converged {finals}"
    return total
