"""Export: trajectories → files (JSONL today)."""

from __future__ import annotations

from polarproxy.export.jsonl import write_jsonl
from polarproxy.export.rows import ExportStats, trajectory_to_row
from polarproxy.export.schema import load_schema

__all__ = ["ExportStats", "load_schema", "trajectory_to_row", "write_jsonl"]
