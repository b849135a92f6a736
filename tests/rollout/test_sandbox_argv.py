"""The command lines the runners build (Docker and Apptainer engines do not run here: their lines are
checked as built, and their probes ask the engine, not the client), and the process runner's limits."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from polarproxy.rollout.sandbox import (
    BRIDGE_PATH,
    ApptainerRunner,
    BwrapRunner,
    DockerRunner,
    SandboxError,
    SandboxSpec,
    get_runner,
    run_process,
)


def _spec(tmp_path: Path, **kw) -> SandboxSpec:
    for name in ("ws", "home", "sock", "hidden"):
        (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / "store.db").write_text("")
    return SandboxSpec(
        workspace=tmp_path / "ws",
        home=tmp_path / "home",
        socket_dir=tmp_path / "sock",
        gateway_port=8123,
        hidden=[tmp_path / "hidden", tmp_path / "store.db"],
        **kw,
    )


def test_docker_line_has_no_network_mounts_the_bridge_and_passes_env_by_name(tmp_path: Path) -> None:
    spec = _spec(tmp_path, image="python:3.12-slim")
    env = {"OPENAI_API_KEY": "sk-secret", "HOME": str(spec.home), "CODEX_HOME": f"{spec.home}/.codex"}
    argv = DockerRunner().argv(["agent", "--go"], spec, env)
    line = " ".join(argv)
    assert argv[:3] == ["docker", "run", "--rm"] and "--network none" in line
    assert "--cap-drop ALL" in line and "--security-opt no-new-privileges" in line
    assert f"-v {spec.workspace}:/workspace" in line and f"-v {spec.home}:/home/agent" in line
    assert (
        f"-v {spec.socket_dir}:/run/polarproxy:ro" in line
        and f"-v {BRIDGE_PATH}:/opt/polarproxy/bridge.py:ro" in line
    )
    assert "sk-secret" not in line  # values travel in the client's environment, not on the command line
    assert "-e OPENAI_API_KEY" in line
    i = argv.index("python:3.12-slim")
    assert argv[i + 1 :] == [
        "python3", "-I", "/opt/polarproxy/bridge.py", "--socket", "/run/polarproxy/gateway.sock",
        "--port", "8123", "--", "agent", "--go",
    ]  # fmt: skip
    inner = DockerRunner().env(env, spec)
    assert inner["HOME"] == "/home/agent" and inner["CODEX_HOME"] == "/home/agent/.codex"


def test_apptainer_line_contains_everything_and_passes_env_as_apptainerenv(tmp_path: Path) -> None:
    spec = _spec(tmp_path, image="agent.sif")
    argv = ApptainerRunner().argv(["agent"], spec, {})
    line = " ".join(argv)
    assert argv[:3] == ["apptainer", "exec", "--containall"] and "--net --network none" in line
    assert "--no-privs" in argv
    assert f"--home {spec.home}:/home/agent" in line and f"--bind {spec.workspace}:/workspace" in line
    assert "--pwd /workspace" in line and argv[argv.index("agent.sif") + 1] == "python3"
    inner = ApptainerRunner().env({"OPENAI_BASE_URL": "http://127.0.0.1:8123/v1", "HOME": "x"}, spec)
    assert inner["APPTAINERENV_OPENAI_BASE_URL"] == "http://127.0.0.1:8123/v1"
    assert "APPTAINERENV_HOME" not in inner


def test_container_engines_get_the_episode_limits_as_their_own_flags(tmp_path: Path) -> None:
    """The engine's cgroup holds a container, not rollout's: the limits go on its command line."""
    from polarproxy.rollout.limits import Limits

    limits = Limits(max_procs=32, max_memory=256 << 20, max_file_size=1 << 20, max_cpu_seconds=60)
    docker = " ".join(DockerRunner().argv(["agent"], _spec(tmp_path, image="img", limits=limits), {}))
    assert "--pids-limit 32" in docker and f"--memory {256 << 20}" in docker
    assert f"--ulimit fsize={1 << 20}:{1 << 20}" in docker and "--ulimit cpu=60:60" in docker
    apptainer = " ".join(ApptainerRunner().argv(["agent"], _spec(tmp_path, image="a.sif", limits=limits), {}))
    assert (
        "--pids-limit 32" in apptainer
        and f"--memory {256 << 20}" in apptainer
        and "--ulimit" not in apptainer
    )
    none = " ".join(
        DockerRunner().argv(
            ["agent"], _spec(tmp_path, image="img", limits=Limits(None, None, None, None)), {}
        )
    )
    assert "--pids-limit" not in none and "--memory" not in none


def test_container_runners_need_an_image(tmp_path: Path) -> None:
    for runner in (DockerRunner(), ApptainerRunner()):
        with pytest.raises(SandboxError, match="needs an image"):
            runner.argv(["agent"], _spec(tmp_path), {})


def test_bwrap_line_builds_the_root_from_an_allow_list_and_binds_only_workspace_and_home_writable(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path)
    argv = BwrapRunner(python="/usr/bin/python3").argv(["agent"], spec, {"PATH": "/usr/bin"})
    line = " ".join(argv)
    assert "--unshare-net" in argv and "--die-with-parent" in argv and "--cap-drop ALL" in line
    assert "--ro-bind / /" not in line  # nothing of the host but what is listed
    assert str(tmp_path / "store.db") not in line and str(tmp_path / "hidden") not in line  # not there at all
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
    assert binds == [str(spec.workspace), str(spec.home)]  # the only writable host paths
    ro = {argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"}
    assert str(spec.socket_dir) in ro and str(BRIDGE_PATH) in ro and "/usr" in ro
    home = os.path.expanduser("~")
    assert home not in ro and "/" not in ro and "/run" not in ro and "/tmp" not in ro
    assert argv[argv.index("--") + 1 :][:3] == ["/usr/bin/python3", "-I", str(BRIDGE_PATH)]


def test_a_hidden_path_inside_a_bound_folder_is_covered(tmp_path: Path) -> None:
    spec = _spec(tmp_path, ro_binds=[tmp_path])  # `--ro-bind` of a folder that holds the store
    line = " ".join(BwrapRunner(python="/usr/bin/python3").argv(["agent"], spec, {}))
    assert f"--ro-bind /dev/null {tmp_path / 'store.db'}" in line and f"--tmpfs {tmp_path / 'hidden'}" in line


def test_bwrap_started_by_root_runs_the_harness_as_the_episodes_user_without_capabilities(
    tmp_path: Path,
) -> None:
    from polarproxy.rollout.limits import Limits

    limits = Limits(max_procs=32, max_memory=256 << 20, max_file_size=1 << 20, max_cpu_seconds=60)
    argv = BwrapRunner(python="/usr/bin/python3").argv(
        ["agent"], _spec(tmp_path, uid=400123, limits=limits), {}
    )
    after = argv[argv.index("--") + 1 :]
    # the rlimits are set while still privileged (the episode's user could not raise them), then the drop
    assert after[:5] == ["prlimit", "--nproc=32:32", "--fsize=1048576:1048576", "--cpu=60:60", "--"]
    after = after[5:]
    assert after[:6] == ["setpriv", "--reuid", "400123", "--regid", "400123", "--clear-groups"]
    assert "--bounding-set=-all" in after and "--no-new-privs" in after and "--inh-caps=-all" in after
    caps = [argv[i + 1] for i, a in enumerate(argv[: argv.index("--")]) if a in ("--cap-add", "--cap-drop")]
    assert caps == ["ALL", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]  # only what setpriv needs, then none


def test_setup_and_verify_sandboxes_have_no_bridge(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec.socket_dir = None
    argv = BwrapRunner(python="/usr/bin/python3").argv(["/bin/sh", "-c", "make"], spec, {})
    assert argv[argv.index("--") + 1 :] == ["/bin/sh", "-c", "make"] and str(BRIDGE_PATH) not in argv


def _fake_engine(tmp_path: Path, rc: int) -> str:
    path = tmp_path / "engine"
    path.write_text(f"#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit {rc}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_docker_probe_asks_the_engine_not_the_client(tmp_path: Path) -> None:
    why = DockerRunner(binary=_fake_engine(tmp_path, 1)).probe()
    assert why is not None and "Cannot connect to the Docker daemon" in why
    assert DockerRunner(binary=_fake_engine(tmp_path, 0)).probe() is None


def test_unknown_isolation_names_the_choices() -> None:
    with pytest.raises(SandboxError, match="Unknown isolation 'chroot'") as e:
        get_runner("chroot")
    assert "none, bwrap, docker, apptainer" in (e.value.hint or "")


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    result = run_process(
        ["/bin/sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"],
        cwd=tmp_path,
        env=dict(os.environ),
        timeout_s=0.5,
        log=tmp_path / "log",
    )
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - t0 < 10
    grandchild = int(pidfile.read_text())
    for _ in range(50):
        if (
            not Path(f"/proc/{grandchild}").exists()
            or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
        ):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the harness's child {grandchild} outlived the timeout")


def test_each_episode_gets_a_bridge_of_its_own_bound_into_its_sandbox_alone(tmp_path: Path) -> None:
    """One socket per episode, in a folder of its own: an agent cannot reach, rename or replace another
    episode's bridge (nor relay it to read that episode's key)."""
    from types import SimpleNamespace

    from polarproxy.rollout.stages import episode_bridge

    s = SimpleNamespace(runner=BwrapRunner(), episodes=SimpleNamespace(port=9))
    specs, relays = [], []
    for sample in (0, 1):
        job = SimpleNamespace(task=SimpleNamespace(id="t"), sample=sample)
        spec = _spec(tmp_path)
        relays.append(episode_bridge(job, s, spec, f"ppk_{sample}"))  # type: ignore[arg-type]
        specs.append(spec)
    try:
        a, b = (spec.socket_dir for spec in specs)
        assert a != b and a.parent == b.parent == tmp_path / "sock"
        assert (a / "gateway.sock").is_socket() and len(str(a / "gateway.sock")) < 107
        line = " ".join(BwrapRunner(python="/usr/bin/python3").argv(["agent"], specs[0], {}))
        assert f"--ro-bind {a} {a}" in line and str(b) not in line and f"--ro-bind {a.parent} " not in line
    finally:
        for relay in relays:
            relay.close()
