"""``pgjournal replication run | status``: this location's streams from its peers."""

from __future__ import annotations

import contextlib
import logging
from typing import Annotated, Any

import typer
from rich.table import Table

from pgjournal.cli.support import DsnOption, console, fail, open_journal, reported, shown
from pgjournal.errors import JournalError
from pgjournal.server.dsn import mask_dsn

from .workers import Peer, run_replication

replication_app = typer.Typer(
    help="Replicated journals across locations: this location's streams from each peer, per entity type.",
    no_args_is_help=True)

ReplicaOption = Annotated[str, typer.Option("--replica", help="This location's replica id.")]
PeerOption = Annotated[list[str], typer.Option(
    "--peer", help="A peer location, REPLICA=DSN (repeatable); a role that may only read there is enough.")]
TypeOption = Annotated[list[str], typer.Option("--entity-type", "-e", help="A replicated entity type (repeatable).")]


def peers_of(texts: list[str], replica: str) -> list[Peer]:
    try:
        peers = [Peer.parse(text) for text in texts]
    except JournalError as exc:
        fail(str(exc))
    if any(p.replica == replica for p in peers):
        fail(f"{shown(replica)} is this location's replica id, not a peer's")
    return peers


@replication_app.command("run")
def run_cmd(replica: ReplicaOption, peer: PeerOption, entity_type: TypeOption, dsn: DsnOption = None,
            lease_duration: Annotated[float, typer.Option(help="Seconds a slice lease lasts unless renewed.")] = 10.0,
            filter_: Annotated[str | None, typer.Option(
                "--filter", help="A replication filter, module:attribute (a function of a Candidate returning "
                                 "True to replicate the event; or one returning such a function).")] = None,
            metrics_port: Annotated[int | None, typer.Option(
                help="Serve Prometheus metrics on 127.0.0.1:PORT, replication status per stream included "
                     "(needs the metrics extra).")] = None,
            ) -> None:
    """Run this location's streams (every peer, every entity type) in this process until SIGTERM or SIGINT; more
    processes started against the same database share the slices by lease."""
    from .replicator import load_filter

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")
    peers = peers_of(peer, replica)
    try:
        accept = load_filter(filter_) if filter_ is not None else None
    except JournalError as exc:
        fail(str(exc))
    if metrics_port is not None:
        from pgjournal.runtime import metrics

        try:
            metrics.serve(metrics_port)
        except JournalError as exc:
            fail(str(exc))
    with reported():
        code = run_replication(dsn, replica, peers, entity_type, lease_duration=lease_duration, accept=accept,
                               metrics=metrics_port is not None)
    raise typer.Exit(code)


@replication_app.command("status")
def status_cmd(replica: ReplicaOption, peer: PeerOption, entity_type: TypeOption, dsn: DsnOption = None) -> None:
    """Per stream: the peer available or not, the lag in seconds, events/s over the last minute, live workers."""
    from pgjournal.journal import Journal

    from .status import stream_status

    peers = peers_of(peer, replica)
    table = Table("peer", "entity type", "state", "lag (s)", "events/s", "workers")
    unavailable = 0
    with open_journal(dsn) as local:
        for p in peers:
            source: Any = None
            error: str | None = None
            with contextlib.ExitStack() as opened:
                try:
                    source = opened.enter_context(Journal.open(p.dsn, notify=False))
                except JournalError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                for t in entity_type:
                    s = stream_status(local, p.replica, source, t, error)
                    unavailable += not s.available
                    table.add_row(shown(p.replica), shown(t), "available" if s.available else "unavailable",
                                  "-" if s.lag is None else f"{s.lag:.1f}", f"{s.rate:.1f}", str(s.workers))
                    if s.error:
                        console.print(f"{shown(p.replica)} ({shown(mask_dsn(p.dsn))}): {shown(s.error)}",
                                      highlight=False)
    console.print(table)
    if unavailable:
        raise typer.Exit(2)


@replication_app.command("recover")
def recover_cmd(replica: ReplicaOption, peer: PeerOption, entity_type: TypeOption, dsn: DsnOption = None) -> None:
    """After a restore from an old backup: mark this location recovering (its writes and arrivals refused), rebuild
    each replica from the peers' copies (its own events with their sequence numbers and vectors, and the others'
    before them), then remove the mark. Every peer must answer; run it again after a failure. Stop this location's
    writers and streams first, start them after."""
    from pgjournal.journal import Journal

    from .recovery import recover

    peers = peers_of(peer, replica)
    with reported(), open_journal(dsn) as local, contextlib.ExitStack() as opened:
        sources = {p.replica: opened.enter_context(Journal.open(p.dsn, notify=False)) for p in peers}
        report = recover(local, replica, sources, entity_type)
    table = Table("replica", "own events", "others' events", "seq_nr", "from")
    for r in report.replicas:
        table.add_row(shown(r.persistence_id), str(r.own), str(r.arrived), str(r.seq_nr),
                      shown(", ".join(r.peers)))
    console.print(table)
    console.print(f"{shown(replica)} recovered: {len(report.replicas)} replica(s), {report.events} event(s) "
                  "written; its writers and streams may start", highlight=False)
