"""The four stages of one rollout episode, each run by its own worker pool (run.py):

- prewarm: a fresh copy of the task's workspace, a fresh HOME, the task's `setup` commands in the copy, in
  the sandbox (no gateway);
- execute: the episode created at the gateway, the harness run in the sandbox against it;
- evaluate: a fresh copy of the workspace as the harness left it (copying.py: regular files and links
  inside it only, size-capped), the hidden tests as `tests/`, `verify` in a fresh sandbox of its own;
- reconstruct: the episode's calls rebuilt into trajectories (prefix-merge), counted.

What reaches the harness, setup and verify commands of the host's environment is an allow-list
(`PASSED_ENV`, plus `--pass-env NAME`); each episode's sandbox runs as a host user of its own when rollout
runs as root (sandbox.py: `episode_uid`).

Each stage raises StageError to fail the episode, and returns early when the episode has been stopped.
"""

from __future__ import annotations

import hashlib
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
from polarproxy.rewards.redact import redact_output
from polarproxy.rewards.verifier import Verifier, VerifierResult, run_verifier
from polarproxy.rollout.agent_changes import apply_agent_changes
from polarproxy.rollout.agent_patch import agent_patch
from polarproxy.rollout.copying import WorkspaceTooLarge, clone_file, copy_workspace
from polarproxy.rollout.episodes import Episodes, LocalGateway
from polarproxy.rollout.host_relay import HostRelay
from polarproxy.rollout.limits import Limits
from polarproxy.rollout.sandbox import (
    SOCKET_NAME,
    ProcessResult,
    Runner,
    SandboxSpec,
    episode_uid,
    give_to,
    run_process,
)
from polarproxy.rollout.tasks import Task

STAGES = ("prewarm", "execute", "evaluate", "reconstruct")
EXIT_TIMEOUT = 124  # the episode's exit code when the harness ran past its limit (as timeout(1) says)
EXIT_STOPPED = 130  # ... when it was stopped (the group was accepted without it, or Ctrl-C)
# the host variables the harness, setup and verify commands get (with LC_*); anything else only by
# `--pass-env NAME`: a host's tokens and keys never reach an agent by accident
PASSED_ENV = ("PATH", "LANG", "LANGUAGE", "TERM", "TZ", "NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")


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
    uid: int | None = None  # the host user its sandbox runs as (sandbox.episode_uid)
    limit_hit: str | None = None  # the per-episode limit its harness ran into (limits.py)
    bridge_refused: dict[str, int] = field(default_factory=dict)  # requests its bridge refused, by code
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
    pass_env: list[str] = field(default_factory=list)  # `--pass-env NAME`: host variables passed on purpose
    harness_args: list[str] = field(default_factory=list)  # `--harness-arg ARG`, added to the preset's
    group_by_harness: bool = False  # several harnesses in one rollout: a group per task and harness
    ro_binds: list[Path] = field(default_factory=list)  # `--ro-bind PATH`: more of the host, read-only
    max_workspace_bytes: int | None = None  # the evaluate copy's cap (apparent sizes)
    limits: Limits = field(default_factory=Limits)  # processes, memory, file size, CPU time per episode
    metadata: dict[str, str] = field(default_factory=dict)  # stored with every episode (a Ray node's ID)


def group_id(s: Settings, task: Task) -> str:
    """The GRPO group of a task's samples in this rollout (and harness, when several run: `--harness`
    repeated, without `--group-across-harnesses`)."""
    if s.group_by_harness and s.harness:
        return f"{s.rollout_id}:{task.id}:{s.harness}"
    return f"{s.rollout_id}:{task.id}"


def _fail_process(what: str, result: ProcessResult, limit: float) -> StageError:
    if result.timed_out:
        return StageError(f"{what} ran past {limit:g} s; its process group was killed")
    return StageError(f"{what} exited {result.exit_code}: {result.output_tail[-500:].strip()}")


def prewarm(job: Job, s: Settings) -> None:
    if job.dir.exists():
        shutil.rmtree(job.dir)
    job.dir.mkdir(parents=True)
    shutil.copytree(job.task.workspace, job.workspace, symlinks=True, copy_function=clone_file)
    (job.home / "tmp").mkdir(parents=True)
    job.uid = episode_uid()
    give_to(job.workspace, job.uid)
    give_to(job.home, job.uid)
    env = base_env(job.home, s)
    spec = _spec(job.workspace, job.home, s, job.uid)
    for i, command in enumerate(job.task.setup):
        result = run_process(
            s.runner.argv(["/bin/sh", "-c", command], spec, env),
            cwd=s.runner.cwd(spec),
            env=s.runner.env(env, spec),
            timeout_s=s.setup_timeout_s,
            cancel=job.cancel,
            log=job.dir / f"setup-{i}.log",
            limits=s.limits,
        )
        if result.stopped:
            return
        if result.exit_code != 0:
            raise _fail_process(f"setup command {i} ({command!r})", result, s.setup_timeout_s)


def _spec(workspace: Path, home: Path, s: Settings, uid: int | None, *, gateway: bool = False) -> SandboxSpec:
    """A sandbox over `workspace` and `home`; with `gateway`, the bridge to the episode's gateway."""
    return SandboxSpec(
        workspace=workspace,
        home=home,
        socket_dir=s.socket_dir if gateway else None,
        gateway_port=s.episodes.port if gateway else 0,
        hidden=s.hidden,
        image=s.image,
        uid=uid,
        ro_binds=s.ro_binds,
        limits=s.limits,
    )


def passed_env_names(s: Settings) -> list[str]:
    """The names of the host variables that reach the agents (the allow-list, as this host has them)."""
    passed = set(PASSED_ENV) | set(s.pass_env)
    return sorted(k for k in os.environ if k in passed or k.startswith("LC_"))


def base_env(home: Path, s: Settings) -> dict[str, str]:
    """The host variables allowed through (`PASSED_ENV`, LC_*, `--pass-env`), with a fresh HOME and TMPDIR."""
    passed = set(PASSED_ENV) | set(s.pass_env)
    env = {k: v for k, v in os.environ.items() if k in passed or k.startswith("LC_")}
    env.update({"HOME": str(home), "TMPDIR": str(home / "tmp")})
    return env


def harness_command(s: Settings, instruction: str) -> list[str]:
    """`-- CMD` as given, or the preset's headless `command` with {instruction} as one argument and the
    `--harness-arg`s before it (at the end when the command takes the instruction on stdin)."""
    if s.command is not None:
        return list(s.command)
    template = getattr(s.preset, "command", None)
    if not template:
        raise StageError(f"preset '{s.harness}' has no headless `command`; pass `-- CMD` instead")
    parts = shlex.split(template.replace("{model}", shlex.quote(s.model_name)))
    at = parts.index("{instruction}") if "{instruction}" in parts else len(parts)
    parts[at:at] = s.harness_args
    return [instruction if part == "{instruction}" else part for part in parts]


def harness_stdin(s: Settings, instruction: str) -> bytes:
    """What the harness reads on stdin: the instruction, unless its command already has it as an argument
    (a preset's {instruction}: a harness that also reads stdin would get it twice)."""
    if s.command is None and "{instruction}" in (getattr(s.preset, "command", None) or ""):
        return b""
    return instruction.rstrip("\n").encode() + b"\n"


def episode_env(job: Job, s: Settings, handle: EpisodeHandle) -> dict[str, str]:
    """The harness's environment: every provider SDK pointed at this episode, keyed with its api_key."""
    env = harness_env(base_env(job.home, s), handle.base_urls, handle.api_key, handle.episode_id)
    env["POLARPROXY_INSTRUCTION"] = job.task.instruction
    if s.preset is not None:
        rendered = s.preset.render(
            proxy_url=handle.proxy_url, key=handle.api_key, model=s.model_name, home=job.home, api=s.api
        )
        rendered.write_files()
        env = rendered.apply_env(env)
    return env


def episode_bridge(job: Job, s: Settings, spec: SandboxSpec, key: str) -> HostRelay | None:
    """This episode's own bridge to the gateway: a socket in a folder of its own (short: a Unix socket's
    path has 107 bytes), bound into this sandbox alone, so no episode reaches, renames or replaces
    another's (`spec.socket_dir` is set to it), forwarding only requests that carry `key`, the episode's
    own; None when the sandbox reaches the gateway directly."""
    if not s.runner.bridged or spec.socket_dir is None:
        return None
    folder = spec.socket_dir / hashlib.sha1(f"{job.task.id}\0{job.sample}".encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o711)
    spec.socket_dir = folder
    return HostRelay(folder / SOCKET_NAME, s.episodes.port, key)


def execute(job: Job, s: Settings) -> None:
    command = harness_command(s, job.task.instruction)
    metadata = {"rollout_id": s.rollout_id, "task_id": job.task.id, "sample": str(job.sample)}
    if s.harness:
        metadata["harness"] = s.harness
    handle = s.episodes.create(
        task=job.task.id,
        group=group_id(s, job.task),
        harness=s.harness,
        metadata={**job.task.metadata, **s.metadata, **metadata},
        command=command,
    )
    job.episode = handle
    env = episode_env(job, s, handle)
    give_to(job.home, job.uid)  # the preset's config files are the episode user's too
    spec = _spec(job.workspace, job.home, s, job.uid, gateway=True)
    limit = job.task.timeout_s or s.execute_timeout_s
    relay = episode_bridge(job, s, spec, handle.api_key)
    try:
        result = run_process(
            s.runner.argv(command, spec, env),
            cwd=s.runner.cwd(spec),
            env=s.runner.env(env, spec),
            stdin=harness_stdin(s, job.task.instruction),
            timeout_s=limit,
            cancel=job.cancel,
            log=job.dir / "harness.log",
            limits=s.limits,
        )
    except OSError as e:
        job.exit_code = 127
        raise StageError(f"cannot start the harness {command[0]!r}: {e.strerror or e}") from e
    finally:
        if relay is not None:
            relay.close()
            job.bridge_refused = dict(relay.refused)
            shutil.rmtree(spec.socket_dir or job.dir / "bridge", ignore_errors=True)
    job.harness_timed_out = result.timed_out
    job.limit_hit = result.limit_hit
    job.exit_code = EXIT_TIMEOUT if result.timed_out else EXIT_STOPPED if result.stopped else result.exit_code
    if (
        job.exit_code != 0
        and not result.stopped
        and s.episodes.calls_made(handle.episode_id, group_id(s, job.task)) == 0
    ):
        # not a sample of the policy (export/failures.py: `infra`): a wrong path, a missing binary, a crash at
        # start. The episode fails here, without a reward, and leaves its group in every export.
        tail = " ".join(result.output_tail.strip().splitlines()[-3:])[-300:]
        raise StageError(
            f"infra: the harness never reached the model (exit {job.exit_code}, no model call)"
            + (f": {tail}" if tail else "")
        )


def evaluate(job: Job, s: Settings) -> None:
    assert job.episode is not None
    fresh, home = job.dir / "evaluate", job.dir / "evaluate-home"
    for path in (fresh, home):
        if path.exists():
            shutil.rmtree(path)
    changes, patch = None, None
    try:
        if (
            job.task.grade_from == "patch"
        ):  # a clean copy of the task's workspace, the agent's changes applied
            agent_copy = job.dir / "evaluate-agent"
            shutil.rmtree(agent_copy, ignore_errors=True)
            copied = copy_workspace(job.workspace, agent_copy, max_bytes=s.max_workspace_bytes)
            copy_workspace(job.task.workspace, fresh, max_bytes=None)  # the baseline: the task's, trusted
            changes = apply_agent_changes(job.task.workspace, agent_copy, fresh)
            patch = redact_output(agent_patch(job.task.workspace, agent_copy, changes))
            shutil.rmtree(agent_copy, ignore_errors=True)
        else:
            copied = copy_workspace(job.workspace, fresh, max_bytes=s.max_workspace_bytes)
    except (WorkspaceTooLarge, OSError) as e:  # the agent's doing: reward 0, in its group
        result = VerifierResult(reward=0.0, note=f"workspace not graded: {e}; reward 0.0")
        job.reward, job.reward_note, job.evaluated = 0.0, result.note, True
        end_episode(job, s, result)
        return
    if job.task.tests is not None:  # placed after the copy: what the agent left there is replaced
        target = fresh / job.task.tests_dir
        for parent in reversed(target.relative_to(fresh).parents[:-1]):
            folder = fresh / parent
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                folder.unlink()  # a link the agent left would lead the tests out of the copy
            folder.mkdir(exist_ok=True)
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        shutil.copytree(job.task.tests, target, symlinks=True)
    (home / "tmp").mkdir(parents=True)
    uid = episode_uid()  # a user of its own: nothing the agent left running shares it
    give_to(fresh, uid)
    give_to(home, uid)
    verifier = Verifier(job.task.verify, s.reward_from, s.verify_timeout_s)  # type: ignore[arg-type]
    env = base_env(home, s)
    env["POLARPROXY_TASK"] = job.task.id
    spec = _spec(fresh, home, s, uid)
    try:
        result: VerifierResult = run_verifier(
            verifier,
            cwd=s.runner.cwd(spec),
            env=env,
            episode_id=job.episode.episode_id,
            harness_exit_code=job.exit_code if job.exit_code is not None else 124,
            wrap=lambda argv, child_env: (
                s.runner.argv(argv, spec, child_env),
                s.runner.env(child_env, spec),
            ),
        )
    except OSError as e:
        raise StageError(f"cannot run the verify command: {e.strerror or e}") from e
    if copied.skipped:
        skipped = ", ".join(f"{n} {kind}" for kind, n in sorted(copied.skipped.items()))
        result.note = f"{result.note}; not copied for grading: {skipped}"
    if changes is not None:
        result.note = f"{result.note}; {changes.note()}"
        result.patch = patch
    if job.limit_hit:  # the agent's doing: graded as it left things, and said
        result.note = f"{result.note}; the harness ran over {job.limit_hit}"
    job.reward, job.reward_note = result.reward, result.note
    job.evaluated = True
    end_episode(job, s, result)


def end_episode(job: Job, s: Settings, result: VerifierResult | None) -> None:
    """Finish the job's episode once, with the verifier's result (None: not evaluated)."""
    if job.episode is None or job.episode_ended:
        return
    job.episode_ended = True
    code = job.exit_code if job.exit_code is not None else EXIT_STOPPED
    now = time.monotonic()  # the stage that ends the episode (evaluate, or the one that failed) ends with it
    stages = {st: round(job.ended.get(st, now) - t0, 4) for st, t0 in job.started.items() if st in STAGES}
    s.episodes.end(job.episode.episode_id, exit_code=code, result=result, stages=stages)


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
