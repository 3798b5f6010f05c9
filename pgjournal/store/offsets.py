"""Conventions of ``projection_timestamp_offset_store``, shared by projections and Spark load watermarks."""

from __future__ import annotations

#: A row with this persistence id marks a slice as read up to its timestamp with nothing seen at it.
MARKER_PID = ""
