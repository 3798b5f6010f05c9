"""Projections by slice range: per-slice offsets, exactly-once / grouped / at-least-once handlers, leases that
balance slice ranges over worker processes, and management (pause, resume, reset, status with lag)."""

from .handlers import AtLeastOnce, ExactlyOnce, Grouped, Projection, ProjectionSettings
from .runner import LeaseLost, ProjectionFailed, RangeRunner, RunContext, current_context, run_range
from .workers import Worker, run_workers

__all__ = [
    "AtLeastOnce",
    "ExactlyOnce",
    "Grouped",
    "LeaseLost",
    "Projection",
    "ProjectionFailed",
    "ProjectionSettings",
    "RangeRunner",
    "RunContext",
    "Worker",
    "current_context",
    "run_range",
    "run_workers",
]
