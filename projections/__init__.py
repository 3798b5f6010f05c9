"""Projections by slice range: per-slice offsets, exactly-once / grouped / at-least-once handlers, leases that
balance slice ranges over worker processes, management (pause, resume, reset, status with lag) and dead letters
for poison events."""

from pgjournal.errors import LeaseLost, ProjectionFailed

from .dead_letters import DeadLetter, Undecodable, list_dead_letters, retry_dead_letters
from .handlers import AtLeastOnce, ExactlyOnce, Grouped, Projection, ProjectionSettings
from .runner import RangeRunner, RunContext, current_context, run_range
from .workers import ShardedWorker, Worker, run_workers

__all__ = [
    "AtLeastOnce",
    "DeadLetter",
    "ExactlyOnce",
    "Grouped",
    "LeaseLost",
    "Projection",
    "ProjectionFailed",
    "ProjectionSettings",
    "RangeRunner",
    "RunContext",
    "ShardedWorker",
    "Undecodable",
    "Worker",
    "current_context",
    "list_dead_letters",
    "retry_dead_letters",
    "run_range",
    "run_workers",
]
