"""Deferred cleanup of a replica's events (docs/replication.md, section 7): a bulk cleanup
(:class:`~pgjournal.admin.cleanup.JournalCleanup`) whose deletions wait until every peer has replicated what
they remove.

Each peer's stream from this location stores its offsets at the peer (``replication|<this location>|<type>``, the
projections' per-slice offset table). They are read there with the peer's DSN, the one this location's own streams
from that peer use (a reader role is enough: SELECT on the offset table): an event of this location is replicated
by a peer when its ``db_timestamp`` is older than the stream's latest offset in the event's slice, or the offset row
the stream keeps for the event's persistence id covers its sequence number. The cleanup of each persistence id is
capped at the lowest sequence number every configured peer has passed; the rest stays and is reported
(:class:`~pgjournal.admin.cleanup.HeldBack`), and a later run removes it once the peers have caught up. An event a
peer's filter left out counts as replicated: its stream's offsets passed it.

A peer that does not answer stops the cleanup with a typed error before anything of that page is deleted: what
it has replicated is unknown. A peer left out of ``peers`` (a location removed) no longer holds anything back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors

from pgjournal.admin.cleanup import JournalCleanup, Progress
from pgjournal.errors import DatabaseUnavailable, InsufficientPrivilege, InvalidArgument, SchemaNotMigrated
from pgjournal.model.replication import ReplicationId
from pgjournal.model.slices import entity_type_of, slice_for_persistence_id
from pgjournal.server.dsn import mask_dsn
from pgjournal.store import replication as sql
from pgjournal.store.timestamp_offsets import OFFSET_TABLE, check_offset_table
from pgjournal.validation import check_name

from .replicator import stream_name
from .workers import Peer

if TYPE_CHECKING:
    from pgjournal.journal import Journal


class ReplicatedCleanup(JournalCleanup):
    """A :class:`~pgjournal.admin.cleanup.JournalCleanup` of the journal of location ``replica`` whose every operation
    keeps the events of ``entity_types`` that a peer of ``peers`` has not replicated yet (``dry_run`` by default,
    as the plain cleanup). Events of other entity types are not held (no stream carries them).

    ``offset_table``: the peers' offset table (their streams' ``ProjectionSettings.offset_table``);
    ``connect_timeout``: seconds to reach each peer."""

    def __init__(self, journal: Journal, replica: str, peers: Sequence[Peer], entity_types: Sequence[str], *,
                 dry_run: bool = True, batch_size: int = 1000, progress: Progress | None = None,
                 offset_table: str = OFFSET_TABLE, connect_timeout: float = 10.0) -> None:
        self.replica = ReplicationId("T", "e", replica).replica_id
        if isinstance(entity_types, str):
            raise InvalidArgument("entity_types must be a list of entity types, got a single string")
        self.entity_types = frozenset(check_name(t, "entity type") for t in entity_types)
        if not isinstance(peers, Sequence) or not all(isinstance(p, Peer) for p in peers):
            raise InvalidArgument(f"peers must be a list of Peer(replica, dsn), got {peers!r}")
        for p in peers:
            if ReplicationId("T", "e", p.replica).replica_id == self.replica:
                raise InvalidArgument(f"{p.replica!r} is this location's replica id, not a peer's")
        self.peers = list(peers)
        self.offset_table = check_offset_table(offset_table)
        self.connect_timeout = connect_timeout
        super().__init__(journal, dry_run=dry_run, batch_size=batch_size, progress=progress, hold=self.replicated)

    def replicated(self, pids: list[str]) -> Mapping[str, tuple[int, str]]:
        """The hold: of ``pids``, those some peer has not replicated to the end, each with the highest sequence
        number every peer has passed and the peers behind (with how far each has come)."""
        held = [p for p in pids if entity_type_of(p) in self.entity_types]
        if not held or not self.peers:
            return {}
        slices = [slice_for_persistence_id(p) for p in held]
        upto: dict[str, int] = {}
        behind: dict[str, list[str]] = {}
        for peer in self.peers:
            names = [stream_name(self.replica, entity_type_of(p)) for p in held]
            offsets = self._peer_offsets(peer, held, names, slices)
            with self.journal.connection() as conn:
                done = sql.replicated_up_to(offsets, slices).all(conn)
            for row in done:
                if row.highest is None or row.seq_nr >= row.highest:
                    continue
                upto[row.persistence_id] = min(upto.get(row.persistence_id, row.seq_nr), row.seq_nr)
                behind.setdefault(row.persistence_id, []).append(
                    f"{peer.replica!r} (up to seq_nr {row.seq_nr} of {row.highest})")
        return {pid: (upto[pid], "not replicated yet by " + ", ".join(behind[pid])) for pid in upto}

    def _peer_offsets(self, peer: Peer, pids: list[str], names: list[str], slices: list[int]
                      ) -> list[sql.PeerOffset]:
        where = f"peer {peer.replica!r} ({mask_dsn(peer.dsn)})"
        try:
            with psycopg.connect(peer.dsn, connect_timeout=max(1, round(self.connect_timeout)),
                                 autocommit=False) as conn:
                conn.read_only = True
                return sql.peer_offsets(self.offset_table, pids, names, slices).all(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise InsufficientPrivilege(f"{where}: its role may not read {self.offset_table}, where its streams "
                                        f"from {self.replica!r} store their offsets ({_first_line(exc)})") from None
        except psycopg.errors.UndefinedTable as exc:
            raise SchemaNotMigrated(f"{where}: no {self.offset_table} ({_first_line(exc)})") from None
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{where} did not answer ({_first_line(exc)}): deferred cleanup needs every "
                                      "peer's offsets; nothing more was deleted") from None


def _first_line(exc: Any) -> str:
    return mask_dsn(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
