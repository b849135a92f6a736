"""The harness as a child of `record`: one runner for gateway and intercept mode.

- The child runs in a process group of its own. When stdin is a terminal, that group becomes the
  terminal's foreground group (as a shell does for a job), so Ctrl-C, Ctrl-\\ and window-size changes reach
  the harness and its own children, not `record`; `record` takes the terminal back when the child ends.
- SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to `record` itself are passed on to the
  child's process group; `record` then exits with the child's code (128+N when signal N ended it).
- If `record` dies without passing anything on (SIGKILL, a crash), the kernel kills the child at once
  (PR_SET_PDEATHSIG); processes the child started itself are its own to end.
- `timeout_s`: when the child runs longer, its group gets SIGTERM, then SIGKILL after `grace_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

FORWARDED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class ChildExit:
    code: int  # the child's exit code; 128+N when signal N ended it; 126/127 when it could not start
    timed_out: bool = False
    error: str | None = None  # why it could not start


def exit_code(returncode: int) -> int:
    """A Popen return code as a shell reports it: 128+N for a child ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved in the parent (the child only calls it between fork and exec)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    return libc.prctl


def _terminal_fd() -> int | None:
    """stdin when it is this process's controlling terminal and we are in its foreground group."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _preexec(prctl: Callable[..., int] | None, tty: int | None, parent: int) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec: os calls only
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(137)
        os.setpgid(0, 0)
        if tty is not None:
            old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            with contextlib.suppress(OSError):
                os.tcsetpgrp(tty, os.getpgrp())
            signal.signal(signal.SIGTTOU, old)

    return setup


def _take_terminal_back(tty: int | None) -> None:
    if tty is None:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(tty, os.getpgrp())
    finally:
        signal.signal(signal.SIGTTOU, old)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def run_child(
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: str | None = None,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
) -> ChildExit:
    """Run `command` to its end as described in the module docstring; never raises for a command that
    cannot start (the exit says 127/126 and why)."""
    loop = asyncio.get_running_loop()
    tty = _terminal_fd()
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, env=dict(env), cwd=cwd, preexec_fn=_preexec(_prctl(), tty, os.getpid())
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
        code = 127 if isinstance(e, FileNotFoundError) else 126
        return ChildExit(code, error=f"cannot run {command[0]!r}: {e.strerror}.")
    pgid = proc.pid  # setpgid(0, 0): the group is named after the child
    installed = []
    for sig in FORWARDED_SIGNALS:
        with contextlib.suppress(ValueError, RuntimeError):  # not the main thread: no handlers
            loop.add_signal_handler(sig, _signal_group, pgid, sig)
            installed.append(sig)
    timed_out = False
    try:
        try:
            returncode = await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
            _signal_group(pgid, signal.SIGTERM)
            try:
                returncode = await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                _signal_group(pgid, signal.SIGKILL)
                returncode = await proc.wait()
    except asyncio.CancelledError:
        _signal_group(pgid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        _take_terminal_back(tty)
    return ChildExit(exit_code(returncode), timed_out=timed_out)
