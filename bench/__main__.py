"""python -m bench SCENARIO|all [--quick] [--dsn DSN] [--rounds N] [--json] [--plot]"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from pgjournal.server.dsn import mask_dsn, resolve_dsn

from .calibration import measure as measure_calibration
from .harness import Outcome, Scenario, Shared, run_scenario
from .report import plot_all, write_report

# Each module defines SCENARIOS: list[Scenario]. A module whose optional peers are missing is skipped.
SCENARIO_MODULES = ["bench.append", "bench.by_slices", "bench.latency", "bench.entities", "bench.tags",
                    "bench.spark_load", "bench.spark_source", "bench.projection", "bench.restart",
                    "bench.firehose", "bench.transcoding", "bench.async_append", "bench.tags_filter",
                    "bench.scale_out", "bench.shard_move", "bench.worker_start", "bench.replication"]


def load_scenarios() -> dict[str, Scenario]:
    found: dict[str, Scenario] = {}
    for module_name in SCENARIO_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            Console(stderr=True).print(f"[yellow]skipping {module_name}: {exc}[/]")
            continue
        for scenario in module.SCENARIOS:
            found[scenario.name] = scenario
    return found


def render(outcome: Outcome, console: Console) -> None:
    scenario = outcome.scenario
    better = "lower is better" if scenario.lower_is_better else "higher is better"
    heading = "ours ÷ this" if not scenario.lower_is_better else "this ÷ ours"
    table = Table("contender", "min", "median", "max", heading, f"{heading} per round (median)",
                  title=f"{scenario.name}: {scenario.metric} ({better})", caption=scenario.description)
    ratios, paired = outcome.ratios(), outcome.paired_ratios()
    for name, values in outcome.values.items():
        ratio = f"{ratios[name]:.2f}×" if name in ratios else ""
        per_round = f"{statistics.median(paired[name]):.2f}×" if paired.get(name) else ""
        table.add_row(name, f"{min(values):,.1f}", f"{outcome.median(name):,.1f}", f"{max(values):,.1f}", ratio,
                      per_round, style="bold" if name.startswith("ours") else None)
    console.print(table)
    for note in outcome.notes:
        console.print(f"  [dim]{note}[/]")


def main(argv: list[str] | None = None) -> int:
    scenarios = load_scenarios()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("scenario", nargs="+",
                        help=f"one of: all, {', '.join(scenarios)}; a prefix runs each scenario it names, e.g. "
                             "scale-out: scale-out-append and scale-out-catchup over 1, 2, 4 databases on private "
                             "embedded servers (started for the run, deleted after)")
    parser.add_argument("--quick", action="store_true", help="small data, 3 rounds: a smoke run under a minute")
    parser.add_argument("--dsn", help="server to run on (default: the embedded PostgreSQL)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per contender (default 3)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object per scenario run")
    parser.add_argument("--plot", metavar="PNG", help="write one chart of every scenario run (ours vs references)")
    parser.add_argument("--report", metavar="DIR", help="write a chart per scenario, all.png and index.html to DIR")
    parser.add_argument("--scale-5m", action="store_true", help="scale: also a 5,000,000-event journal (slow)")
    parser.add_argument("--no-calibration", action="store_true",
                        help="skip the machine calibration (raw INSERT and ordered-scan rates) measured at the start")
    args = parser.parse_args(argv)
    run_scale = "scale" in args.scenario
    requested = [name for name in args.scenario if name != "scale"]
    names = list(scenarios) if requested == ["all"] else [
        match for name in requested
        for match in ([name] if name in scenarios else [s for s in scenarios if s.startswith(name + "-")] or [name])
    ]
    if not names and not run_scale:
        parser.error("no scenario given")
    unknown = [n for n in names if n not in scenarios]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from all, {', '.join(scenarios)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    dsn = resolve_dsn(args.dsn)
    console = Console(stderr=args.json)
    console.print(f"[dim]server: {mask_dsn(dsn)}; {'quick' if args.quick else 'full'} mode; {args.rounds} rounds[/]")
    outcomes = []
    with console.status("starting") as status, Shared() as shared:
        calibration: dict[str, float] = {}
        if not args.no_calibration:
            status.update("calibration: raw INSERT and ordered scan rates")
            calibration = measure_calibration(dsn).as_dict()
            console.print(f"[dim]calibration: raw INSERT {calibration['raw_insert_per_s']:,.0f}/s (1 connection), "
                          f"ordered binary scan {calibration['ordered_scan_rows_per_s']:,.0f} rows/s, "
                          f"load average {calibration['load_average']:.1f}[/]")
        for name in names:
            outcome = run_scenario(scenarios[name], dsn, quick=args.quick, rounds=args.rounds,
                                   progress=lambda m: status.update(m), calibration=calibration,
                                   shared=shared)
            render(outcome, console)
            outcomes.append(outcome)
        summaries: list[dict[str, Any]] = [o.summary() for o in outcomes]
        if run_scale:
            summaries.append(_scale(args, dsn, console, calibration, status.update))
    if args.plot and outcomes:
        path = args.plot if not run_scale else args.plot.replace(".png", "") + "-scenarios.png"
        plot_all(outcomes, path)
        console.print(f"plot written to {path}")
    if args.report and outcomes:
        console.print(f"report written to {write_report(outcomes, args.report)}")
    if args.json:
        sys.stdout.write(json.dumps(summaries[0] if len(summaries) == 1 else summaries) + "\n")
    return 0


def _scale(args: argparse.Namespace, dsn: str, console: Console, calibration: dict[str, float],
           progress: Any) -> dict[str, Any]:
    """The ``scale`` curves (bench.scale): a table per kind, the PNG, a JSON summary with the calibration."""
    from . import scale
    from .harness import RESULTS_DIR

    curves = scale.run(dsn, quick=args.quick, big=args.scale_5m, progress=progress)
    for kind, unit in (("append", "events/s"), ("catchup", "rows/s")):
        table = Table("events in journal", *[str(n) for n in curves["counts"]],
                      title=f"scale: {kind} {unit} by writers/consumers (cost ratio vs smallest size, 1)")
        for size, curve in curves[kind].items():
            ratios = curves[f"{kind}_cost_ratio"][size]
            table.add_row(f"{size:,}", *[f"{rate:,.0f} ({ratios[n]:.2f})" for n, rate in curve.items()])
        console.print(table)
    RESULTS_DIR.mkdir(exist_ok=True)
    path = args.plot or str(RESULTS_DIR / "scale.png")
    scale.plot(curves, path)
    console.print(f"scale chart written to {path}")
    return {"scenario": "scale", "metric": "events_per_s / rows_per_s", "curves": curves, "plot": path,
            "calibration": calibration}


if __name__ == "__main__":
    sys.exit(main())
