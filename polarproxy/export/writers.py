"""Export formats by name: each writer takes trajectories and a path, and returns ExportStats."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from polarproxy.export.rows import ExportStats
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory

Writer = Callable[[Iterable[Trajectory | SpanTrajectory], str | os.PathLike[str]], ExportStats]
FORMATS = ("jsonl", "parquet")


def get_writer(fmt: str) -> Writer:
    """The writer of format `fmt` ('jsonl' or 'parquet'); ValueError naming the allowed ones otherwise."""
    if fmt == "jsonl":
        from polarproxy.export.jsonl import write_jsonl

        return write_jsonl
    if fmt == "parquet":
        from polarproxy.export.parquet import write_parquet

        return write_parquet
    raise ValueError(f"Unknown format {fmt!r}. Must be one of {', '.join(repr(f) for f in FORMATS)}.")
