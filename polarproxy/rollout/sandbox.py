"""Isolation runners for `rollout --isolation none|bwrap|docker|apptainer`: the command line that runs a
harness in an episode's sandbox, and the process that runs it (its own process group, killed whole at
its time limit or when the episode is stopped).

Every sandbox but `none` gives the harness a fresh HOME, makes only the episode's workspace (and that
HOME) writable, and has no network but the gateway: its own network namespace, with the gateway reached
through the Unix-socket bridge (bridge.py) on 127.0.0.1:PORT inside. `none` runs the harness as it is, in
its workspace copy, with the fresh HOME in its environment only; it reaches whatever the host reaches.

bwrap builds the harness's file system from an allow-list: the system folders read-only, the Python that
runs the bridge, the harness's own install (found from its command and PATH), `--ro-bind` extras, the
workspace and HOME, a private /tmp. Nothing else of the host is there: not the store, not other episodes,
not /root, /run or the host's Unix sockets. Started by root, the sandbox runs the harness as a host user of
its own (`episode_uid`: no capabilities, no setuid, its bounding set empty), so nothing it does inside can
undo a mount, and files are read with that user's rights. See docs/rollout.md, "Threat model".
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
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
from polarproxy.rollout.limits import EpisodeCgroup, Limits

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


# the host folders every bwrap sandbox sees, read-only (a symlink among them, as with a merged /usr, is made
# again as a symlink)
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# when rollout runs as root, each episode's harness runs as a host user of its own: a uid in a block of
# EPISODE_UIDS ids picked at random per process above EPISODE_UID_BASE (above the usual subuid ranges)
EPISODE_UID_BASE = 400_000
EPISODE_UIDS = 1_000
_uid_block = EPISODE_UID_BASE + secrets.randbelow(100_000) * EPISODE_UIDS
_uid_next = itertools.count()
_uid_lock = threading.Lock()


def episode_uid() -> int | None:
    """The host uid an episode's sandbox runs its harness as: a fresh one per episode when this process is
    root (bwrap started by root keeps every capability otherwise), None when it is not (the sandbox then
    runs as this user, in a user namespace without capabilities)."""
    if os.geteuid() != 0:
        return None
    with _uid_lock:
        return _uid_block + next(_uid_next) % EPISODE_UIDS


def give_to(path: Path, uid: int | None) -> None:
    """Make `path` (a tree) the episode user's: owner and group `uid`. Links are changed, not followed."""
    if uid is None:
        return
    os.chown(path, uid, uid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


class SandboxError(UsageError):
    """An isolation that cannot be used here (engine missing, probe failed)."""


@dataclass(slots=True)
class SandboxSpec:
    """One episode's sandbox: what is writable, what is hidden, how the gateway is reached."""

    workspace: Path
    home: Path
    socket_dir: Path | None  # holds SOCKET_NAME, the host end of the bridge; None: no gateway (setup, verify)
    gateway_port: int = 0  # the port the harness dials on 127.0.0.1 inside (the gateway's own port)
    hidden: list[Path] = field(default_factory=list)  # existing paths the harness must not see
    image: str | None = None  # docker / apptainer
    uid: int | None = None  # the host user the harness runs as (episode_uid); None: this process's
    limits: Limits | None = None  # rlimits inside the sandbox (the cgroup's totals: run_process)
    ro_binds: list[Path] = field(default_factory=list)  # `--ro-bind PATH`: more of the host, read-only


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
    """bubblewrap: a new root built from an allow-list (`allowed_paths`), private /tmp, /dev and /proc, every
    namespace but the user's unshared (network included), the workspace and HOME bound writable at their
    own paths. Started by root it keeps only what `setpriv` needs to become the episode's user (then none);
    started by another user it runs in a user namespace without capabilities."""

    name = "bwrap"
    bridged = True

    def __init__(self, binary: str = "bwrap", python: str | None = None) -> None:
        self.binary = binary
        self.python = python or sys.executable

    def probe(self) -> str | None:
        path = shutil.which(self.binary)
        if path is None:
            return "bwrap is not installed (Debian/Ubuntu: apt-get install -y bubblewrap)"
        if os.geteuid() == 0 and shutil.which("setpriv") is None:
            return "setpriv is not installed (Debian/Ubuntu: apt-get install -y util-linux)"
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
        args = [self.binary, "--die-with-parent", "--new-session"]
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        if spec.uid is None:
            args += ["--unshare-user", "--cap-drop", "ALL"]
        else:  # root: setpriv below needs these three, and drops them with everything else
            args += ["--cap-drop", "ALL"]
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        for path in SYSTEM_PATHS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        args += ["--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp"]
        args += ["--perms", "1777", "--tmpfs", "/var/tmp"]
        binds: list[Path] = []
        made: set[Path] = {Path("/tmp"), Path("/var/tmp")}
        for path in allowed_paths(self.python, command, env, spec):
            args += [*_parents(path, binds, made), "--ro-bind", str(path), str(path)]
            binds.append(path)
        for (
            path
        ) in spec.hidden:  # a hidden path inside what was bound stays hidden (elsewhere it is not there)
            if not any(path == b or b in path.parents for b in binds):
                continue
            if path.is_dir():
                args += ["--tmpfs", str(path)]
            elif path.exists():
                args += ["--ro-bind", "/dev/null", str(path)]
        for path in (spec.workspace, spec.home):
            args += [*_parents(path, binds, made), "--bind", str(path), str(path)]
            binds.append(path)
        if spec.uid is not None:  # the episode's user has a name (node's os.userInfo(), ssh, git need one)
            passwd, group = _identity_files(spec.uid, spec.home)
            args += ["--ro-bind", str(passwd), "/etc/passwd", "--ro-bind", str(group), "/etc/group"]
        if spec.socket_dir is not None:
            args += _parents(spec.socket_dir, binds, made)
            args += ["--ro-bind", str(spec.socket_dir), str(spec.socket_dir)]
        args += ["--chdir", str(spec.workspace), "--"]
        if spec.limits is not None:  # set while still privileged: the episode's user cannot raise them
            args += spec.limits.prlimit()
        if spec.uid is not None:
            args += ["setpriv", "--reuid", str(spec.uid), "--regid", str(spec.uid), "--clear-groups"]
            args += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        if spec.socket_dir is None:
            return args + list(command)
        socket_path = str(spec.socket_dir / SOCKET_NAME)
        return args + _bridge_argv(self.python, str(BRIDGE_PATH), socket_path, spec.gateway_port, command)


_SYSTEM = tuple(Path(p) for p in SYSTEM_PATHS)


AGENT_NAME = "agent"  # the episode user's name in its sandbox


def _identity_files(uid: int, home: Path) -> tuple[Path, Path]:
    """/etc/passwd and /etc/group for a sandbox: the host's entries and the episode's user (`agent`, its
    HOME), written beside that HOME."""
    passwd, group = home.parent / f".passwd-{uid}", home.parent / f".group-{uid}"
    host_passwd = Path("/etc/passwd").read_text() if Path("/etc/passwd").is_file() else ""
    host_group = Path("/etc/group").read_text() if Path("/etc/group").is_file() else ""
    passwd.write_text(host_passwd.rstrip("\n") + f"\n{AGENT_NAME}:x:{uid}:{uid}:agent:{home}:/bin/sh\n")
    group.write_text(host_group.rstrip("\n") + f"\n{AGENT_NAME}:x:{uid}:\n")
    return passwd, group


def _parents(path: Path, binds: list[Path], made: set[Path]) -> list[str]:
    """`--dir` for each folder above `path` that the sandbox's root does not have yet, made traversable
    (0755): bwrap makes them 0700 when root starts it, which the episode's user could not pass. A folder
    that is bound, or inside what is bound, is there already."""
    args: list[str] = []
    for parent in reversed(path.parents):
        if parent == Path("/") or parent in made:
            continue
        if any(parent == b or b in parent.parents for b in (*_SYSTEM, *binds)):
            continue
        args += ["--perms", "0755", "--dir", str(parent)]
        made.add(parent)
    return args


def _covered(path: Path, chosen: list[Path]) -> bool:
    return any(path == c or c in path.parents for c in (*_SYSTEM, *chosen))


def _venv(path: Path) -> list[Path]:
    """A virtual environment holding `path` (its root and the Python it was made from), or []."""
    for root in (path.parent, path.parent.parent):
        cfg = root / "pyvenv.cfg"
        if cfg.is_file():
            found = [root]
            for line in cfg.read_text(errors="replace").splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    found.append(Path(value.strip()).resolve().parent)
            return found
    return []


def _install_root(path: Path) -> list[Path]:
    """What an executable needs of the host: its node_modules tree, its virtual environment, or itself."""
    found = [path]
    real = path.resolve()
    for p in (path, real):
        parts = p.parts
        if "node_modules" in parts:
            found.append(Path(*parts[: parts.index("node_modules") + 1]))
        found += _venv(p)
    if real != path:
        found.append(real)
    return found


def allowed_paths(python: str, command: list[str], env: dict[str, str], spec: SandboxSpec) -> list[Path]:
    """The host paths a sandbox binds read-only besides the system folders: the bridge and the Python that
    runs it, the harness's install (its command found on PATH, the command's absolute file arguments, the
    PATH folders and the trees they link into), and `--ro-bind` extras. The home folder of the user who
    started rollout and "/" are never bound whole."""
    wanted: list[Path] = [Path(sys.prefix), Path(sys.base_prefix).resolve()]
    if spec.socket_dir is not None:
        wanted.append(BRIDGE_PATH)
    wanted += _install_root(Path(python))
    search = env.get("PATH", os.defpath)
    for entry in search.split(os.pathsep):
        if entry.startswith("/") and os.path.isdir(entry):
            folder = Path(entry)
            wanted.append(folder)
            wanted += _venv(folder / "python")
            if folder.name == ".bin" and folder.parent.name == "node_modules":
                wanted.append(folder.parent)
            if folder.name == "shims":  # pyenv's (and its plugins'): the shims run its libexec/pyenv
                wanted += [p for p in folder.parents if (p / "libexec").is_dir()][:1]
    if command:
        found = shutil.which(command[0], path=search) if "/" not in command[0] else command[0]
        if found and os.path.isabs(found):
            wanted += _install_root(Path(found))
    wanted += [Path(a) for a in command[1:] if a.startswith("/") and os.path.exists(a)]
    wanted += spec.ro_binds
    home = Path(os.path.expanduser("~")).resolve()
    never = {Path("/"), home, *home.parents}
    chosen: list[Path] = []
    for path in sorted({Path(os.path.abspath(p)) for p in wanted}, key=lambda p: (len(p.parts), str(p))):
        if path in never or not path.exists() or _covered(path, chosen):
            continue
        chosen.append(path)
    return chosen


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
        args += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        args += spec.limits.engine_flags("docker") if spec.limits else []
        user = spec.uid if spec.uid is not None else os.getuid()
        args += ["--user", f"{user}:{spec.uid if spec.uid is not None else os.getgid()}"]
        args += ["--workdir", C_WORKSPACE]
        args += ["-v", f"{spec.workspace}:{C_WORKSPACE}", "-v", f"{spec.home}:{C_HOME}"]
        if spec.socket_dir is not None:
            args += ["-v", f"{spec.socket_dir}:{C_SOCKET_DIR}:ro", "-v", f"{BRIDGE_PATH}:{C_BRIDGE}:ro"]
        for name in sorted(env):  # values come from the client's environment: never on the command line
            args += ["-e", name]
        args.append(spec.image)
        if spec.socket_dir is None:
            return args + list(command)
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
        args += ["--no-privs", *(spec.limits.engine_flags("apptainer") if spec.limits else [])]
        args += ["--home", f"{spec.home}:{C_HOME}", "--pwd", C_WORKSPACE]
        args += ["--bind", f"{spec.workspace}:{C_WORKSPACE}"]
        if spec.socket_dir is None:
            return [*args, spec.image, *command]
        args += ["--bind", f"{spec.socket_dir}:{C_SOCKET_DIR}:ro", "--bind", f"{BRIDGE_PATH}:{C_BRIDGE}:ro"]
        args.append(spec.image)
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
    """The runner named `name`, probed; None: bwrap, or SandboxError saying why it does not work here (never a
    silent fall back to none). Raises SandboxError."""
    if name is None:
        runner = BwrapRunner()
        why = runner.probe()
        if why is not None:
            raise SandboxError(
                f"No sandbox for the episodes: {why}.",
                hint="Install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap), or pass "
                "--isolation none to run the agents unsandboxed on purpose (they then reach the host).",
            )
        return runner
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
    limit_hit: str | None = None  # the per-episode limit it ran into (limits.py), named as its option


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
    limits: Limits | None = None,
) -> ProcessResult:
    """Run argv in a session of its own; at the timeout, or when `cancel` is set, kill its whole process
    group (SIGTERM, then SIGKILL). Output goes to `log` (its tail is returned). With `limits`, it runs in a
    cgroup of its own (where one can be made) holding the process and memory totals."""
    group = EpisodeCgroup.make(limits) if limits is not None else None
    try:
        result = _run_process(
            argv if group is None else group.wrap(argv), cwd, env, stdin, timeout_s, cancel, log
        )
        if group is not None:
            result.limit_hit = group.hit()
        return result
    finally:
        if group is not None:
            group.remove()


def _run_process(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    stdin: bytes,
    timeout_s: float | None,
    cancel: threading.Event | None,
    log: Path | None,
) -> ProcessResult:
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
