"""Scenarios, interleaved rounds, results as JSON lines, a Rich table, an optional plot.

A scenario measures *contenders* ("ours" and one or more references) on the same data. Rounds are
interleaved (ours, ref, ours, ref, ...) so machine noise hits all alike. Each contender returns the
scenario's metric for one round (higher is better unless ``lower_is_better``).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import psycopg.conninfo

from pgjournal.admin.migrate import upgrade

RESULTS_DIR = Path(__file__).parent / "results"

Contender = Callable[["Context", Any], float]
T = TypeVar("T")


class Shared:
    """What the scenarios of one run share, made by the first that asks and closed when the run ends (the
    ``scale-out`` scenarios' private servers: started once for both)."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._made: dict[str, Any] = {}

    def get(self, key: str, make: Callable[[], AbstractContextManager[T]]) -> T:
        if key not in self._made:
            self._made[key] = self._stack.enter_context(make())
        return self._made[key]  # type: ignore[no-any-return]

    def close(self) -> None:
        self._stack.close()
        self._made.clear()

    def __enter__(self) -> Shared:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass
class Scenario:
    name: str
    metric: str
    description: str
    #: Called once per scenario run with a fresh migrated database; returns state passed to contenders.
    setup: Callable[[Context], Any]
    #: "ours" first, then the references, each measuring one round.
    contenders: dict[str, Contender]
    lower_is_better: bool = False
    #: Called after the rounds (drop helper tables, close pools).
    teardown: Callable[[Context, Any], None] | None = None
    #: A chart of its own beside the bars, drawn from summaries (Outcome.summary, or saved JSON lines) into a
    #: PNG: ``--report`` writes it as ``<name>-detail.png``.
    chart: Callable[[list[dict[str, Any]], Path], None] | None = None
    #: Rounds per round asked for (``--rounds``), each that much shorter (the scenario sizes them), and the
    #: contenders' order rotated from round to round: on a shared machine a burst of load lasts seconds and
    #: hits whichever contender runs then, so short rounds interleaved finely, none always first, let every
    #: contender's median see the same load (``tags-append-1``: a single writer's rate is its latency).
    split: int = 1


@dataclass
class Context:
    dsn: str
    quick: bool
    notes: list[str] = field(default_factory=list)
    #: The server's DSN (scenarios that make their own scratch databases, like ``scale``, need it).
    server_dsn: str = ""
    #: Figures beside the contenders' (Outcome.extra, in the JSON summary).
    extra: dict[str, Any] = field(default_factory=dict)
    #: Resources shared with the run's other scenarios (alone: closed after this scenario).
    shared: Shared = field(default_factory=Shared)

    def note(self, text: str) -> None:
        """Something worth printing beside the figures (a plan, a page count)."""
        self.notes.append(text)


@contextmanager
def scratch_database(server_dsn: str) -> Iterator[str]:
    """A fresh migrated database, dropped afterwards."""
    name = f"pgjournal_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = psycopg.conninfo.make_conninfo(server_dsn, dbname=name)
    try:
        upgrade(dsn)
        yield dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Outcome:
    scenario: Scenario
    values: dict[str, list[float]]
    notes: list[str]
    #: The run's machine calibration (bench.calibration), the same in every outcome of one run.
    calibration: dict[str, float] = field(default_factory=dict)
    #: Extra figures a scenario reports beside its contenders (a scaling table, peak memory).
    extra: dict[str, Any] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])

    def references(self) -> list[str]:
        """Contenders that are not ours ("ours" and variants named "ours_...")."""
        return [name for name in self.values if not name.startswith("ours")]

    def ratios(self) -> dict[str, float]:
        ours = self.median("ours")
        out = {}
        for name in self.references():
            ref = self.median(name)
            if self.scenario.lower_is_better:
                out[name] = ref / ours if ours else float("inf")
            else:
                out[name] = ours / ref if ref else float("inf")
        return out

    def paired_ratios(self) -> dict[str, list[float]]:
        """Per reference, ours ÷ it within each round (``this ÷ ours`` when lower is better): both measured back to
        back under the same load, so the median of these moves less with the machine's load than the ratio of
        the two medians does, which pairs values from different rounds."""
        out = {}
        for name in self.references():
            pairs = zip(self.values["ours"], self.values[name], strict=False)
            if self.scenario.lower_is_better:
                out[name] = [ref / ours if ours else float("inf") for ours, ref in pairs]
            else:
                out[name] = [ours / ref if ref else float("inf") for ours, ref in pairs]
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.name,
            "metric": self.scenario.metric,
            "ours": round(self.median("ours"), 3),
            "variants": {k: round(self.median(k), 3) for k in self.values if k.startswith("ours_")},
            "references": {k: round(self.median(k), 3) for k in self.references()},
            "ratios": {k: round(v, 3) for k, v in self.ratios().items()},
            "paired_ratios": {k: [round(r, 3) for r in v] for k, v in self.paired_ratios().items()},
            "paired_median": {k: round(statistics.median(v), 3) for k, v in self.paired_ratios().items() if v},
            "rounds": len(self.values["ours"]),
            "calibration": self.calibration,
            **({"extra": self.extra} if self.extra else {}),
        }


def run_scenario(scenario: Scenario, server_dsn: str, *, quick: bool, rounds: int,
                 progress: Callable[[str], None] = lambda _m: None,
                 calibration: dict[str, float] | None = None, shared: Shared | None = None) -> Outcome:
    """Run ``scenario``'s rounds; ``shared``: what it may share with the run's other scenarios (the caller
    closes it), else its own, closed at the end."""
    values: dict[str, list[float]] = {name: [] for name in scenario.contenders}
    calibration = calibration or {}
    with scratch_database(server_dsn) as dsn, Shared() as own:
        ctx = Context(dsn, quick, server_dsn=server_dsn, shared=shared or own)
        state = scenario.setup(ctx)
        try:
            names = list(scenario.contenders)
            for round_no in range(1, rounds * scenario.split + 1):
                turn = (round_no - 1) % len(names) if scenario.split > 1 else 0
                for name in names[turn:] + names[:turn]:
                    contender = scenario.contenders[name]
                    progress(f"{scenario.name}: round {round_no}/{rounds * scenario.split}, {name}")
                    value = contender(ctx, state)
                    values[name].append(value)
                    _record(scenario, name, round_no, value, quick, calibration)
        finally:
            if scenario.teardown is not None:
                scenario.teardown(ctx, state)
    return Outcome(scenario, values, ctx.notes, calibration, ctx.extra)


def _record(scenario: Scenario, name: str, round_no: int, value: float, quick: bool,
            calibration: dict[str, float]) -> None:
    RESULTS_DIR.mkdir(exist_ok=True)
    line = {"time": time.time(), "scenario": scenario.name, "contender": name, "round": round_no,
            "metric": scenario.metric, "value": value, "quick": quick, "host": platform.node(),
            "calibration": calibration}
    with open(RESULTS_DIR / f"{time.strftime('%Y%m%d')}.jsonl", "a") as out:
        out.write(json.dumps(line) + "\n")
