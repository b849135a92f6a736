"""The harness child of `record` (harness/child.py, used by gateway and intercept mode): signals sent to
`record` alone reach the harness's process group and `record` exits with the harness's code; a `record`
that is killed takes the harness with it within a second; a timeout ends the group."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polarproxy.harness.child import exit_code, run_child

# A harness stand-in: writes its pid and process group, then waits; SIGINT exits 42, SIGTERM 43.
HARNESS = """
import os, signal, sys, time
out = sys.argv[1]
def on(sig, code):
    def handler(*_):
        open(out + ".got", "w").write(signal.Signals(sig).name)
        os._exit(code)
    signal.signal(sig, handler)
on(signal.SIGINT, 42)
on(signal.SIGTERM, 43)
open(out + ".tmp", "w").write(f"{os.getpid()} {os.getpgrp()}")
os.rename(out + ".tmp", out)
time.sleep(60)
"""


def _wait_for(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its parent's wait is missing


def _record(tmp_path: Path, out: Path) -> subprocess.Popen[str]:
    """`polarproxy record --intercept` (no backend needed) around the stand-in harness."""
    cmd = [sys.executable, "-m", "polarproxy", "record", "--intercept", "--db", str(tmp_path / "r.db")]
    env = {**os.environ, "POLARPROXY_CA_DIR": str(tmp_path / "ca")}
    return subprocess.Popen(
        [*cmd, "--", sys.executable, "-c", HARNESS, str(out)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_exit_codes_read_as_a_shell_reports_them():
    assert (exit_code(0), exit_code(3), exit_code(-signal.SIGKILL)) == (0, 3, 137)


def test_a_command_that_cannot_start_says_why_with_127():
    result = asyncio.run(run_child(["/nonexistent/harness"], os.environ))
    assert result.code == 127 and "cannot run '/nonexistent/harness'" in (result.error or "")


def test_the_child_has_a_process_group_of_its_own(tmp_path):
    out = tmp_path / "pid"
    script = "import os, sys; open(sys.argv[1], 'w').write(f'{os.getpid()} {os.getpgrp()}')"
    result = asyncio.run(run_child([sys.executable, "-c", script, str(out)], os.environ))
    pid, pgid = map(int, out.read_text().split())
    assert result.code == 0 and pid == pgid != os.getpgrp()


def test_a_timeout_ends_the_childs_group_with_sigterm(tmp_path):
    out = tmp_path / "pid"
    result = asyncio.run(
        run_child([sys.executable, "-c", HARNESS, str(out)], os.environ, timeout_s=3, grace_s=5)
    )
    assert result.timed_out and result.code == 43 and Path(f"{out}.got").read_text() == "SIGTERM"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 42), (signal.SIGTERM, 43)])
def test_a_signal_to_record_alone_reaches_the_harness_and_record_exits_with_its_code(tmp_path, sig, code):
    out = tmp_path / "pid"
    rec = _record(tmp_path, out)
    try:
        pid, pgid = map(int, _wait_for(out).split())
        assert pgid == pid != os.getpgid(rec.pid)  # the harness has its own group
        rec.send_signal(sig)  # to record's process only, not to its group
        _, stderr = rec.communicate(timeout=60)
    finally:
        rec.kill()
    assert Path(f"{out}.got").read_text() == sig.name
    assert rec.returncode == code, stderr[-2000:]


def test_a_killed_record_takes_the_harness_with_it_within_a_second(tmp_path):
    out = tmp_path / "pid"
    rec = _record(tmp_path, out)
    pid = -1
    try:
        pid, _ = map(int, _wait_for(out).split())
        assert _alive(pid)
        rec.kill()  # SIGKILL: record passes nothing on
        rec.wait(10)
        deadline = time.monotonic() + 1.0
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(pid), "the harness outlived record"
    finally:
        rec.kill()
        if pid > 0 and _alive(pid):
            os.kill(pid, signal.SIGKILL)


# A harness that starts a grandchild (a tool command, in the harness's group) and waits on it.
SPAWNER = """
import subprocess, sys, time, os
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {child.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
child.wait()
"""


def test_a_killed_record_takes_what_the_harness_started_with_it_within_seconds(tmp_path):
    out = tmp_path / "pids"
    cmd = [sys.executable, "-m", "polarproxy", "record", "--intercept", "--db", str(tmp_path / "r.db")]
    env = {**os.environ, "POLARPROXY_CA_DIR": str(tmp_path / "ca")}
    rec = subprocess.Popen(
        [*cmd, "--", sys.executable, "-c", SPAWNER, str(out)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    grandchild = -1
    try:
        _, grandchild = map(int, _wait_for(out).split())
        assert _alive(grandchild)
        rec.kill()  # SIGKILL: record passes nothing on; the kernel ends the harness, the watchdog the rest
        rec.wait(10)
        deadline = time.monotonic() + 5.0
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild), "a process the harness started outlived record"
    finally:
        rec.kill()
        if grandchild > 0 and _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_a_harness_that_ends_normally_leaves_no_watchdog_behind(tmp_path):
    before = set(_watchdogs())
    result = asyncio.run(run_child([sys.executable, "-c", "pass"], os.environ))
    assert result.code == 0
    assert set(_watchdogs()) - before == set()


def _watchdogs() -> list[int]:
    from polarproxy.harness.child import WATCHDOG

    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmdline = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if WATCHDOG.encode() in cmdline and _alive(int(p.name)):
                found.append(int(p.name))
    return found
