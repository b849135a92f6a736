"""Per-step metrics: one JSON line per optimizer step in OUT/metrics.jsonl, and a rich progress display.

Keys (METRIC_KEYS, always present; null where a figure does not apply): step, loss, clip_frac (share of
trainable tokens where a clip bound was active), ratio_mean / ratio_max (π_θ / π_behaviour over trainable
tokens, before the update), kl (mean k3 to the reference; null without one), entropy (mean per-token
entropy), grad_norm (before clipping), tokens_per_s (tokens the model ran over, per second of the step),
reward_mean (of the step's rows), staleness (mean of: the version being trained - the row's weight
version; null when no row has an integer version), weight_version (the version this step produced).
Extra keys: lr, rows, tokens, trainable_tokens, micro_batches, seconds, staleness_max, tis_capped_frac,
advantage_mean.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

METRIC_KEYS = (
    "step",
    "loss",
    "clip_frac",
    "ratio_mean",
    "ratio_max",
    "kl",
    "entropy",
    "grad_norm",
    "tokens_per_s",
    "reward_mean",
    "staleness",
    "weight_version",
)
METRICS_FILE = "metrics.jsonl"


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsLog:
    """Appends one line per step to OUT/metrics.jsonl (appending, so `--resume` keeps the earlier lines)."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.path = Path(out_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, metrics: dict[str, Any]) -> None:
        missing = [k for k in METRIC_KEYS if k not in metrics]
        if missing:
            raise ValueError(f"step metrics lack {missing}")
        line = json.dumps({k: _clean(v) for k, v in metrics.items()}, allow_nan=False)
        with self.path.open("a") as f:
            f.write(line + "\n")


def read_metrics(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


class RichProgress:
    """A rich progress bar with the last step's loss, reward, clip fraction, grad norm and throughput; use
    as a context manager and pass `.update` as the trainer's progress callback."""

    def __init__(self, total: int, *, start: int = 0) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            transient=False,
        )
        self.task = self.progress.add_task("train", total=total, completed=0, info="")
        self.start = start

    def __enter__(self) -> RichProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, m: dict[str, Any]) -> None:
        info = (
            f"step {m['step']} loss {_fmt(m['loss'], '.4f')} reward {_fmt(m['reward_mean'], '.3f')} "
            f"clip {_fmt(m['clip_frac'], '.3f')} |g| {_fmt(m['grad_norm'], '.3f')} "
            f"{_fmt(m['tokens_per_s'], ',.0f')} tok/s"
        )
        self.progress.update(self.task, advance=1, info=info)
