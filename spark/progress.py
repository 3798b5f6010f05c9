"""Progress of a Spark action: tasks done out of tasks known, polled from the status tracker."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")


@dataclass(frozen=True)
class Progress:
    """``done`` of ``total`` tasks of the jobs started so far for one step (``step`` names it)."""

    step: str
    done: int
    total: int


ProgressCallback = Callable[[Progress], None]


def tracked(spark: SparkSession, step: str, action: Callable[[], T], on_progress: ProgressCallback | None,
            *, interval: float = 0.5) -> T:
    """Run ``action`` (a Spark action) and report its tasks every ``interval`` seconds to ``on_progress``."""
    if on_progress is None:
        return action()
    sc = spark.sparkContext
    group = f"pgjournal-{uuid.uuid4().hex[:8]}"
    outcome: dict[str, object] = {}

    def run() -> None:
        sc.setJobGroup(group, step, interruptOnCancel=True)
        try:
            outcome["value"] = action()
        except BaseException as exc:
            outcome["error"] = exc

    last = Progress(step, 0, 0)

    def report() -> None:
        nonlocal last
        tracker = sc.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        last = Progress(step, done, total)
        on_progress(last)

    worker = threading.Thread(target=run, name=f"spark-{step}", daemon=True)
    on_progress(Progress(step, 0, 0))
    worker.start()
    try:
        while worker.is_alive():
            worker.join(interval)
            report()
    except KeyboardInterrupt:
        sc.cancelJobGroup(group)
        raise
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    on_progress(Progress(step, last.total, last.total))  # the tracker may lag the end of the action
    return outcome["value"]  # type: ignore[return-value]
