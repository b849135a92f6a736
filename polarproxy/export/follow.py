"""`export --follow URL`: a `serve` gateway's trajectory stream written as files while rollouts run, in any
export format, so a trainer polls a folder.

Each answer of the stream (whole groups, with the advantages the gateway computed, export/pull.py) becomes
new files in `out`: `NNNNNN.EXT` numbered from 0 (`N.pt` for slime, one per `groups_per_file` groups, its
`--load-debug-rollout-data 'OUT/{rollout_id}.pt'` template). Each file is written under a temporary name and
renamed when complete, so a poller never reads half a file. After the files of an answer, the stream's
cursor and the next file number are saved in `out/.polarproxy-follow.json`; a restart resumes there, and
an answer whose files were written but whose cursor was not is written again under the same names.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarproxy.choices import TRAINER_FORMATS
from polarproxy.errors import UsageError
from polarproxy.export.pull import TrajectoryPuller
from polarproxy.export.rows import ExportStats, row_trajectory
from polarproxy.redact import without_userinfo

STATE = ".polarproxy-follow.json"
EXTENSIONS = {
    "jsonl": "jsonl",
    "parquet": "parquet",
    "slime": "pt",
    "verl": "parquet",
    "trl": "jsonl",
    "nemo-rl": "jsonl",
    "openrlhf": "jsonl",
}
WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class ExportFollowConfig:
    """Where the rows come from (`url`, its control `token`), what to pull (`strategy`, `advantages` at the
    gateway) and how to write them (`fmt` into the folder `out`)."""

    url: str
    out: Path
    fmt: str
    token: str | None = field(default=None, repr=False)
    strategy: str = "prefix-merge"
    advantages: str = "grpo"
    std_estimator: str = "sample"
    groups_per_file: int = 1
    wait_s: float = WAIT_S


@dataclass(slots=True)
class ExportFollowResult:
    files: list[str] = field(default_factory=list)
    stats: ExportStats = field(default_factory=ExportStats)
    excluded_failed: int = 0
    cursor: str | None = None

    def summary(self) -> dict[str, Any]:
        figures = self.stats.summary()
        figures.pop("files", None)
        return {
            "files": self.files,
            **figures,
            "excluded_failed": self.excluded_failed,
            "cursor": self.cursor,
        }


def _state(cfg: ExportFollowConfig) -> tuple[str | None, int]:
    """(cursor, next file number) saved in `out` by a follow of the same gateway and format; (None, 0) for
    a folder without one. UsageError for a folder another follow writes."""
    path = cfg.out / STATE
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None, 0
    except (OSError, ValueError) as e:
        raise UsageError(
            f"Cannot read {path}: {e}.", hint="Remove it to start from the first episode."
        ) from None
    mine = {"url": without_userinfo(cfg.url), "format": cfg.fmt, "strategy": cfg.strategy}
    theirs = {k: saved.get(k) for k in mine}
    if theirs != mine:
        raise UsageError(
            f"--out {cfg.out} holds the files of another follow ({theirs}), not of {mine}.",
            hint="Pass an empty folder, or the same --follow URL, --format and --strategy to resume.",
        )
    return saved.get("cursor"), int(saved.get("next_file", 0))


def _save_state(cfg: ExportFollowConfig, cursor: str | None, next_file: int) -> None:
    state = {
        "url": without_userinfo(cfg.url),
        "format": cfg.fmt,
        "strategy": cfg.strategy,
        "cursor": cursor,
        "next_file": next_file,
    }
    tmp = cfg.out / f"{STATE}.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, cfg.out / STATE)


def write_answer(
    cfg: ExportFollowConfig, rows: list[dict[str, Any]], first: int
) -> tuple[list[str], ExportStats]:
    """The stream rows of one answer as files of `cfg.fmt` in `cfg.out`, numbered from `first`."""
    trajectories = [row_trajectory(r) for r in rows]
    if cfg.fmt == "slime":
        from polarproxy.export.trainers import TrainerOptions, get_trainer_writer

        options = TrainerOptions(groups_per_file=cfg.groups_per_file, first_step=first)
        stats = get_trainer_writer("slime")(trajectories, cfg.out / "{rollout_id}.pt", options)
        return stats.files, stats
    path = cfg.out / f"{first:06d}.{EXTENSIONS[cfg.fmt]}"
    if cfg.fmt in TRAINER_FORMATS:
        from polarproxy.export.trainers import TrainerOptions, get_trainer_writer

        stats = get_trainer_writer(cfg.fmt)(trajectories, path, TrainerOptions())
    else:
        from polarproxy.export.writers import get_writer

        stats = get_writer(cfg.fmt)(trajectories, path)
    return [str(path)], stats


def follow_export(
    cfg: ExportFollowConfig,
    stop: threading.Event,
    on_files: Callable[[list[str], ExportStats], None] | None = None,
) -> ExportFollowResult:
    """Write the stream's answers as files until `stop` is set; the result says what was written. Raises
    StreamError for a gateway that cannot be read, UsageError for a folder another follow writes, and a
    writer's errors (TrainerRowError) for rows the format cannot carry."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    cursor, number = _state(cfg)
    result = ExportFollowResult(cursor=cursor)
    puller = TrajectoryPuller(
        cfg.url,
        cfg.token,
        strategy=cfg.strategy,
        advantages=cfg.advantages,
        std_estimator=cfg.std_estimator,
        cursor=cursor,
    )
    try:
        wait = 0.0  # the first poll answers at once: a dead gateway fails fast
        while not stop.is_set():
            rows = puller.pull(wait)
            wait = cfg.wait_s
            result.excluded_failed = puller.excluded_failed
            if rows:
                files, stats = write_answer(cfg, rows, number)
                number += len(files)
                result.files += files
                result.stats.merge(stats)
                if on_files is not None:
                    on_files(files, stats)
            if rows or puller.cursor != result.cursor:
                _save_state(cfg, puller.cursor, number)
                result.cursor = puller.cursor
    finally:
        puller.close()
    return result
