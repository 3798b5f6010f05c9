"""``pgjournal projection list | status | run | pause | resume | reset | dead-letters``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Annotated

import typer
from rich.table import Table

from pgjournal.cli.support import (
    DsnOption,
    ShardOption,
    console,
    fail,
    open_journal,
    reported,
    shard_settings_of,
    shown,
)
from pgjournal.journal import Journal
from pgjournal.model.offsets import format_timestamp, parse_timestamp
from pgjournal.model.slices import parse_slice_range
from pgjournal.server.dsn import mask_dsn

from . import dead_letters, management

projection_app = typer.Typer(help="Projections by slice range: run workers, pause, resume, reset, show lag.",
                             no_args_is_help=True)

SlicesOption = Annotated[str, typer.Option("--slices", help="Slice range A-B (default: all).")]


@contextlib.contextmanager
def databases(dsn: str | None, shard: list[str] | None) -> Iterator[list[tuple[tuple[int, int], Journal]]]:
    """The journal of each database a command acts on, with the slices it holds: the one of ``--dsn`` (all
    slices), or with ``--shard`` each database of the sharded journal (its offsets, leases and pause flag live
    beside its slices, docs/sharding.md)."""
    if not shard:
        with open_journal(dsn) as journal:
            yield [((0, 1023), journal)]
        return
    from pgjournal.shards import ShardedJournal

    if dsn is not None:
        fail("give --dsn (one database) or --shard (a sharded journal), not both")
    with reported(), ShardedJournal.open(shard_settings_of(shard), notify=False) as sharded:
        yield list(zip(sharded.shards.ranges, sharded.journals, strict=True))


def heading(bounds: tuple[int, int], journal: Journal, count: int) -> None:
    """With several databases, which one the lines below are of."""
    if count > 1:
        console.rule(f"slices {bounds[0]}-{bounds[1]}: {shown(mask_dsn(journal.dsn))}")


@projection_app.command("list")
def list_cmd(dsn: DsnOption = None, shard: ShardOption = None) -> None:
    """Names of the projections with offsets, workers or management rows (in any database, with --shard)."""
    with databases(dsn, shard) as found:
        names = sorted({name for _, journal in found for name in management.list_projections(journal)})
    for name in names:
        console.print(shown(name), highlight=False)


@projection_app.command("status")
def status_cmd(
    name: str,
    entity_type: Annotated[list[str] | None, typer.Option(
        "--entity-type", "-e", help="Entity type NAME consumes (repeatable; default: those of the persistence ids "
                                    "in its offsets).")] = None,
    dsn: DsnOption = None,
    shard: ShardOption = None,
) -> None:
    """Running (a worker's heartbeat is live) or stopped, paused or not, and per slice range: owner, offsets and
    lag. Lag: 0 when nothing is pending (no event of the entity type newer than the range's offsets is visible
    under the visibility horizon), else the database clock minus the newest event handled, in seconds: the
    largest over the range's slices. The same number as the workers' pgjournal_projection_lag_seconds. With
    --shard: the same for each database."""
    with databases(dsn, shard) as found, reported():
        states = [(bounds, journal, management.status(journal, name, entity_type)) for bounds, journal in found]
        for bounds, journal, state in states:
            heading(bounds, journal, len(states))
            console.print(status_line(state), highlight=False)
            table = Table("slices", "owner / key", "oldest offset", "newest offset", "lag (s)")
            for r in state.ranges:
                table.add_row(shown(r.slices), shown(r.owner or r.key or "-"),
                              format_timestamp(r.oldest_offset) if r.oldest_offset else "-",
                              format_timestamp(r.newest_offset) if r.newest_offset else "-",
                              f"{r.lag:.3f}" if r.lag is not None else "-")
            console.print(table)


def status_line(state: management.ProjectionStatus) -> str:
    """``NAME: running, N live worker(s)`` or ``NAME: stopped (no live worker)``, and whether it is paused."""
    workers = f"running, {len(state.workers)} live worker(s)" if state.running else "stopped (no live worker)"
    paused = ", [yellow]paused[/]" if state.paused else ""
    types = f"; entity type(s): {', '.join(shown(t) for t in state.entity_types)}" if state.entity_types else \
        "; entity type unknown (no offsets yet): pass --entity-type for the lag"
    return f"[bold]{shown(state.name)}[/]: {workers}{paused}{types}"


@projection_app.command("run")
def run_cmd(
    name: str,
    entity_type: Annotated[str, typer.Option("--entity-type", "-e", help="Entity type to project.")],
    handler: Annotated[str, typer.Option(help="module:factory; factory(journal, name, entity_type) -> Projection.")
                       ] = "pgjournal.projections.examples:counter_projection",
    workers: Annotated[int, typer.Option(min=1, max=1024, help="Worker processes to start here.")] = 1,
    lease_duration: Annotated[float, typer.Option(help="Seconds a slice lease lasts unless renewed.")] = 10.0,
    dsn: DsnOption = None,
    shard: Annotated[list[str] | None, typer.Option(
        "--shard", help="RANGE=DSN of a sharded journal, once per database (instead of --dsn): each worker "
                        "joins every database and shares its range there.")] = None,
) -> None:
    """Run NAME with N worker processes; they share the slices with any other workers of NAME (leases).
    Ctrl-C stops them cleanly (leases released)."""
    from .workers import load_factory, run_workers, worker_main

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(message)s")
    with reported():
        load_factory(handler)
        shards = "\n".join(shard) if shard else None
        if shards is not None:
            if dsn is not None:
                fail("give --dsn (one database) or --shard (a sharded journal), not both")
            shard_settings_of(shard)  # bad ranges or DSNs: a message before any worker starts
        if workers == 1:
            code = worker_main(dsn, name, entity_type, handler, {}, lease_duration, None, shards)
        else:
            code = run_workers(dsn, name, entity_type, handler, workers, lease_duration=lease_duration,
                               shards=shards)
    if code:
        fail(f"projection {name!r} stopped with a failure (exit code {code}); see the log above")


@projection_app.command("pause")
def pause_cmd(name: str, dsn: DsnOption = None, shard: ShardOption = None) -> None:
    """Running workers store what they handled and stop consuming until resumed (in every database, with
    --shard)."""
    with databases(dsn, shard) as found, reported():
        for _, journal in found:
            management.pause(journal, name)
    console.print(f"{shown(name)}: paused" + (f" in {len(found)} databases" if len(found) > 1 else ""))


@projection_app.command("resume")
def resume_cmd(name: str, dsn: DsnOption = None, shard: ShardOption = None) -> None:
    """Workers continue from the stored offsets (in every database, with --shard)."""
    with databases(dsn, shard) as found, reported():
        for _, journal in found:
            management.resume(journal, name)
    console.print(f"{shown(name)}: resumed" + (f" in {len(found)} databases" if len(found) > 1 else ""))


@projection_app.command("reset")
def reset_cmd(
    name: str,
    to: Annotated[str, typer.Option("--to", help="Count events before this ISO 8601 time as processed "
                                    "(default: clear, process everything again).")] = "",
    slices: SlicesOption = "0-1023",
    dsn: DsnOption = None,
    shard: ShardOption = None,
) -> None:
    """Clear the offsets (or set them to a time). Pause the projection first, resume afterwards. With --shard,
    each database's part of --slices, once every database has been checked."""
    with reported():
        lo, hi = parse_slice_range(slices)
        when = parse_timestamp(to, "--to") if to else None
    with databases(dsn, shard) as found, reported():
        parts = [((max(lo, a), min(hi, b)), journal) for (a, b), journal in found if a <= hi and lo <= b]
        for _, journal in parts:
            state = management.status(journal, name)
            if state.running and not state.paused:
                fail(f"projection {name!r} has live workers and is not paused: run `pgjournal projection pause "
                     f"{name}` first")
        for (low, high), journal in parts:
            if when is None:
                deleted = management.clear_offset(journal, name, low, high)
                console.print(f"{shown(name)}: cleared {deleted} offset row(s) of slices {low}-{high}")
            else:
                management.set_offset(journal, name, when, low, high)
                console.print(f"{shown(name)}: slices {low}-{high} start after {format_timestamp(when)}")


@projection_app.command("dead-letters")
def dead_letters_cmd(
    name: str,
    retry: Annotated[bool, typer.Option("--retry", help="Replay each through the handler; remove those that "
                                        "now succeed.")] = False,
    handler: Annotated[str, typer.Option(help="module:factory for --retry; factory(journal, name, entity_type) "
                                         "-> Projection.")] = "pgjournal.projections.examples:counter_projection",
    entity_type: Annotated[str, typer.Option("--entity-type", "-e", help="Entity type for the factory "
                                             "(default: that of the first dead letter).")] = "",
    dsn: DsnOption = None,
) -> None:
    """Envelopes NAME could not handle or decode (``on_failure="dead-letter"``); ``--retry`` replays them."""
    from pgjournal.model.slices import entity_type_of

    from .workers import load_factory

    with open_journal(dsn) as journal, reported():
        letters = dead_letters.list_dead_letters(journal, name)
        if retry and letters:
            factory = load_factory(handler)
            projection = factory(journal, name, entity_type or entity_type_of(letters[0].persistence_id))
            outcome = dead_letters.retry_dead_letters(journal, projection)
            console.print(f"{shown(name)}: {len(outcome.succeeded)} dead letter(s) handled and removed, "
                          f"{len(outcome.failed)} failed again", highlight=False)
            for pid, seq_nr, error in outcome.failed:
                console.print(f"  {shown(pid)} {seq_nr}: {shown(error)}", highlight=False)
            letters = dead_letters.list_dead_letters(journal, name)
    table = Table("persistence id", "seq_nr", "slice", "event time", "ser_id", "manifest", "bytes", "failed at",
                  "error", title=f"{shown(name)}: {len(letters)} dead letter(s)")
    for d in letters:
        table.add_row(shown(d.persistence_id), str(d.seq_nr), str(d.slice), format_timestamp(d.db_timestamp),
                      str(d.ser_id), shown(d.manifest), str(len(d.payload)), format_timestamp(d.failed_at),
                      shown(d.error if len(d.error) <= 200 else d.error[:197] + "..."))
    console.print(table)
