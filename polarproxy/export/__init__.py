"""Export: trajectories → files (JSONL, Parquet)."""

from __future__ import annotations

from polarproxy.export.jsonl import write_jsonl
from polarproxy.export.parquet import read_parquet_rows, write_parquet
from polarproxy.export.rows import ExportStats, trajectory_to_row
from polarproxy.export.schema import load_schema

__all__ = [
    "ExportStats",
    "load_schema",
    "read_parquet_rows",
    "trajectory_to_row",
    "write_jsonl",
    "write_parquet",
]
