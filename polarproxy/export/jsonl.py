"""JSONL export: one export row (schemas/export-row.v2.json) per line."""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from typing import IO, Any

import orjson

from polarproxy.export.atomic import atomic_file
from polarproxy.export.rows import ExportStats, trajectory_to_row
from polarproxy.reconstruct.trajectory import Trajectory

__all__ = ["ExportStats", "write_jsonl"]


def _write_rows(trajectories: Iterable[Trajectory], write: Any) -> ExportStats:
    stats = ExportStats()
    for traj in trajectories:
        write(orjson.dumps(trajectory_to_row(traj), option=orjson.OPT_APPEND_NEWLINE))
        stats.add(traj)
    return stats


def write_jsonl(trajectories: Iterable[Trajectory], out: str | os.PathLike[str] | IO[Any]) -> ExportStats:
    """Write one row per trajectory to a file path or an open stream (text or binary).

    A path is written atomically: rows go to a temporary file in the same folder, which is synced and renamed
    over `out` only once every row is written, so `out` is either the old file or the complete new one.
    """
    if not isinstance(out, (str, os.PathLike)):
        if isinstance(out, (io.RawIOBase, io.BufferedIOBase)) or "b" in getattr(out, "mode", ""):
            return _write_rows(trajectories, out.write)
        return _write_rows(trajectories, lambda data: out.write(data.decode()))

    with atomic_file(out) as f:
        return _write_rows(trajectories, f.write)
