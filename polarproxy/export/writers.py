"""Export formats by name: each writer takes trajectories and a path, and returns ExportStats."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from polarproxy.choices import TOKEN_FORMATS
from polarproxy.export.rows import ExportStats
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory


class Writer(Protocol):
    """`write(trajectories, out, append=None, durable=True) -> ExportStats`; `append` gives files of the same
    format whose rows follow (export/parallel.py); `durable` False leaves the file unsynced (such a part)."""

    def __call__(
        self,
        trajectories: Iterable[Trajectory | SpanTrajectory],
        out: str | os.PathLike[str],
        *,
        append: Callable[[], Sequence[str]] | None = None,
        durable: bool = True,
    ) -> ExportStats: ...


FORMATS = TOKEN_FORMATS


def get_writer(fmt: str) -> Writer:
    """The writer of format `fmt` ('jsonl' or 'parquet'); ValueError naming the allowed ones otherwise."""
    if fmt == "jsonl":
        from polarproxy.export.jsonl import write_jsonl

        return write_jsonl
    if fmt == "parquet":
        from polarproxy.export.parquet import write_parquet

        return write_parquet
    raise ValueError(f"Unknown format {fmt!r}. Must be one of {', '.join(repr(f) for f in FORMATS)}.")
