"""Isolation runners for `rollout --isolation none|bwrap|docker|apptainer`: the command line that runs a
harness in an episode's sandbox, and the process that runs it (its own process group, killed whole at
its time limit or when the episode is stopped).

Every sandbox but `none` gives the harness a fresh HOME, makes only the episode's workspace (and that
HOME) writable, hides the paths it is given (the tasks' hidden tests, the store, the other episodes), and
has no network but the gateway: its own network namespace, with the gateway reached through the
Unix-socket bridge (bridge.py) on 127.0.0.1:PORT inside. `none` runs the harness as it is, in its
workspace copy, with the fresh HOME in its environment only; it reaches whatever the host reaches.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from polarproxy.choices import ISOLATIONS
from polarproxy.errors import UsageError
from polarproxy.rollout import bridge

SOCKET_NAME = "gateway.sock"
KILL_GRACE_S = 3.0
BRIDGE_PATH = Path(bridge.__file__).resolve()
# in a container image: where the workspace, HOME, the socket's folder and the bridge are mounted
C_WORKSPACE, C_HOME, C_SOCKET_DIR, C_BRIDGE = (
    "/workspace",
    "/home/agent",
    "/run/polarproxy",
    "/opt/polarproxy/bridge.py",
)


class SandboxError(UsageError):
    """An isolation that cannot be used here (engine missing, probe failed)."""


@dataclass(slots=True)
class SandboxSpec:
    """One episode's sandbox: what is writable, what is hidden, how the gateway is reached."""

    workspace: Path
    home: Path
    socket_dir: Path  # holds SOCKET_NAME, the host end of the bridge
    gateway_port: int  # the port the harness dials on 127.0.0.1 inside (the gateway's own port)
    hidden: list[Path] = field(default_factory=list)  # existing paths the harness must not see
    image: str | None = None  # docker / apptainer


class Runner:
    name = "none"
    bridged = False  # True: the harness reaches the gateway through the bridge

    def probe(self) -> str | None:
        """None when this isolation works here, else why not."""
        return None

    def argv(self, command: list[str], spec: SandboxSpec, env: dict[str, str]) -> list[str]:
        return list(command)

    def env(self, env: dict[str, str], spec: SandboxSpec) -> dict[str, str]:
        """The environment of the process started on the host (the runner's, which passes it on)."""
        return dict(env)

    def cwd(self, spec: SandboxSpec) -> Path:
        return spec.workspace


def _bridge_argv(python: str, bridge_path: str, socket_path: str, port: int, command: list[str]) -> list[str]:
    return [python, "-I", bridge_path, "--socket", socket_path, "--port", str(port), "--", *command]


class BwrapRunner(Runner):
    """bubblewrap: the host's root read-only, private /tmp, /dev and /proc, every namespace unshared (network
    included), the workspace and HOME bound writable at their own paths, hidden paths covered."""

    name = "bwrap"
    bridged = True

    def __init__(self, binary: str = "bwrap", python: str | None = None) -> None:
        self.binary = binary
        import sys

        self.python = python or sys.executable

    def probe(self) -> str | None:
        path = shutil.which(self.binary)
        if path is None:
            return "bwrap is not installed (Debian/Ubuntu: apt-get install -y bubblewrap)"
        try:
            r = subprocess.run(
                [path, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "true"],
                capture_output=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"bwrap could not be run: {e}"
        if r.returncode != 0:
            return f"bwrap cannot create a sandbox here: {r.stderr.decode(errors='replace').strip()[:300]}"
        return None

    def argv(self, command: list[str], spec: SandboxSpec, env: dict[str, str]) -> list[str]:
        args = [self.binary, "--unshare-all", "--die-with-parent", "--new-session"]
        args += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for path in _under_tmp([self.python, str(BRIDGE_PATH), *command]):
            args += ["--ro-bind", str(path), str(path)]  # the private /tmp must not hide what runs
        for path in spec.hidden:
            if path.is_dir():
                args += ["--tmpfs", str(path)]
            elif path.exists():
                args += ["--ro-bind", "/dev/null", str(path)]
        for path in (spec.workspace, spec.home, spec.socket_dir):
            args += ["--bind", str(path), str(path)]
        args += ["--chdir", str(spec.workspace), "--"]
        socket_path = str(spec.socket_dir / SOCKET_NAME)
        return args + _bridge_argv(self.python, str(BRIDGE_PATH), socket_path, spec.gateway_port, command)


def _under_tmp(paths: list[str]) -> list[Path]:
    """What the sandboxed command needs that lives under /tmp (a checkout or venv there): the interpreter's
    prefixes, polarproxy's package root, and the command's own file arguments, outermost first."""
    import polarproxy

    wanted = [Path(sys.prefix), Path(sys.base_prefix), Path(polarproxy.__file__).resolve().parent.parent]
    wanted += [Path(p) for p in paths if p.startswith("/") and Path(p).exists()]
    tmp = Path("/tmp")
    found: list[Path] = []
    for path in sorted({p.resolve() if p.exists() else p for p in wanted}, key=lambda p: len(p.parts)):
        if tmp in path.parents and not any(f in path.parents or f == path for f in found):
            found.append(path)
    return found


def _translate(value: str, spec: SandboxSpec) -> str:
    """A host path in an environment value, as the container sees it."""
    return value.replace(str(spec.home), C_HOME).replace(str(spec.workspace), C_WORKSPACE)


def _probe_command(argv: list[str], what: str) -> str | None:
    if shutil.which(argv[0]) is None:
        return f"{argv[0]} is not installed"
    try:
        r = subprocess.run(argv, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{what} did not answer: {e}"
    if r.returncode != 0:
        return (
            f"{what} did not answer (`{' '.join(argv)}`: {r.stderr.decode(errors='replace').strip()[:300]})"
        )
    return None


class DockerRunner(Runner):
    """`docker run --network none`: the workspace at /workspace, HOME at /home/agent, the socket's folder at
    /run/polarproxy and the bridge at /opt/polarproxy/bridge.py; the image needs python3."""

    name = "docker"
    bridged = True

    def __init__(self, binary: str = "docker") -> None:
        self.binary = binary

    def probe(self) -> str | None:
        return _probe_command([self.binary, "info", "--format", "{{.ServerVersion}}"], "the Docker engine")

    def argv(self, command: list[str], spec: SandboxSpec, env: dict[str, str]) -> list[str]:
        if not spec.image:
            raise SandboxError(
                "--isolation docker needs an image.", hint="Pass --image IMAGE (with python3 in it)."
            )
        args = [self.binary, "run", "--rm", "-i", "--init", "--network", "none"]
        args += ["--user", f"{os.getuid()}:{os.getgid()}", "--workdir", C_WORKSPACE]
        args += ["-v", f"{spec.workspace}:{C_WORKSPACE}", "-v", f"{spec.home}:{C_HOME}"]
        args += ["-v", f"{spec.socket_dir}:{C_SOCKET_DIR}", "-v", f"{BRIDGE_PATH}:{C_BRIDGE}:ro"]
        for name in sorted(env):  # values come from the client's environment: never on the command line
            args += ["-e", name]
        args.append(spec.image)
        return args + _bridge_argv(
            "python3", C_BRIDGE, f"{C_SOCKET_DIR}/{SOCKET_NAME}", spec.gateway_port, command
        )

    def env(self, env: dict[str, str], spec: SandboxSpec) -> dict[str, str]:
        inner = {k: _translate(v, spec) for k, v in env.items()}
        inner["HOME"] = C_HOME
        return {**os.environ, **inner}

    def cwd(self, spec: SandboxSpec) -> Path:
        return spec.workspace


class ApptainerRunner(Runner):
    """`apptainer exec --containall --net --network none`: the same mounts as Docker. Its own network
    namespace needs root or `--fakeroot` set up for the user (apptainer's network configuration)."""

    name = "apptainer"
    bridged = True

    def __init__(self, binary: str = "apptainer") -> None:
        self.binary = binary

    def probe(self) -> str | None:
        return _probe_command([self.binary, "--version"], "apptainer")

    def argv(self, command: list[str], spec: SandboxSpec, env: dict[str, str]) -> list[str]:
        if not spec.image:
            raise SandboxError(
                "--isolation apptainer needs an image.", hint="Pass --image IMAGE.sif (with python3 in it)."
            )
        args = [self.binary, "exec", "--containall", "--cleanenv", "--net", "--network", "none"]
        args += ["--home", f"{spec.home}:{C_HOME}", "--pwd", C_WORKSPACE]
        args += ["--bind", f"{spec.workspace}:{C_WORKSPACE}", "--bind", f"{spec.socket_dir}:{C_SOCKET_DIR}"]
        args += ["--bind", f"{BRIDGE_PATH}:{C_BRIDGE}:ro", spec.image]
        return args + _bridge_argv(
            "python3", C_BRIDGE, f"{C_SOCKET_DIR}/{SOCKET_NAME}", spec.gateway_port, command
        )

    def env(self, env: dict[str, str], spec: SandboxSpec) -> dict[str, str]:
        # --cleanenv passes only APPTAINERENV_* variables, without the prefix
        inner = {k: _translate(v, spec) for k, v in env.items() if k != "HOME"}
        return {**os.environ, **{f"APPTAINERENV_{k}": v for k, v in inner.items()}}


RUNNERS: dict[str, type[Runner]] = {
    "none": Runner,
    "bwrap": BwrapRunner,
    "docker": DockerRunner,
    "apptainer": ApptainerRunner,
}


def get_runner(name: str | None) -> Runner:
    """The runner named `name`, probed; None: bwrap where it works, else none. Raises SandboxError."""
    if name is None:
        runner = BwrapRunner()
        return runner if runner.probe() is None else Runner()
    if name not in RUNNERS:
        raise SandboxError(f"Unknown isolation {name!r}.", hint=f"Choose one of: {', '.join(ISOLATIONS)}.")
    runner = RUNNERS[name]()
    why = runner.probe()
    if why is not None:
        raise SandboxError(
            f"--isolation {name} cannot be used here: {why}.",
            hint="Pick another --isolation (none|bwrap|docker|apptainer), or install the engine.",
        )
    return runner


@dataclass(slots=True)
class ProcessResult:
    exit_code: int | None  # None: killed (timeout or stopped)
    timed_out: bool = False
    stopped: bool = False  # ended by `cancel` (the group was accepted without it)
    duration_s: float = 0.0
    output_tail: str = ""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_process(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdin: bytes = b"",
    timeout_s: float | None,
    cancel: threading.Event | None = None,
    log: Path | None = None,
) -> ProcessResult:
    """Run argv in a session of its own; at the timeout, or when `cancel` is set, kill its whole process
    group (SIGTERM, then SIGKILL). Output goes to `log` (its tail is returned)."""
    t0 = time.monotonic()
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            argv,
            cwd=os.fspath(cwd),
            env=env,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError:
        if log is not None:
            out.close()  # type: ignore[union-attr]
        raise
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, OSError):
        proc.stdin.write(stdin)
    with contextlib.suppress(OSError):
        proc.stdin.close()
    timed_out = stopped = False
    deadline = t0 + timeout_s if timeout_s is not None else None
    try:
        while proc.poll() is None:
            if cancel is not None and cancel.is_set():
                stopped = True
                break
            if deadline is not None and time.monotonic() >= deadline:
                timed_out = True
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)
    finally:
        if proc.poll() is None or timed_out or stopped:
            _kill_group(proc)  # grandchildren too, even when the leader has just exited
        if log is not None:
            out.close()  # type: ignore[union-attr]
    rc = proc.returncode
    tail = ""
    if log is not None:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 4000))
            tail = f.read().decode("utf-8", errors="replace")
    return ProcessResult(
        exit_code=None if (timed_out or stopped) else (128 - rc if rc < 0 else rc),
        timed_out=timed_out,
        stopped=stopped,
        duration_s=time.monotonic() - t0,
        output_tail=tail,
    )
