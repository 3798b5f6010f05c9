"""A benchmark report as pictures: one chart per scenario (ours beside the references, min-median-max,
ratios and the machine calibration in the caption), a combined chart, and an index page linking them."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .harness import Outcome

OURS = "tab:blue"
REFERENCE = "tab:gray"


def _bars(ax: object, outcome: Outcome) -> None:
    names = list(outcome.values)
    medians = [outcome.median(n) for n in names]
    lows = [m - min(outcome.values[n]) for m, n in zip(medians, names, strict=True)]
    highs = [max(outcome.values[n]) - m for m, n in zip(medians, names, strict=True)]
    colors = [OURS if n.startswith("ours") else REFERENCE for n in names]
    ax.bar(names, medians, yerr=[lows, highs], capsize=4, color=colors)  # type: ignore[attr-defined]
    better = "lower is better" if outcome.scenario.lower_is_better else "higher is better"
    ax.set_title(f"{outcome.scenario.name} ({better})", fontsize=10)  # type: ignore[attr-defined]
    ax.set_ylabel(outcome.scenario.metric)  # type: ignore[attr-defined]
    ax.tick_params(axis="x", rotation=25, labelsize=8)  # type: ignore[attr-defined]
    ratios = outcome.ratios()
    for i, name in enumerate(names):
        if name in ratios:
            ax.annotate(f"{ratios[name]:.2f}×", (i, medians[i]), ha="center", va="bottom",  # type: ignore[attr-defined]
                        fontsize=7, xytext=(0, 3), textcoords="offset points")


def _caption(outcome: Outcome) -> str:
    summary = outcome.summary()
    calibration = summary.get("calibration")
    rounds = (f"{summary['rounds']} interleaved rounds; bars: median, whiskers: min-max; "
              "over a reference: ours vs it (> 1: ours better)")
    if calibration:
        return f"{rounds}; machine: " + ", ".join(f"{k} {v:,.0f}" for k, v in calibration.items())
    return rounds


def write_report(outcomes: list[Outcome], directory: str | Path) -> Path:
    """Write ``<scenario>.png`` per outcome, ``all.png`` and ``index.html`` into ``directory``; returns the
    index page's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for outcome in outcomes:
        fig, ax = plt.subplots(figsize=(6, 4))
        _bars(ax, outcome)
        fig.text(0.01, 0.01, _caption(outcome), fontsize=7)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        fig.savefig(out / f"{outcome.scenario.name}.png", dpi=110)
        plt.close(fig)
        if outcome.scenario.chart is not None:
            outcome.scenario.chart([outcome.summary()], out / f"{outcome.scenario.name}-detail.png")
    plot_all(outcomes, out / "all.png")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = "\n".join(
        f"<h2>{html.escape(o.scenario.name)}</h2><p>{html.escape(o.scenario.description)}</p>"
        f'<img src="{html.escape(o.scenario.name)}.png" alt="{html.escape(o.scenario.name)}">'
        + (f'<img src="{html.escape(o.scenario.name)}-detail.png" alt="{html.escape(o.scenario.name)} detail">'
           if o.scenario.chart is not None else "")
        + f"<pre>{html.escape(json.dumps(o.summary(), indent=1))}</pre>"
        for o in outcomes)
    index = out / "index.html"
    index.write_text(f"<!doctype html><meta charset=utf-8><title>pgjournal benchmarks</title>"
                     f"<h1>pgjournal benchmarks, {stamp}</h1><img src=all.png alt=all>{rows}\n")
    return index


def plot_all(outcomes: list[Outcome], path: str | Path) -> None:
    """One figure with a panel per scenario."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(outcomes), figsize=(4.2 * len(outcomes), 3.8), squeeze=False)
    for ax, outcome in zip(axes[0], outcomes, strict=True):
        _bars(ax, outcome)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
