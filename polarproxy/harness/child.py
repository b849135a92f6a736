"""The harness as a child of `record`: one runner for gateway and intercept mode.

- The child runs in a process group of its own. When stdin is a terminal, that group becomes the
  terminal's foreground group (as a shell does for a job), so Ctrl-C, Ctrl-\\ and window-size changes reach
  the harness and its own children, not `record`; `record` takes the terminal back when the child ends.
- SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to `record` itself are passed on to the
  child's process group; `record` then exits with the child's code (128+N when signal N ended it).
- If `record` dies without passing anything on (SIGKILL, a crash), the kernel kills the child at once
  (PR_SET_PDEATHSIG, which is per process), and a watchdog ends the rest of the child's process group (what
  the harness started: tool commands, servers, sub-agents): a tiny process of its own session, started
  before the child, that holds the read end of a pipe whose write end only `record` holds. `record` writes
  the group's ID into it; the pipe's end of file, when `record` has not said `done` first, means `record`
  is gone, and the watchdog sends the group SIGTERM, then SIGKILL a second later. A process that left the
  group (setsid, setpgid) is out of its reach.
- `timeout_s`: when the child runs longer, its group gets SIGTERM, then SIGKILL after `grace_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
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
WATCHDOG_GRACE_S = 1.0

# The watchdog's whole program (`python -I -S -c`): no imports of polarproxy, so it starts in ~20 ms.
WATCHDOG = """
import os, signal, sys, time
fd, grace = int(sys.argv[1]), float(sys.argv[2])
data = b""
while True:
    chunk = os.read(fd, 64)
    if not chunk:
        break
    data += chunk
words = data.split()
if words and words[-1] != b"done" and words[-1].isdigit():
    pgid = int(words[-1])
    try:
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(0.05)
            os.killpg(pgid, 0)
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""


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
    # By soname, else the symbols already loaded (musl): ctypes.util.find_library would run
    # `ldconfig -p` in a subprocess on every record, ~20-50 ms of its start.
    for name in ("libc.so.6", None):
        try:
            return ctypes.CDLL(name, use_errno=True).prctl  # type: ignore[no-any-return]
        except (OSError, AttributeError):
            continue
    return None


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
    watchdog = _Watchdog.start()
    # The handlers are in place before the child starts: a signal that comes while it starts (it may have
    # said it is ready before this coroutine runs again) waits for its group, then goes to it.
    group: list[int] = []
    early: list[int] = []

    def forward(sig: int) -> None:
        if group:
            _signal_group(group[0], sig)
        else:
            early.append(sig)

    installed = []
    for sig in FORWARDED_SIGNALS:
        with contextlib.suppress(ValueError, RuntimeError):  # not the main thread: no handlers
            loop.add_signal_handler(sig, forward, sig)
            installed.append(sig)
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, env=dict(env), cwd=cwd, preexec_fn=_preexec(_prctl(), tty, os.getpid())
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
        watchdog.done()
        for sig in installed:
            loop.remove_signal_handler(sig)
        code = 127 if isinstance(e, FileNotFoundError) else 126
        return ChildExit(code, error=f"cannot run {command[0]!r}: {e.strerror}.")
    pgid = proc.pid  # setpgid(0, 0): the group is named after the child
    watchdog.watch(pgid)
    group.append(pgid)
    for sig in early:
        _signal_group(pgid, sig)
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
        watchdog.done()
        for sig in installed:
            loop.remove_signal_handler(sig)
        _take_terminal_back(tty)
    return ChildExit(exit_code(returncode), timed_out=timed_out)


class _Watchdog:
    """The process that ends the child's group if `record` dies (module docstring). Where it cannot start,
    the child still dies with `record` (PR_SET_PDEATHSIG); only its own children may then outlive it."""

    def __init__(self, proc: subprocess.Popen[bytes] | None, fd: int | None) -> None:
        self.proc = proc
        self.fd = fd  # the write end; only this process holds it

    @staticmethod
    def start() -> _Watchdog:
        r, w = os.pipe()
        try:
            os.set_inheritable(w, False)
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", WATCHDOG, str(r), str(WATCHDOG_GRACE_S)],
                pass_fds=(r,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # not in the child's group, nor in the terminal's foreground group
            )
        except OSError:
            os.close(w)
            return _Watchdog(None, None)
        finally:
            os.close(r)
        return _Watchdog(proc, w)

    def watch(self, pgid: int) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.write(self.fd, f"{pgid}\n".encode())

    def done(self) -> None:
        """The child ended under `record`'s eyes: the watchdog leaves without killing anything."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.fd, b"done\n")
        os.close(self.fd)
        self.fd = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)


async def stop_harness(harness: asyncio.Task[ChildExit] | None) -> None:
    """End a `run_child` task that is still running (its group is killed: `record` could not go on)."""
    if harness is not None and not harness.done():
        harness.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await harness
