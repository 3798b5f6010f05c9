"""The projection part of ``make demo``: 4 worker processes build a read model while writers append, 4 more
join mid-run (the leases re-balance to 8 ranges), lag is shown as it goes, and at the end the read model is
checked against the journal."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pgjournal.cli.demo import command_line, print_commands
from pgjournal.journal import Journal
from pgjournal.store import leases as lease_sql
from pgjournal.store import stats

from . import management
from .examples import counter_mismatches, ensure_counter_table

NAME = "demo-accounts"
ENTITY_TYPE = "DemoAcct"
ROOT = Path(__file__).resolve().parent.parent
#: Quick polling so the demo is lively; production defaults are slower.
SETTINGS: dict[str, Any] = {"refresh_interval": 0.2, "backtracking_window": 5.0,
                             "backtracking_behind_current_time": 1.0}


def _spawn(dsn: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update({f"PGJOURNAL_{k.upper()}": str(v) for k, v in SETTINGS.items()})
    return subprocess.Popen(
        [sys.executable, "-m", "pgjournal.projections.workers", NAME, ENTITY_TYPE, "--dsn", dsn,
         "--lease-duration", "3", "--renew-interval", "0.5"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _status_table(journal: Journal, title: str) -> Table:
    state = management.status(journal, NAME, [ENTITY_TYPE])
    owners = {owner: f"worker {i + 1}" for i, owner in enumerate(state.workers)}
    table = Table("slices", "owner", "latest offset", "lag (s)", title=f"{title}: {len(state.workers)} live workers")
    for r in state.ranges:
        table.add_row(r.slices, owners.get(r.owner or "", r.owner or "(free)"),
                      r.newest_offset.strftime("%H:%M:%S.%f")[:-3] if r.newest_offset else "-",
                      f"{r.lag:.2f}" if r.lag is not None else "-")
    return table


def _reset(journal: Journal) -> None:
    ensure_counter_table(journal)
    management.clear_offset(journal, NAME)
    with journal.connection() as conn:
        conn.execute("DELETE FROM projection_counter WHERE projection_name = %s", (NAME,))
        for statement in lease_sql.forget(NAME):
            conn.execute(*statement)


def run_demo(dsn: str | None, console: Console) -> None:
    with Journal.open(dsn, migrate=True, **SETTINGS) as journal:
        _reset(journal)
        stop = threading.Event()
        written = [0]

        # Random ids: similar strings ("a1", "a2", ...) hash to neighbouring slices and would leave ranges empty.
        accounts = [f"{ENTITY_TYPE}|{random.getrandbits(48):012x}" for _ in range(300)]

        def write(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                journal.append(rng.choice(accounts), [{"amount": rng.randint(1, 100)}])
                written[0] += 1
                time.sleep(0.002)

        writers = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(3)]
        console.rule("[bold]Projection by slice ranges: 4 workers, then 8")
        console.print(f"Writers append to {ENTITY_TYPE} accounts; projection {NAME!r} keeps a per-account counter "
                      "in the same transaction as its per-slice offsets.")
        for t in writers:
            t.start()
        procs = [_spawn(journal.dsn) for _ in range(4)]
        try:
            _wait_for_workers(journal, 4, timeout=60)
            time.sleep(2)
            console.print(_status_table(journal, "4 workers"))
            console.print("[bold]Rescaling:[/] starting 4 more workers; leases move slices without a stop.")
            procs += [_spawn(journal.dsn) for _ in range(4)]
            _wait_for_workers(journal, 8, timeout=60)
            time.sleep(3)
            console.print(_status_table(journal, "8 workers"))
            stop.set()
            for t in writers:
                t.join()
            console.print(f"Writers stopped after {written[0]:,} appends; waiting for the projection to catch up ...")
            deadline = time.monotonic() + 90
            while counter_mismatches(journal, NAME, ENTITY_TYPE) and time.monotonic() < deadline:
                time.sleep(0.5)
            console.print(_status_table(journal, "caught up"))
            mismatches = counter_mismatches(journal, NAME, ENTITY_TYPE)
            with journal.connection() as conn:
                totals = stats.totals(ENTITY_TYPE).one(conn)
            total, account_count = (totals.events, totals.persistence_ids) if totals else (0, 0)
            if mismatches:
                console.print(f"[bold red]read model differs from the journal for {len(mismatches)} account(s):[/] "
                              f"{mismatches[:5]}")
                raise SystemExit(1)
            console.print(f"[bold green]read model == journal[/]: {total:,} events of {account_count} accounts, each "
                          "counted exactly once across the rescale.")
            print_commands(console, "The projection's offsets, workers and lag:",
                           [command_line(journal.dsn, "projection", "status", NAME)])
        finally:
            stop.set()
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _wait_for_workers(journal: Journal, n: int, timeout: float) -> None:
    """Until ``n`` workers are live and the slices are split among them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = management.status(journal, NAME, [ENTITY_TYPE])
        if len(state.workers) == n and len({r.owner for r in state.ranges if r.owner}) == n:
            return
        time.sleep(0.3)


if __name__ == "__main__":
    run_demo(os.environ.get("PGJOURNAL_DSN"), Console())
