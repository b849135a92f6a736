"""JSONL export: one export row (schemas/export-row.v3.json) per line.

A SpanTrajectory (built from the store's token arrays, reconstruct/trajectory.py) is written without a
Python object per token: orjson writes `input_ids` from the int32 array itself, `loss_mask` is runs of
`0,` and `1,` made by repeating bytes, and `logprobs` is one float64 array written by orjson: the float32
values widened (the value a Python float of them has, so the text is the one a list of floats gives), NaN
(written `null`) outside the call spans. The bytes equal those of the row's lists (tests/export).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any

import numpy as np
import orjson

from polarproxy.export.atomic import atomic_file
from polarproxy.export.rows import ExportStats, span_row, trajectory_to_row
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory

__all__ = ["ExportStats", "span_row_json", "write_jsonl"]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def _close(parts: list[bytes]) -> orjson.Fragment:
    """A JSON array from comma-terminated parts."""
    body = b"".join(parts)
    return orjson.Fragment(b"[" + body[:-1] + b"]" if body else b"[]")


def _mask_json(n: int, spans: list[tuple[int, int]]) -> orjson.Fragment:
    parts: list[bytes] = []
    end = 0
    for a, b in spans:
        parts += (b"0," * (a - end), b"1," * (b - a))
        end = b
    parts.append(b"0," * (n - end))
    return _close(parts)


def span_row_json(traj: SpanTrajectory) -> bytes:
    """The JSONL line of a SpanTrajectory (with its newline); errors as trajectory_to_row's."""
    n, spans = len(traj.input_ids), traj.call_spans
    tokens = {
        "input_ids": traj.input_ids,
        "loss_mask": _mask_json(n, spans),
        # NaN is written `null`; a recorded logprob is finite (span_row refuses the row otherwise)
        "logprobs": traj.logprobs_filled(np.nan, np.float64),
    }
    return orjson.dumps(span_row(traj, tokens), option=_NUMPY)


def _line(traj: Trajectory | SpanTrajectory) -> bytes:
    if isinstance(traj, SpanTrajectory):
        return span_row_json(traj)
    return orjson.dumps(trajectory_to_row(traj), option=orjson.OPT_APPEND_NEWLINE)


def _write_rows(trajectories: Iterable[Trajectory | SpanTrajectory], write: Any) -> ExportStats:
    stats = ExportStats()
    for traj in trajectories:
        if stats.skip_if_empty(traj):
            continue
        write(_line(traj))
        stats.add(traj)
    return stats


def write_jsonl(
    trajectories: Iterable[Trajectory | SpanTrajectory],
    out: str | os.PathLike[str] | IO[Any],
    *,
    append: Callable[[], Sequence[str]] | None = None,
    durable: bool = True,
) -> ExportStats:
    """Write one row per trajectory to a file path or an open stream (text or binary). Trajectories without
    a token are left out and counted (`ExportStats.skipped_empty_rows`).

    A path is written atomically: rows go to a temporary file in the same folder, which is synced and renamed
    over `out` only once every row is written, so `out` is either the old file or the complete new one.
    `append` (a path only): called once the rows are written, it gives JSONL files whose bytes follow them
    (the parts of a parallel export, export/parallel.py); an error it raises fails the export. `durable`
    False (a path only): the file is not synced to disk (a part of a parallel export, synced where it is
    appended).
    """
    if not isinstance(out, (str, os.PathLike)):
        if append is not None:
            raise ValueError("append= needs an output path, not an open stream")
        if isinstance(out, (io.RawIOBase, io.BufferedIOBase)) or "b" in getattr(out, "mode", ""):
            return _write_rows(trajectories, out.write)
        return _write_rows(trajectories, lambda data: out.write(data.decode()))

    with atomic_file(out, durable=durable) as f:
        stats = _write_rows(trajectories, f.write)
        for part in append() if append is not None else ():
            f.append_file(part)
        return stats
