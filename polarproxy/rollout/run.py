"""Orchestration of `polarproxy rollout`: G samples of every task, through the four stages with a worker
pool each, so episodes overlap (one is evaluated while the next runs); `--min-samples K` accepts a group
once K samples are evaluated and stops the rest; `--resume` skips the (task, sample) pairs an earlier run
of the same rollout ID finished (read back from the episodes' metadata in the store); a summary at the end.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarproxy.errors import UsageError
from polarproxy.rollout.host_relay import HostRelay
from polarproxy.rollout.stages import (
    STAGE_FUNCS,
    STAGES,
    Job,
    Settings,
    StageError,
    end_episode,
    group_id,
    passed_env_names,
)
from polarproxy.rollout.tasks import Task

FINISHED = ("ok", "failed")  # episode statuses of a harness that ran to its end


def new_rollout_id() -> str:
    return "ro_" + time.strftime("%Y%m%d%H%M%S") + "_" + secrets.token_hex(3)


@dataclass
class Plan:
    tasks: list[Task]
    samples: int
    concurrency: int
    min_samples: int | None = None
    workers: dict[str, int] = field(default_factory=dict)  # stage -> pool size (default: from concurrency)
    resume: bool = False
    scratch: Path | None = None  # episode folders go here (default: a temporary folder)


def prior_episodes(settings: Settings, tasks: list[Task]) -> list[Any]:
    """The store's episodes of this rollout in these tasks' groups, of this run's harness (several harnesses
    may share a rollout ID and, with --group-across-harnesses, its groups)."""
    groups = sorted({group_id(settings, t) for t in tasks})
    return [
        e
        for e in settings.episodes.prior(settings.rollout_id, groups)
        if not settings.harness or e.metadata.get("harness", settings.harness) == settings.harness
    ]


def done_pairs(settings: Settings, tasks: list[Task]) -> dict[tuple[str, int], Any]:
    """(task id, sample) -> the earlier episode that finished it: ran to its end and got a reward."""
    done: dict[tuple[str, int], Any] = {}
    for e in prior_episodes(settings, tasks):
        md = e.metadata
        if e.status in FINISHED and e.reward is not None and "task_id" in md and "sample" in md:
            done[(str(md["task_id"]), int(md["sample"]))] = e
    return done


def plan_jobs(plan: Plan, settings: Settings, scratch: Path) -> list[Job]:
    """A job per (task, sample); with --resume the pairs an earlier run finished are `skipped` (and with
    --min-samples, the rest of a group accepted then are `aborted`). Refuses a rollout ID already in the
    store without --resume."""
    finished = done_pairs(settings, plan.tasks) if plan.resume else {}
    if not plan.resume and prior_episodes(settings, plan.tasks):
        raise UsageError(
            f"Rollout {settings.rollout_id} already has episodes in the store.",
            hint="Pass --resume to run only its unfinished (task, sample) pairs, or another --rollout-id.",
        )
    jobs: list[Job] = []
    for task in plan.tasks:
        for i in range(plan.samples):
            job = Job(task=task, sample=i, dir=scratch / task.id / str(i))
            prior = finished.get(job.key)
            if prior is not None:
                job.state, job.reward = "skipped", prior.reward
                job.episode = None
                job.reason = f"finished in an earlier run (episode {prior.episode_id})"
            jobs.append(job)
    if plan.min_samples is not None:  # a group accepted in an earlier run stays accepted
        groups_of: dict[str, list[Job]] = {}
        for j in jobs:
            groups_of.setdefault(j.task.id, []).append(j)
        for group in groups_of.values():
            if sum(j.state == "skipped" for j in group) >= plan.min_samples:
                for j in group:
                    if j.state == "pending":
                        j.state, j.reason = "aborted", "the group was accepted in an earlier run"
    return jobs


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class Rollout:
    def __init__(
        self,
        plan: Plan,
        settings: Settings,
        on_progress: Callable[[str, Job], None] | None = None,
        on_end: Callable[[Job], None] | None = None,
    ):
        self.plan, self.s = plan, settings
        self.on_progress = on_progress or (lambda stage, job: None)
        self.on_end = on_end or (lambda job: None)  # a job reached its end state (after its episode's end)
        self.lock = threading.Lock()
        self.all_done = threading.Event()
        self.pending = 0
        n = max(1, plan.concurrency)
        sizes = {"prewarm": max(1, n // 2), "execute": n, "evaluate": max(1, n // 2), "reconstruct": 1}
        sizes.update(plan.workers)
        self.sizes = sizes
        self.pools = {st: ThreadPoolExecutor(sizes[st], thread_name_prefix=f"rollout-{st}") for st in STAGES}
        self.jobs: list[Job] = []

    def run(self) -> list[Job]:
        plan = self.plan
        scratch = plan.scratch or Path(tempfile.mkdtemp(prefix=f"polarproxy-{self.s.rollout_id}-"))
        self.jobs = plan_jobs(plan, self.s, scratch)
        todo = [j for j in self.jobs if j.state == "pending"]
        self.pending = len(todo)
        if not todo:
            self.all_done.set()
        for job in todo:
            self._submit("prewarm", job)
        previous = None
        if threading.current_thread() is threading.main_thread():  # SIGTERM stops it as Ctrl-C does
            previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            while not self.all_done.wait(0.2):
                pass
        except KeyboardInterrupt:
            for j in self.jobs:
                j.cancel.set()
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            for pool in self.pools.values():
                pool.shutdown(wait=True, cancel_futures=False)
            if not self.s.keep and plan.scratch is None:
                shutil.rmtree(scratch, ignore_errors=True)
        return self.jobs

    def start(self, job: Job) -> None:
        """Run one more job through the stages, outside `run()` (a Ray node's runner gets its jobs one at a
        time, ray_runner.py); `on_end` tells when it is over. `close()` when no more will come."""
        with self.lock:
            self.jobs.append(job)
            self.pending += 1
        self._submit("prewarm", job)

    def close(self) -> None:
        for pool in self.pools.values():
            pool.shutdown(wait=True, cancel_futures=False)

    def _submit(self, stage: str, job: Job) -> None:
        job.queued[stage] = time.monotonic()
        self.pools[stage].submit(self._run_stage, stage, job)

    def _run_stage(self, stage: str, job: Job) -> None:
        job.started[stage] = time.monotonic()
        try:
            if not job.cancel.is_set():
                STAGE_FUNCS[stage](job, self.s)
        except StageError as e:
            self._end(job, "failed", f"{stage}: {e}")
            return
        except Exception as e:  # a bug or an unexpected failure: the episode fails, the rollout goes on
            self._end(job, "failed", f"{stage}: {type(e).__name__}: {e}")
            return
        finally:
            job.ended[stage] = time.monotonic()
            self.on_progress(stage, job)
        if job.cancel.is_set():
            self._end(job, "aborted", job.reason or "stopped")
            return
        if stage == "evaluate":
            self._accept(job)
        nxt = STAGES.index(stage) + 1
        if nxt < len(STAGES):
            self._submit(STAGES[nxt], job)
        else:
            self._end(job, "done", None)

    def _accept(self, job: Job) -> None:
        """--min-samples: the Kth evaluated sample of a group stops the group's others."""
        k = self.plan.min_samples
        if k is None:
            return
        with self.lock:
            group = [j for j in self.jobs if j.task.id == job.task.id]
            evaluated = [j for j in group if j.state == "skipped" or (j.evaluated and j.state != "failed")]
            if len(evaluated) < k:
                return
            for other in group:
                if other is not job and other.state == "pending" and not other.evaluated:
                    other.reason = f"aborted: the group was accepted with {k} of {self.plan.samples} samples"
                    other.cancel.set()

    def _end(self, job: Job, state: str, reason: str | None) -> None:
        with self.lock:
            if job.state != "pending":
                return
            job.state, job.reason = state, reason if state != "done" else job.reason
            self.pending -= 1
            left = self.pending
        self._finish_episode(job)
        self.on_end(job)
        if left == 0:
            self.all_done.set()

    def _finish_episode(self, job: Job) -> None:
        """An episode that failed or was stopped before its end was stored: finished without a reward, the
        reason kept with the (empty) reward where the store takes it (the in-process gateway)."""
        from polarproxy.rewards.verifier import VerifierResult

        try:
            end_episode(job, self.s, VerifierResult(reward=None, note=job.reason))
        except Exception as e:  # the reason is in the summary either way
            job.reason = f"{job.reason}; its end was not stored: {e}"


def start_relay(settings: Settings, root: Path) -> HostRelay | None:
    """The folder that holds each episode's own bridge socket when the sandbox has no network of its own
    (stages.py `episode_bridge`: one relay per episode, bound into that sandbox alone). Returns None: there
    is no shared relay to close."""
    if not settings.runner.bridged:
        return None
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # an episode's user may reach its own socket by name, not list the folder
    settings.socket_dir = root
    return None


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "total_s": round(sum(values), 4),
        "mean_s": round(sum(values) / len(values), 4),
        "max_s": round(max(values), 4),
    }


def summary(jobs: list[Job], settings: Settings, *, wall_s: float) -> dict[str, Any]:
    """The `--json` summary: episodes, rewards per task, stage times and queue times."""
    episodes = []
    per_task: dict[str, dict[str, Any]] = {}
    stage_times: dict[str, list[float]] = {st: [] for st in STAGES}
    queue_times: dict[str, list[float]] = {st: [] for st in STAGES}
    for j in jobs:
        stage_s = {st: round(j.ended[st] - j.started[st], 4) for st in STAGES if st in j.ended}
        queue_s = {st: round(j.started[st] - j.queued[st], 4) for st in STAGES if st in j.started}
        for st, v in stage_s.items():
            stage_times[st].append(v)
        for st, v in queue_s.items():
            queue_times[st].append(v)
        episodes.append(
            {
                "task": j.task.id,
                "sample": j.sample,
                "group": group_id(settings, j.task),
                "episode_id": j.episode.episode_id if j.episode else None,
                "state": j.state,
                "reason": j.reason,
                "exit_code": j.exit_code,
                "harness_timed_out": j.harness_timed_out,
                "limit_hit": j.limit_hit,
                "bridge_refused": j.bridge_refused,
                "reward": j.reward,
                "reward_note": j.reward_note,
                "trajectories": j.trajectories,
                "stage_s": stage_s,
                "queue_s": queue_s,
            }
        )
        t = per_task.setdefault(j.task.id, {"rewards": [], "states": {}})
        t["states"][j.state] = t["states"].get(j.state, 0) + 1
        if j.state in ("done", "skipped") and j.reward is not None:
            t["rewards"].append(j.reward)
    for t in per_task.values():
        t["mean_reward"] = sum(t["rewards"]) / len(t["rewards"]) if t["rewards"] else None
    states: dict[str, int] = {}
    for j in jobs:
        states[j.state] = states.get(j.state, 0) + 1
    return {
        "rollout_id": settings.rollout_id,
        "db": settings.episodes.db,
        "serve": None if settings.episodes.db is not None else settings.episodes.url,
        "isolation": settings.runner.name,
        "env_passed": passed_env_names(settings),  # the host variables the agents saw (values never shown)
        "wall_s": round(wall_s, 3),
        "states": states,
        "tasks": per_task,
        "stage_times": {st: _stats(v) for st, v in stage_times.items()},
        "queue_times": {st: _stats(v) for st, v in queue_times.items()},
        "episodes": episodes,
    }
