"""Per-episode limits: processes, memory, file size and CPU time (`rollout --max-procs N --max-memory SIZE
--max-file-size SIZE --max-cpu-seconds N`).

Totals are held by a cgroup of the episode's own (cgroup v1's `pids` and `memory` controllers, or v2's
unified tree), created under this process's own cgroup, joined by a tiny shell before the sandbox starts,
so everything the harness starts counts. rlimits are the backstop inside the sandbox (`prlimit`, before
the sandbox drops to the episode's user): `RLIMIT_NPROC` (per user: each episode has a user of its own
when rollout runs as root), `RLIMIT_FSIZE` and `RLIMIT_CPU`. A process over a limit is refused (a fork, a
write) or killed (memory, CPU), and the episode's reason names the limit (`hit`).

Where cgroups cannot be made (not root, no controllers) the rlimits alone apply, and `Limits.cgroup` says so.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
DEFAULT_MAX_PROCS = 512
DEFAULT_MAX_MEMORY = 8 << 30
DEFAULT_MAX_FILE_SIZE = 4 << 30


@dataclass(frozen=True, slots=True)
class Limits:
    """What one episode may use; None: no limit. The defaults are documented in docs/rollout.md."""

    max_procs: int | None = DEFAULT_MAX_PROCS
    max_memory: int | None = DEFAULT_MAX_MEMORY  # bytes, all of the episode's processes together
    max_file_size: int | None = DEFAULT_MAX_FILE_SIZE  # bytes, per file
    max_cpu_seconds: int | None = None  # per process

    def engine_flags(self, engine: str) -> list[str]:
        """The same limits as a container engine's own flags (the engine's cgroup holds the container, not
        rollout's): Docker's `--pids-limit`, `--memory`, `--ulimit fsize/cpu`; Apptainer's `--pids-limit`
        and `--memory` (its cgroups support; no rlimit flags)."""
        args = []
        if self.max_procs:
            args += ["--pids-limit", str(self.max_procs)]
        if self.max_memory:
            args += ["--memory", str(self.max_memory)]
        if engine == "docker":
            if self.max_file_size:
                args += ["--ulimit", f"fsize={self.max_file_size}:{self.max_file_size}"]
            if self.max_cpu_seconds:
                args += ["--ulimit", f"cpu={self.max_cpu_seconds}:{self.max_cpu_seconds}"]
        return args

    def prlimit(self) -> list[str]:
        """`prlimit --nproc=N:N ... --`: the rlimits, set before the sandbox drops to the episode's user."""
        args = []
        if self.max_procs:
            args.append(f"--nproc={self.max_procs}:{self.max_procs}")
        if self.max_file_size:
            args.append(f"--fsize={self.max_file_size}:{self.max_file_size}")
        if self.max_cpu_seconds:
            args.append(f"--cpu={self.max_cpu_seconds}:{self.max_cpu_seconds}")
        return ["prlimit", *args, "--"] if args else []


def _own_cgroup(controller: str) -> str:
    """This process's cgroup path in `controller` (v1) or in the unified tree (controller "")."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller and controller in names.split(",")) or (not controller and names == ""):
            return path
    return "/"


@dataclass
class EpisodeCgroup:
    """The cgroup(s) of one episode's processes: made, joined through `wrap`, read, and removed."""

    limits: Limits
    dirs: dict[str, Path] = field(default_factory=dict)  # controller ("" for v2) -> folder

    @classmethod
    def make(cls, limits: Limits) -> EpisodeCgroup | None:
        """The episode's cgroup with its limits written, or None where cgroups cannot be made here."""
        if not (limits.max_procs or limits.max_memory) or os.geteuid() != 0:
            return None
        name = f"polarproxy-{secrets.token_hex(6)}"
        group = cls(limits)
        try:
            if (CGROUP_ROOT / "cgroup.controllers").is_file():  # v2: one tree
                folder = CGROUP_ROOT / _own_cgroup("").lstrip("/") / name
                folder.mkdir()
                group.dirs[""] = folder
                if limits.max_procs:
                    (folder / "pids.max").write_text(str(limits.max_procs))
                if limits.max_memory:
                    (folder / "memory.max").write_text(str(limits.max_memory))
                    with contextlib.suppress(OSError):
                        (folder / "memory.swap.max").write_text("0")
            else:
                for controller, value, knob in (
                    ("pids", limits.max_procs, "pids.max"),
                    ("memory", limits.max_memory, "memory.limit_in_bytes"),
                ):
                    if not value or not (CGROUP_ROOT / controller).is_dir():
                        continue
                    folder = CGROUP_ROOT / controller / _own_cgroup(controller).lstrip("/") / name
                    folder.mkdir()
                    group.dirs[controller] = folder
                    (folder / knob).write_text(str(value))
                    if controller == "memory":
                        with contextlib.suppress(OSError):  # no swap to escape into
                            (folder / "memory.memsw.limit_in_bytes").write_text(str(value))
        except OSError:
            group.remove()
            return None
        return group if group.dirs else None

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` started by a shell that first joins the cgroup(s): all it starts counts."""
        joins = " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self.dirs.values())
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *argv]

    def hit(self) -> str | None:
        """Which limit the episode's processes ran into, named as the option that sets it; None: none."""
        for controller, folder in self.dirs.items():
            if controller in ("", "pids") and _count(folder / "pids.events", "max"):
                return f"--max-procs {self.limits.max_procs}: a process could not be started"
            if controller == "" and _count(folder / "memory.events", "oom_kill"):
                return f"--max-memory {self.limits.max_memory} bytes: a process was killed for memory"
            if controller == "memory" and _count(folder / "memory.oom_control", "oom_kill"):
                return f"--max-memory {self.limits.max_memory} bytes: the episode ran out of memory"
        return None

    def remove(self) -> None:
        """Kill whatever is left in the cgroup (a process that left the session), then remove it."""
        for folder in self.dirs.values():
            for _ in range(50):
                try:
                    pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                except (OSError, ValueError):
                    break
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)
            with contextlib.suppress(OSError):
                folder.rmdir()


def _count(path: Path, key: str) -> int:
    """The value of `key` in a flat-keyed cgroup file (`max 3`, `oom_kill 1`)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
