"""`make demo`: the main job on the embedded PostgreSQL, end to end.

Starts (or finds) the embedded server, creates a fresh ``pgjournal_demo`` database and migrates it, runs
four live by-slice consumers (slice_ranges(4)), sends shopping-cart commands from several threads through
the entity API, reads the journal back and checks that the consumers saw every event exactly once. It ends
with the commands that look at what it made, each naming the demo's database (``--dsn``, without a password),
so that they work as printed.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections import Counter
from collections.abc import Callable

import psycopg
import psycopg.conninfo
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pgjournal.admin.verify import render, verify
from pgjournal.journal import Journal
from pgjournal.model.slices import slice_ranges
from pgjournal.server.connections import connect
from pgjournal.server.dsn import SECRET_KEYS, configured_dsn, mask_dsn, resolve_dsn

DEMO_DB = "pgjournal_demo"
COMMANDS = 4000


def demo_database(console: Console) -> str:
    server = resolve_dsn(configured_dsn())
    with connect(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DEMO_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DEMO_DB}"')
    dsn = psycopg.conninfo.make_conninfo(server, dbname=DEMO_DB)
    console.print(f"[bold]1.[/] server {mask_dsn(server)} — fresh database [cyan]{DEMO_DB}[/]")
    return dsn


def command_line(dsn: str, *args: str) -> str:
    """``pgjournal ARGS --dsn DSN`` as a shell reads it, the DSN without its secrets (the embedded server's
    names its password file instead; another server's password comes from libpq's own sources)."""
    params = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items() if k not in SECRET_KEYS}
    return shlex.join(["pgjournal", *args, "--dsn", psycopg.conninfo.make_conninfo("", **params)])


def look_commands(dsn: str, entity_type: str, persistence_id: str) -> list[str]:
    """The commands that show what the demo wrote into the database at ``dsn``."""
    return [command_line(dsn, "info"), command_line(dsn, "events", persistence_id),
            command_line(dsn, "tail", entity_type, "--current"), command_line(dsn, "verify")]


def print_commands(console: Console, title: str, commands: list[str]) -> None:
    """``commands`` each on a line of its own, never wrapped or read as markup, to copy as they are."""
    console.print(title)
    for line in commands:
        console.print(f"  {escape(line)}", soft_wrap=True, highlight=False)


def main() -> None:
    from pgjournal.examples.shopping_cart import ShoppingCart, run_workload

    console = Console()
    dsn = demo_database(console)
    with Journal.open(dsn, migrate=True, refresh_interval=1.0) as journal:
        console.print("[bold]2.[/] schema migrated; 4 live consumers on slice ranges "
                      + ", ".join(f"{lo}-{hi}" for lo, hi in slice_ranges(4)))
        seen: list[Counter[tuple[str, int]]] = [Counter() for _ in range(4)]
        lags: list[float] = []
        lives = [journal.query.events_by_slices(ShoppingCart.name, lo, hi) for lo, hi in slice_ranges(4)]

        def consume(i: int) -> None:
            for env in lives[i]:
                seen[i][(env.persistence_id, env.seq_nr)] += 1
                lags.append(((env.offset.read_timestamp or env.offset.timestamp) - env.db_timestamp).total_seconds())

        consumers = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(4)]
        for thread in consumers:
            thread.start()

        columns = (TextColumn("[bold]3.[/] shopping carts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("commands", total=COMMANDS)
            started = time.perf_counter()
            counts = run_workload(journal, carts=200, threads=6, commands=COMMANDS, seed=42,
                                  on_command=lambda *_: progress.advance(task))
            elapsed = time.perf_counter() - started

        # A current query stays read_margin behind the clock: wait past it, or the last appends (committed,
        # and possibly already delivered live) would be missing here.
        time.sleep(journal.read_margin + 0.1)
        everything = journal.query.current_events_by_slices(ShoppingCart.name, 0, 1023)
        written = {(e.persistence_id, e.seq_nr) for e in everything}
        deadline = time.time() + 15
        while time.time() < deadline and sum(len(c) for c in seen) < len(written):
            time.sleep(0.1)
        for live in lives:
            live.close()

        delivered: Counter[tuple[str, int]] = Counter()
        for counter in seen:
            delivered.update(counter)
        exactly_once = set(delivered) == written and all(n == 1 for n in delivered.values())

        table = Table(title="Demo summary", show_header=False)
        table.add_row("commands sent", f"{counts.commands:,} in {elapsed:.1f} s ({counts.commands / elapsed:,.0f}/s)")
        table.add_row("accepted / rejected by cart rules", f"{counts.accepted:,} / {counts.rejected:,}")
        table.add_row("events written", f"{len(written):,} for {len({p for p, _ in written}):,} carts")
        table.add_row("checkouts", f"{counts.checkouts:,}")
        for (lo, hi), counter in zip(slice_ranges(4), seen, strict=True):
            table.add_row(f"live consumer {lo}-{hi}", f"{sum(counter.values()):,} events")
        if lags:
            ordered = sorted(lags)
            table.add_row("delivery lag p50 / p99", f"{ordered[len(ordered) // 2] * 1000:.0f} ms / "
                          f"{ordered[int(len(ordered) * 0.99)] * 1000:.0f} ms")
        table.add_row("every event delivered exactly once", "[green]yes[/]" if exactly_once else (
            f"[red]NO[/]: {len(written - set(delivered))} missing, {sum(n > 1 for n in delivered.values())} "
            f"twice, {len(set(delivered) - written)} not in the journal"))
        with journal.connection() as conn:
            horizon = journal.horizon_tracker().read(conn)
        table.add_row("visibility horizon", f"{journal.capabilities.describe()}; {horizon.held_back * 1000:.0f} ms "
                      f"behind the clock, {len(horizon.writers)} journal writer(s) open")
        console.print(table)

    step, failed = 4, []
    for name, run_step in demo_steps():
        console.print(f"[bold]{step}.[/] {name}")
        if run_step(dsn, console) is False:  # a step that checks something says False when it failed
            failed.append(name)
        step += 1
    with Journal.open(dsn) as journal:
        report = verify(journal)
    console.print(f"[bold]{step}.[/] pgjournal verify")
    console.print(render(report))
    sample = min(written)[0] if written else f"{ShoppingCart.name}|1"
    print_commands(console, f"[bold]{step + 1}.[/] what the demo made is in database [cyan]{DEMO_DB}[/]; look at it "
                   "with", look_commands(dsn, ShoppingCart.name, sample))
    if not exactly_once or not report.ok or failed:
        raise SystemExit(1)


#: Add-ons contribute demo steps under this entry-point group: ``"<order> <title>" = "module:function"``,
#: the function taking ``(dsn, console)`` and returning False when its check failed. The core demo never
#: imports an add-on by name.
DEMO_STEPS_GROUP = "pgjournal.demo_steps"


def demo_steps() -> list[tuple[str, Callable[[str, Console], bool | None]]]:
    """The installed add-ons' demo steps, in the order their names give (``"1 ..."`` before ``"2 ..."``)."""
    from importlib.metadata import entry_points

    steps = []
    for entry in sorted(entry_points(group=DEMO_STEPS_GROUP), key=lambda e: e.name):
        title = entry.name.split(" ", 1)[-1]
        try:
            steps.append((title, entry.load()))
        except ImportError as exc:
            steps.append((title, _skipped(f"{title} skipped: {exc}")))
    return steps


def _skipped(message: str) -> Callable[[str, Console], bool | None]:
    return lambda _dsn, console: console.print(f"[dim]{message}[/]")


if __name__ == "__main__":
    main()
