"""Token exports in several processes (`polarproxy export --jobs N`): one file, the rows in the same order.

An export is CPU-bound Python (rows read, trajectories built, rows encoded) on one core. With N jobs the
episodes, in the order the export reads them (store/token_calls.py `episode_calls`), are cut into N
contiguous parts of about equal calls. Parts 2..N go to worker processes, forked when the export starts
(before this process starts any thread of its own), each with its own connection to the store, each writing
its rows to a part file next to `out` with the same writer. This process writes part 1 into `out`'s
temporary file itself, then appends the workers' parts in order (JSONL: their bytes; Parquet: their row
groups), so the file holds exactly the rows, in exactly the order, of a one-job export. Every episode is
in one part, so strategies that work per episode (prefix-merge, advantages over groups computed before the
fork) give the same rows.

All or nothing: a worker that fails makes the export fail with its error, and the old `out` stays as it was
(atomic.py); part files are removed in every case. Where processes cannot be forked safely (not Linux, an
in-memory database, a process running other Python threads, the plain reference path), the export runs as
one job and says so (`jobs` in the summary). Measured (docs/benchmarks-history.md): it pays where building rows is
the work; each part is written twice (by its worker, unsynced, then into the file, which alone is synced)
and Parquet parts are encoded again when appended, so disk-bound and Parquet exports gain nothing yet.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polarproxy.export.rows import ExportStats

MIN_CALLS_PER_JOB = 2000  # fewer calls than this per job: not worth a process (~0.1 s to start one)


class ExportJobError(RuntimeError):
    """A worker process of a parallel export failed; its error, as it was raised there (the file is left as
    it was)."""


def why_not_parallel(store: Any) -> str | None:
    """Why this export cannot run in several processes here, or None. Forking copies only the forking
    thread: another Python thread of this process could hold a lock the copy then waits on forever, so an
    export from a process running other Python threads runs as one job. (Native threads of numpy's BLAS and
    of pyarrow are not Python threads; those libraries reset their state in a forked child.)"""
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return "worker processes are forked, which only Linux does safely"
    if threading.active_count() > 1:
        return "this process runs other threads, which a forked worker could deadlock on"
    from polarproxy.store.engine import is_sqlite_memory

    if is_sqlite_memory(store.engine.url):  # the URL object: no password rendered into a string
        return "an in-memory database lives in this process alone"
    return None


def split(episodes: Sequence[tuple[str, int]], jobs: int) -> list[list[str]]:
    """`episodes` ((ID, calls) in export order) cut into at most `jobs` contiguous parts, none empty, whose
    largest holds as few calls as a contiguous cut allows (the smallest bound that greedy packing fits in
    `jobs` parts, found by bisection); fewer parts where the export holds under MIN_CALLS_PER_JOB calls
    a job."""
    if not episodes:
        return []
    total = sum(n for _, n in episodes)
    jobs = max(1, min(jobs, len(episodes), total // MIN_CALLS_PER_JOB or 1))

    def pack(bound: int) -> list[list[str]]:
        parts: list[list[str]] = [[]]
        size = 0
        for eid, n in episodes:
            if parts[-1] and size + n > bound:
                parts.append([])
                size = 0
            parts[-1].append(eid)
            size += n
        return parts

    low, high = max((n for _, n in episodes), default=0), max(total, 1)
    while low < high:  # the smallest bound that packs into `jobs` parts
        mid = (low + high) // 2
        if len(pack(mid)) <= jobs:
            high = mid
        else:
            low = mid + 1
    return pack(low)


@dataclass
class _Worker:
    process: Any  # multiprocessing.Process
    conn: Any  # the read end of its result pipe
    path: str  # its part file


Work = Callable[[list[str], str], tuple[ExportStats, int]]  # (episode IDs, part path) -> (stats, dropped)


def _run(work: Work, ids: list[str], path: str, conn: Any) -> None:
    try:
        stats, dropped = work(ids, path)
        conn.send(("ok", stats, dropped))
    except BaseException as e:  # reported to the parent, which fails the export with it
        conn.send(("error", f"{type(e).__name__}: {e}", None))
    finally:
        conn.close()


class Workers:
    """The worker processes of one export: `start` forks them, `results` waits for them all (raising the
    first failure), `close` ends any still running and removes every part file."""

    def __init__(self, out: str | os.PathLike[str], parts: list[list[str]], work: Work) -> None:
        self._out = Path(out)
        self._parts = parts
        self._work = work
        self._workers: list[_Worker] = []

    def start(self, store: Any) -> None:
        """Fork the workers. `store`'s pooled connections are closed first: a forked process must not share
        an open database connection (SQLite and psycopg alike); each worker opens its own, and this process
        reopens its own on its next read."""
        store.engine.dispose()
        ctx = multiprocessing.get_context("fork")
        for ids in self._parts:
            fd, path = tempfile.mkstemp(
                prefix=f".{self._out.name}.part-", suffix=".tmp", dir=self._out.parent
            )
            os.close(fd)
            receive, send = ctx.Pipe(duplex=False)
            process = ctx.Process(target=_run, args=(self._work, ids, path, send), daemon=True)
            self._workers.append(_Worker(process, receive, path))
            with warnings.catch_warnings():  # the native library threads above (why_not_parallel)
                warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
                process.start()
            send.close()

    def results(self) -> list[tuple[str, ExportStats, int]]:
        """(part file, its stats, rows dropped for want of an advantage) per worker, in part order."""
        out = []
        for w in self._workers:
            try:
                kind, value, dropped = w.conn.recv()
            except EOFError:
                w.process.join()
                raise ExportJobError(
                    f"An export worker process died without a result (exit code {w.process.exitcode})."
                ) from None
            w.process.join()
            if kind != "ok":
                raise ExportJobError(f"An export worker failed: {value}")
            out.append((w.path, value, dropped))
        return out

    def close(self) -> None:
        for w in self._workers:
            if w.process.is_alive():
                w.process.terminate()
            w.process.join()
            w.conn.close()
            try:
                os.unlink(w.path)
            except FileNotFoundError:
                pass
        self._workers = []
