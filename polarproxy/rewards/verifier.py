"""A verifier command: run it after the harness, in the harness's working folder, and read a reward from it.

The command is a shell command line (`/bin/sh -c CMD`), run with `POLARPROXY_EPISODE` and
`POLARPROXY_EXIT_CODE` (the harness's exit code) added to the environment it is given, stdin closed, and
stdout and stderr captured (their tails are kept with the reward, secrets redacted, as is the command). It runs in a session of its own, so a timeout ends its whole process group
(SIGTERM, then SIGKILL after a grace period), grandchildren included.

`reward_from="exit"`: exit 0 is reward 1.0, anything else 0.0. `reward_from="stdout"`: the last non-empty
line of stdout is a number (`0.75`) or a JSON object `{"reward": x, "calls": {"N": y}}` (both keys
optional; N is a call's sequence number as `polarproxy show` prints it). A verifier that times out gives
reward 0.0 (the task was not shown to be solved in time) and says so in `note`; a stdout whose last line
cannot be read gives no reward (None, with the reason in `note`), so that a broken verifier does not teach
the model that it failed.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from polarproxy.choices import REWARD_FROM, RewardFrom
from polarproxy.rewards.redact import redact_command, redact_output
from polarproxy.store.records import RewardOrigin
from polarproxy.store.rewards import valid_grading

DEFAULT_TIMEOUT_S = 600.0
KILL_GRACE_S = 5.0  # between SIGTERM and SIGKILL to the verifier's process group
OUTPUT_TAIL_CHARS = 4000  # of stdout, and of stderr, kept with the reward


class RewardParseError(ValueError):
    """A verifier's output holds no reward in the documented form."""


@dataclass(slots=True, frozen=True)
class Verifier:
    """`record --reward-cmd CMD --reward-from exit|stdout --reward-timeout S`."""

    command: str
    reward_from: RewardFrom = "exit"
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise ValueError(
                "The reward command is empty. Pass --reward-cmd 'pytest -q tests/', for example."
            )
        if self.reward_from not in REWARD_FROM:
            raise ValueError(
                f"Unknown reward source {self.reward_from!r}. Must be one of {', '.join(map(repr, REWARD_FROM))}."
            )
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"Reward timeout {self.timeout_s!r} must be a positive number of seconds.")


@dataclass(slots=True)
class VerifierResult:
    """What a verifier run gave. `set_episode` False: the output named per-call rewards only, so the
    episode's reward is left as it is."""

    reward: float | None
    set_episode: bool = True
    calls: dict[int, float | None] = field(default_factory=dict)
    exit_code: int | None = None  # None: killed at the timeout
    timed_out: bool = False
    output_tail: str = ""
    note: str | None = None
    duration_s: float = 0.0
    command: list[str] = field(default_factory=list)  # redacted
    patch: str | None = None  # the agent's changes, where the task grades from them (rollout)
    grading: dict[str, Any] | None = None  # a grader's per-test results: its last line (`grading_of`)

    def origin(self) -> RewardOrigin:
        return RewardOrigin(
            source="command",
            command=self.command,
            exit_code=self.exit_code,
            output_tail=self.output_tail,
            note=self.note,
            patch=self.patch,
            grading=self.grading,
        )


def _finite(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RewardParseError(f"{what} {value!r} is not a finite number")
    return float(value)


def parse_reward_output(stdout: str) -> tuple[float | None, bool, dict[int, float | None]]:
    """(episode reward, whether it was given, per-call rewards) from a verifier's stdout: its last non-empty
    line is a number or a JSON object {"reward": x, "calls": {"N": y}}. Raises RewardParseError."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise RewardParseError("stdout is empty")
    last = lines[-1]
    try:
        value = orjson.loads(last)
    except orjson.JSONDecodeError:
        try:
            value = float(last)
        except ValueError:
            raise RewardParseError(
                f'the last line of stdout, {last[:200]!r}, is neither a number nor JSON {{"reward": x}}'
            ) from None
    if not isinstance(value, dict):
        return _finite(value, "the reward"), True, {}
    unknown = sorted(set(value) - {"reward", "calls"})
    if unknown:
        raise RewardParseError(f"unknown keys {unknown} in {last[:200]!r}; allowed: 'reward', 'calls'")
    calls: dict[int, float | None] = {}
    raw_calls = value.get("calls", {})
    if not isinstance(raw_calls, dict):
        raise RewardParseError(f'"calls" must be an object {{"N": reward}}, got {raw_calls!r}')
    for key, reward in raw_calls.items():
        try:
            seq = int(key)
        except ValueError:
            raise RewardParseError(f"call number {key!r} is not an integer (0 is the first call)") from None
        if seq < 0:
            raise RewardParseError(f"call number {seq} is negative (0 is the first call)")
        calls[seq] = _finite(reward, f"the reward of call {seq}")
    if "reward" not in value:
        if not calls:
            raise RewardParseError(f"{last[:200]!r} names no reward and no calls")
        return None, False, calls
    return _finite(value["reward"], "the reward"), True, calls


MAX_GRADING_LINE = 4 << 20


def grading_of(stdout: bytes) -> dict[str, Any] | None:
    """A grader's per-test results: its last stdout line when that is a JSON object whose `tests` maps test
    IDs to statuses (rollout/swebench_grade.py prints `{"resolved", "parser", "tests"}`), else None. Kept for
    people (`show`, the viewer); the reward still comes from the exit code or the reward line."""
    last = stdout.rstrip().rpartition(b"\n")[2].strip()
    if not last.startswith(b"{") or len(last) > MAX_GRADING_LINE:
        return None
    try:
        return valid_grading(orjson.loads(last))
    except orjson.JSONDecodeError:
        return None


def _tail(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= OUTPUT_TAIL_CHARS else "…" + text[-OUTPUT_TAIL_CHARS:]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the verifier's process group; SIGKILL to whatever is left of it after the grace period."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_verifier(
    verifier: Verifier,
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str],
    episode_id: str,
    harness_exit_code: int,
    wrap: Callable[[list[str], dict[str, str]], tuple[list[str], dict[str, str]]] | None = None,
) -> VerifierResult:
    """Run the verifier and read its reward (see the module docstring). Never raises for what the command
    does; OSError only when the shell itself cannot be started. `wrap(argv, env)` gives the command line and
    environment that run it elsewhere (`rollout`'s sandbox)."""
    child_env = dict(env)
    child_env["POLARPROXY_EPISODE"] = episode_id
    child_env["POLARPROXY_EXIT_CODE"] = str(harness_exit_code)
    command = redact_command(verifier.command)
    argv = ["/bin/sh", "-c", verifier.command]
    if wrap is not None:
        argv, child_env = wrap(argv, child_env)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=os.fspath(cwd),
        env=child_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=verifier.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        try:  # a process that left the group may still hold the pipes: read what is there, briefly
            out, err = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            out, err = b"", b""
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()
    finally:
        if proc.poll() is None:  # interrupted while waiting (KeyboardInterrupt): leave nothing running
            _kill_group(proc)
    duration = time.monotonic() - t0
    rc = proc.returncode
    exit_code = None if timed_out else (128 - rc if rc < 0 else rc)
    tail = redact_output(_tail(out) + (f"\n--- stderr ---\n{_tail(err)}" if err.strip() else ""))
    result = VerifierResult(
        reward=None,
        exit_code=exit_code,
        timed_out=timed_out,
        output_tail=tail,
        duration_s=duration,
        command=command,
        grading=None if timed_out else grading_of(out),
    )
    if timed_out:
        result.reward = 0.0
        result.note = f"timeout: the verifier ran past {verifier.timeout_s:g} s and was killed; reward 0.0"
    elif verifier.reward_from == "exit":
        result.reward = 1.0 if exit_code == 0 else 0.0
        result.note = f"exit code {exit_code}"
    else:
        try:
            result.reward, result.set_episode, result.calls = parse_reward_output(
                out.decode("utf-8", errors="replace")
            )
            result.note = f"from stdout (exit code {exit_code})"
        except RewardParseError as e:
            result.reward, result.set_episode = None, True
            result.note = f"no reward: {e} (exit code {exit_code})"
    resolved = (result.grading or {}).get("resolved")
    if isinstance(resolved, bool) and result.reward is not None and resolved != (result.reward >= 1.0):
        # a grader that stopped after the tests' own output: its last line may be theirs (the agent's code)
        result.grading = None
        result.note = f"{result.note}; the output's test results disagree with the reward: not kept"
    return result
