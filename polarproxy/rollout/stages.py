"""The four stages of one rollout episode, each run by its own worker pool (run.py):

- prewarm: a fresh copy of the task's workspace, a fresh HOME, the task's `setup` commands in the copy;
- execute: the episode created at the gateway, the harness run in the sandbox against it;
- evaluate: a fresh copy of the workspace as the harness left it, the hidden tests as `tests/`, `verify`;
- reconstruct: the episode's calls rebuilt into trajectories (prefix-merge), counted.

Each stage raises StageError to fail the episode, and returns early when the episode has been stopped.
"""

from __future__ import annotations

import os
import shlex
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarproxy.client import EpisodeHandle
from polarproxy.harness.env import harness_env
from polarproxy.rewards.verifier import Verifier, VerifierResult, run_verifier
from polarproxy.rollout.episodes import Episodes, LocalGateway
from polarproxy.rollout.sandbox import ProcessResult, Runner, SandboxSpec, run_process
from polarproxy.rollout.tasks import Task

STAGES = ("prewarm", "execute", "evaluate", "reconstruct")
EXIT_TIMEOUT = 124  # the episode's exit code when the harness ran past its limit (as timeout(1) says)
EXIT_STOPPED = 130  # ... when it was stopped (the group was accepted without it, or Ctrl-C)
# not passed to the harness: they would route it around the gateway, or name the host's store
_DROP_ENV = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "POLARPROXY_DB",
)


class StageError(Exception):
    """A stage could not do its work; the message is the episode's failure reason."""


@dataclass
class Job:
    """One (task, sample) pair on its way through the stages."""

    task: Task
    sample: int
    dir: Path
    state: str = "pending"  # pending | done | failed | aborted | skipped (finished in an earlier run)
    reason: str | None = None
    episode: EpisodeHandle | None = None
    exit_code: int | None = None
    harness_timed_out: bool = False
    reward: float | None = None
    reward_note: str | None = None
    trajectories: int | None = None
    evaluated: bool = False  # the verifier ran and its reward was stored
    episode_ended: bool = False
    queued: dict[str, float] = field(default_factory=dict)  # stage -> when it was queued
    started: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def key(self) -> tuple[str, int]:
        return (self.task.id, self.sample)

    @property
    def workspace(self) -> Path:
        return self.dir / "workspace"

    @property
    def home(self) -> Path:
        return self.dir / "home"


@dataclass
class Settings:
    """What every episode of a rollout shares."""

    rollout_id: str
    episodes: Episodes
    runner: Runner
    command: list[str] | None  # `-- CMD`
    preset: Any = None  # capture.presets.Preset (`--harness NAME`)
    api: str | None = None
    model_name: str = "tiny"
    harness: str | None = None
    socket_dir: Path = Path("/nonexistent")
    hidden: list[Path] = field(default_factory=list)
    image: str | None = None
    reward_from: str = "exit"
    setup_timeout_s: float = 600.0
    execute_timeout_s: float = 1800.0  # a task's timeout_s overrides it
    verify_timeout_s: float = 600.0
    keep: bool = False  # keep each episode's folder (workspace, home, logs)
    metadata: dict[str, str] = field(default_factory=dict)  # stored with every episode (a Ray node's ID)


def group_id(s: Settings, task: Task) -> str:
    """The GRPO group of a task's samples in this rollout."""
    return f"{s.rollout_id}:{task.id}"


def _fail_process(what: str, result: ProcessResult, limit: float) -> StageError:
    if result.timed_out:
        return StageError(f"{what} ran past {limit:g} s; its process group was killed")
    return StageError(f"{what} exited {result.exit_code}: {result.output_tail[-500:].strip()}")


def prewarm(job: Job, s: Settings) -> None:
    if job.dir.exists():
        shutil.rmtree(job.dir)
    job.dir.mkdir(parents=True)
    shutil.copytree(job.task.workspace, job.workspace, symlinks=True)
    (job.home / "tmp").mkdir(parents=True)
    env = _base_env(job)
    for i, command in enumerate(job.task.setup):
        result = run_process(
            ["/bin/sh", "-c", command],
            cwd=job.workspace,
            env=env,
            timeout_s=s.setup_timeout_s,
            cancel=job.cancel,
            log=job.dir / f"setup-{i}.log",
        )
        if result.stopped:
            return
        if result.exit_code != 0:
            raise _fail_process(f"setup command {i} ({command!r})", result, s.setup_timeout_s)


def _base_env(job: Job) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env.update({"HOME": str(job.home), "TMPDIR": str(job.home / "tmp")})
    return env


def harness_command(s: Settings, instruction: str) -> list[str]:
    """`-- CMD` as given, or the preset's headless `command` with {instruction} as one argument."""
    if s.command is not None:
        return list(s.command)
    template = getattr(s.preset, "command", None)
    if not template:
        raise StageError(f"preset '{s.harness}' has no headless `command`; pass `-- CMD` instead")
    parts = shlex.split(template.replace("{model}", shlex.quote(s.model_name)))
    return [instruction if part == "{instruction}" else part for part in parts]


def episode_env(job: Job, s: Settings, handle: EpisodeHandle) -> dict[str, str]:
    """The harness's environment: every provider SDK pointed at this episode, keyed with its api_key."""
    env = harness_env(_base_env(job), handle.base_urls, handle.api_key, handle.episode_id)
    env["POLARPROXY_INSTRUCTION"] = job.task.instruction
    if s.preset is not None:
        rendered = s.preset.render(
            proxy_url=handle.proxy_url, key=handle.api_key, model=s.model_name, home=job.home, api=s.api
        )
        rendered.write_files()
        env = rendered.apply_env(env)
    return env


def execute(job: Job, s: Settings) -> None:
    command = harness_command(s, job.task.instruction)
    metadata = {"rollout_id": s.rollout_id, "task_id": job.task.id, "sample": str(job.sample)}
    handle = s.episodes.create(
        task=job.task.id,
        group=group_id(s, job.task),
        harness=s.harness,
        metadata={**job.task.metadata, **s.metadata, **metadata},
    )
    job.episode = handle
    env = episode_env(job, s, handle)
    spec = SandboxSpec(
        workspace=job.workspace,
        home=job.home,
        socket_dir=s.socket_dir,
        gateway_port=s.episodes.port,
        hidden=s.hidden,
        image=s.image,
    )
    limit = job.task.timeout_s or s.execute_timeout_s
    try:
        result = run_process(
            s.runner.argv(command, spec, env),
            cwd=s.runner.cwd(spec),
            env=s.runner.env(env, spec),
            stdin=job.task.instruction.rstrip("\n").encode() + b"\n",
            timeout_s=limit,
            cancel=job.cancel,
            log=job.dir / "harness.log",
        )
    except OSError as e:
        job.exit_code = 127
        raise StageError(f"cannot start the harness {command[0]!r}: {e.strerror or e}") from e
    job.harness_timed_out = result.timed_out
    job.exit_code = EXIT_TIMEOUT if result.timed_out else EXIT_STOPPED if result.stopped else result.exit_code


def evaluate(job: Job, s: Settings) -> None:
    assert job.episode is not None
    fresh = job.dir / "evaluate"
    if fresh.exists():
        shutil.rmtree(fresh)
    shutil.copytree(job.workspace, fresh, symlinks=True)
    if job.task.tests is not None:
        if (fresh / "tests").is_symlink() or (fresh / "tests").is_file():
            (fresh / "tests").unlink()
        elif (fresh / "tests").exists():
            shutil.rmtree(fresh / "tests")
        shutil.copytree(job.task.tests, fresh / "tests", symlinks=True)
    verifier = Verifier(job.task.verify, s.reward_from, s.verify_timeout_s)  # type: ignore[arg-type]
    env = _base_env(job)
    env["POLARPROXY_TASK"] = job.task.id
    try:
        result: VerifierResult = run_verifier(
            verifier,
            cwd=fresh,
            env=env,
            episode_id=job.episode.episode_id,
            harness_exit_code=job.exit_code if job.exit_code is not None else 124,
        )
    except OSError as e:
        raise StageError(f"cannot run the verify command: {e.strerror or e}") from e
    job.reward, job.reward_note = result.reward, result.note
    job.evaluated = True
    end_episode(job, s, result)


def end_episode(job: Job, s: Settings, result: VerifierResult | None) -> None:
    """Finish the job's episode once, with the verifier's result (None: not evaluated)."""
    if job.episode is None or job.episode_ended:
        return
    job.episode_ended = True
    code = job.exit_code if job.exit_code is not None else EXIT_STOPPED
    s.episodes.end(job.episode.episode_id, exit_code=code, result=result)


def reconstruct(job: Job, s: Settings) -> None:
    """Count the episode's trajectories (prefix-merge); the in-process gateway's store only."""
    assert job.episode is not None
    if not isinstance(s.episodes, LocalGateway):
        return  # a remote gateway's trainer reads its trajectory stream
    from polarproxy.reconstruct import reconstruct as rebuild
    from polarproxy.store.token_calls import iter_token_calls

    store = s.episodes.stack.store
    episode_id = job.episode.episode_id
    for _ in range(100):  # the writer thread may still be committing the last call
        if not store.call_statuses(episode_id).get("in_flight"):
            break
        time.sleep(0.05)
    # the export's array path: token pieces as stored, no prompt rebuilt as Python ints
    job.trajectories = sum(1 for _ in rebuild("prefix-merge", iter_token_calls(store, [episode_id])))


STAGE_FUNCS = {"prewarm": prewarm, "execute": execute, "evaluate": evaluate, "reconstruct": reconstruct}
