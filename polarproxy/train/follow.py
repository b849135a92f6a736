"""`polarproxy train --follow URL`: GRPO steps on whole groups as a running gateway accepts them.

    result = follow(model_dir, out_dir, TrainConfig(...), FollowConfig(url, token, max_staleness=1))

Instead of export files, the rows come from `serve`'s trajectory stream (`GET /polarproxy/v1/trajectories
?groups=complete&advantages=grpo`, through `polarproxy.client`), each group once, with the advantages the
server computes over the whole group. Rows land in a buffer; a step runs as soon as the buffer holds
enough rows (`rows_per_step` rows, whole groups; 0: whatever has landed, at least one row), with the
same `Trainer` as `train` (loop.py). After each step the checkpoint is pushed to the backend (`sync`),
so the rollouts that go on sample the new weights.

Staleness. The trainer's version V is its global step (the weight version of the weights it holds: 0
for a model it did not write, N after step N). A row's version v is the oldest integer weight version
of its calls (`Sample.weight_version`); its staleness is V - v, taken when the step that would train
it is formed. A row with staleness > `max_staleness` is dropped and counted (`rows_dropped_stale`); a
row none of whose calls has an integer version (a backend without versions, or labels like "default")
has no staleness: it is trained, and counted (`rows_unversioned`). The advantages of a group's other
rows stay as the server computed them.

Stopping: `stop` (a threading.Event; `stop_on_signals` sets it on SIGINT/SIGTERM) ends the loop after
the step in flight, or within `wait_s` (one long poll) when idle; the last step is then checkpointed.
The checkpoint's polarproxy.json keeps the stream's cursor, so `--resume` against the same gateway goes
on after it: a row is trained at most once across restarts (rows that had landed but were not trained
when a checkpoint was written, `rows_pending`, are not fetched again).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarproxy.choices import STRATEGIES
from polarproxy.export.pull import StreamError, TrajectoryPuller
from polarproxy.redact import without_userinfo
from polarproxy.train.config import TrainConfig
from polarproxy.train.data import Sample, sample_from_row

log = logging.getLogger("polarproxy.train.follow")

FOLLOW_STRATEGIES = STRATEGIES
FOLLOW_ADVANTAGES = ("grpo", "rloo")  # "none" gives rows without advantages, which the trainer refuses
WAIT_S = 2.0  # one long poll: also how long an idle follower takes to notice a stop


class FollowError(StreamError):
    """The gateway cannot be followed (unreachable, refused, gone) or the backend did not take a
    checkpoint; the message says what and where."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.result: FollowResult | None = None  # what the run did before it failed (follow() sets it)


@dataclass(slots=True)
class FollowConfig:
    """Where the rows come from and how old they may be. `token` is the gateway's control token;
    `sync_url` the backend to push each checkpoint to (None: no sync)."""

    url: str
    token: str | None = field(default=None, repr=False)
    max_staleness: int = 1
    strategy: str = "per-request"
    advantages: str = "grpo"
    std_estimator: str = "sample"  # GRPO's std at the gateway: sample (n - 1) or population (n)
    wait_s: float = WAIT_S
    sync_url: str | None = None
    sync_kind: str = "sglang"
    sync_pause: str | None = None
    sync_timeout: float = 600.0
    sync_api_key: str | None = field(default=None, repr=False)

    def check(self, cfg: TrainConfig) -> None:
        """Raise ValueError naming the bad value and the allowed ones."""
        if self.strategy not in FOLLOW_STRATEGIES:
            raise ValueError(
                f"Unknown --strategy {self.strategy!r}. Must be one of {', '.join(map(repr, FOLLOW_STRATEGIES))}."
            )
        if self.advantages not in FOLLOW_ADVANTAGES:
            raise ValueError(
                f"Unknown --advantages {self.advantages!r}. Must be one of "
                f"{', '.join(map(repr, FOLLOW_ADVANTAGES))} (the trainer needs advantages)."
            )
        if self.max_staleness < 0:
            raise ValueError(f"--max-staleness must be >= 0, got {self.max_staleness}.")
        if cfg.schedule != "constant" and cfg.schedule_steps is None and cfg.steps is None:
            raise ValueError(
                f"--schedule {cfg.schedule} with --follow needs a horizon: pass --schedule-steps or --steps."
            )


@dataclass
class FollowResult:
    """What a follow run did. `steps` this run took, up to global `step` (= `weight_version`);
    `checkpoint`: the last one written (None if no step ran); `stopped`: "signal" or "steps"."""

    step: int
    weight_version: str
    checkpoint: Path | None = None
    steps: int = 0
    groups_received: int = 0
    rows_received: int = 0
    rows_trained: int = 0
    rows_dropped_stale: int = 0
    rows_unversioned: int = 0
    rows_untrainable: int = 0  # no trainable token (nothing sampled, or no logprobs)
    # rows that do not say which temperature their logprobs are at: trained at --assume-logprob-temperature (1)
    rows_assumed_temperature: int = 0
    rows_pending: int = 0  # landed, not trained when the run stopped
    excluded_failed: int = 0  # episodes the gateway left out of their groups as `infra` failures
    synced_version: str | None = None
    cursor: str | None = field(default=None, repr=False)
    stopped: str = ""
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The JSON summary `train --follow` prints (no cursor, no metrics list)."""
        return {
            "steps": self.steps,
            "step": self.step,
            "weight_version": self.weight_version,
            "checkpoint": None if self.checkpoint is None else str(self.checkpoint),
            "groups_received": self.groups_received,
            "rows_received": self.rows_received,
            "rows_trained": self.rows_trained,
            "rows_dropped_stale": self.rows_dropped_stale,
            "rows_unversioned": self.rows_unversioned,
            "rows_untrainable": self.rows_untrainable,
            "rows_assumed_temperature": self.rows_assumed_temperature,
            "rows_pending": self.rows_pending,
            "excluded_failed": self.excluded_failed,
            "synced_version": self.synced_version,
            "stopped": self.stopped,
        }


def row_staleness(sample: Sample, version: int) -> int | None:
    """`version` - the row's oldest integer call weight version; None when it has none."""
    return None if sample.weight_version is None else version - sample.weight_version


def saved_cursor(out_dir: str | os.PathLike[str], url: str) -> str | None:
    """The stream cursor kept with the last checkpoint in `out_dir`, if it followed the same `url`."""
    from polarproxy.train import checkpoint as ckpt

    latest = ckpt.latest_checkpoint(out_dir)
    if latest is None:
        return None
    try:
        meta = json.loads((latest[1] / ckpt.META).read_text())
    except (OSError, ValueError):
        return None
    kept = meta.get("follow") if isinstance(meta, dict) else None
    if isinstance(kept, dict) and kept.get("url") == _shown(url) and isinstance(kept.get("cursor"), str):
        return kept["cursor"]
    return None


def _shown(url: str) -> str:
    return without_userinfo(url)


class _Stream(TrajectoryPuller):
    """The gateway's trajectory stream as `train --follow` reads it: its errors are FollowErrors."""

    def __init__(self, fcfg: FollowConfig, cursor: str | None) -> None:
        super().__init__(
            fcfg.url,
            fcfg.token,
            strategy=fcfg.strategy,
            advantages=fcfg.advantages,
            std_estimator=fcfg.std_estimator,
            cursor=cursor,
        )

    def pull(self, wait: float) -> list[dict[str, Any]]:
        try:
            return super().pull(wait)
        except StreamError as e:
            raise FollowError(str(e), e.hint) from None


class _Follower:
    def __init__(
        self,
        cfg: TrainConfig,
        fcfg: FollowConfig,
        stream: _Stream,
        result: FollowResult,
        progress: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        self.cfg, self.fcfg, self.stream, self.result, self.progress = cfg, fcfg, stream, result, progress
        self.buffer: list[Sample] = []
        self.saved_step: int | None = None

    def add(self, rows: Sequence[dict[str, Any]]) -> None:
        r = self.result
        r.excluded_failed = self.stream.excluded_failed
        r.rows_received += len(rows)
        r.groups_received += len({row.get("group_id") or row.get("episode_id") for row in rows})
        for row in rows:
            s = sample_from_row(
                row,
                f"{_shown(self.fcfg.url)} row of episode {row.get('episode_id')}",
                assume_temperature=self.cfg.assume_logprob_temperature,
            )
            if not s.trainable_tokens:
                r.rows_untrainable += 1
                continue
            r.rows_assumed_temperature += s.temperature_assumed
            if s.weight_version is None:
                r.rows_unversioned += 1
            self.buffer.append(s)

    def drop_stale(self, version: int) -> None:
        kept = []
        for s in self.buffer:
            age = row_staleness(s, version)
            if age is not None and age > self.fcfg.max_staleness:
                self.result.rows_dropped_stale += 1
            else:
                kept.append(s)
        self.buffer = kept

    def take_step_rows(self) -> list[Sample] | None:
        """The rows of the next step (whole groups, in the order they landed), or None: not enough yet."""
        from polarproxy.train.batching import plan_steps

        n = self.cfg.rows_per_step
        if not self.buffer or len(self.buffer) < n:
            return None
        (chosen,) = plan_steps(self.buffer, n, 1, shuffle=False)
        picked = set(chosen)
        rows = [self.buffer[i] for i in chosen]
        self.buffer = [s for i, s in enumerate(self.buffer) if i not in picked]
        return rows

    def save(self, trainer: Any, *, optimizer_state: bool = True) -> Path:
        meta = {"follow": {"url": _shown(self.fcfg.url), "cursor": self.stream.cursor}}
        path: Path = trainer.save(meta, optimizer_state=optimizer_state)
        if optimizer_state:  # where --resume would continue
            self.saved_step = trainer.step
        self.result.checkpoint = path
        return path

    def sync(self, path: Path, version: str) -> None:
        from polarproxy.train.sync import SyncError, sync_weights

        f = self.fcfg
        assert f.sync_url is not None
        try:
            sync_weights(
                f.sync_url,
                path,
                version,
                kind=f.sync_kind,  # type: ignore[arg-type]
                timeout=f.sync_timeout,
                pause_mode=f.sync_pause,  # type: ignore[arg-type]
                api_key=f.sync_api_key,
            )
        except SyncError as e:
            raise FollowError(
                f"Trained step {version}, but the backend did not take the checkpoint: {e}",
                f"The checkpoint is in {path}; run again with --resume once the backend answers.",
            ) from None
        self.result.synced_version = version

    def run(self, trainer: Any, stop: threading.Event) -> None:
        cfg, r = self.cfg, self.result
        start = trainer.step
        horizon = cfg.schedule_steps or (start + cfg.steps if cfg.steps else start + 1)
        while not stop.is_set():
            if cfg.steps is not None and r.steps >= cfg.steps:
                r.stopped = "steps"
                break
            self.drop_stale(trainer.step)
            rows = self.take_step_rows()
            if rows is None:
                self.add(self.stream.pull(self.fcfg.wait_s))
                continue
            m = trainer.run_step(rows, range(len(rows)), max(horizon, trainer.step + 1))
            r.steps += 1
            r.rows_trained += len(rows)
            r.step, r.weight_version = trainer.step, str(trainer.step)
            sync = self.fcfg.sync_url is not None
            resumable = bool(cfg.save_every) and trainer.step % cfg.save_every == 0
            if sync or resumable:  # a sync needs the weights; the optimizer state only every --save-every
                path = self.save(trainer, optimizer_state=resumable)
                if sync:
                    self.sync(path, str(trainer.step))
            m |= {
                "rows_received": r.rows_received,
                "rows_dropped_stale": r.rows_dropped_stale,
                "rows_pending": len(self.buffer),
                "synced_version": r.synced_version,
            }
            trainer.metrics_log.write(m)
            r.metrics.append(m)
            if self.progress is not None:
                self.progress(m)
        else:
            r.stopped = "signal"

    def finish(self, trainer: Any | None) -> None:
        """Checkpoint, with the optimizer state, the steps taken since the last resumable save."""
        if trainer is not None and self.result.steps and self.saved_step != trainer.step:
            self.save(trainer)
        self.result.rows_pending = len(self.buffer)


def follow(
    model_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    cfg: TrainConfig,
    fcfg: FollowConfig,
    *,
    stop: threading.Event | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> FollowResult:
    """Train on the gateway's whole groups as they land until `stop` is set (or `cfg.steps` steps ran);
    checkpoint, and return what happened. The gateway is asked once before the model loads, so a dead
    one fails fast. `on_ready()` is called once the model is loaded and the follower polls. Raises
    FollowError (gateway, sync), TrainError (setup) or DataError (a row the trainer cannot use)."""
    from polarproxy.train import checkpoint as ckpt
    from polarproxy.train.loop import Trainer

    cfg.check()
    fcfg.check(cfg)
    stop = stop or threading.Event()
    cursor = saved_cursor(out_dir, fcfg.url) if cfg.resume else None
    stream = _Stream(fcfg, cursor)
    latest = ckpt.latest_checkpoint(out_dir) if cfg.resume else None
    start = latest[0] if latest else ckpt.read_version(model_dir)
    result = FollowResult(step=start, weight_version=str(start), cursor=cursor)
    follower = _Follower(cfg, fcfg, stream, result, progress)
    trainer = None
    try:
        follower.add(stream.pull(0.0))  # fails fast on a dead gateway, before the model loads
        trainer = Trainer(model_dir, out_dir, cfg)
        result.step, result.weight_version = trainer.step, str(trainer.step)
        if on_ready is not None:
            on_ready()
        follower.run(trainer, stop)
    except FollowError as e:
        e.result = result
        raise
    finally:
        stream.close()
        follower.finish(trainer)
        result.cursor = stream.cursor
    return result
