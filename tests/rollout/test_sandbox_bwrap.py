"""From inside the bwrap sandbox of `rollout --isolation bwrap`: the harness reaches the gateway and
nothing else on the host's loopback, cannot read the hidden tests or the store, cannot write outside its
workspace, and has a fresh HOME. In CI these fail, rather than skip, without a working bwrap."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from rollout_support import EXAMPLE, REPO, bwrap_or_skip, rollout_argv

HERE = Path(__file__).resolve().parent


def test_sandboxed_harness_reaches_only_the_gateway_and_its_workspace(
    stub_backend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    bwrap_or_skip()
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    hidden_test = EXAMPLE / "tasks" / "greet" / "tests" / "check_greeting.py"
    db, work, outside = tmp_path / "r.db", tmp_path / "work", REPO / ".cache" / f"outside-{os.getpid()}.txt"
    home_secret = Path.home() / f".polarproxy-probe-secret-{os.getpid()}"  # the host user's own files
    home_secret.write_text("host secret\n")
    elsewhere = tmp_path / "elsewhere"  # beside the episodes' folder: another task's files
    elsewhere.mkdir()
    outside.parent.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PROBE_HIDDEN": os.pathsep.join([str(hidden_test), str(db)]),
        "PROBE_OUTSIDE": str(outside),
        "PROBE_PORTS": f"{stub_backend.port},{listener.getsockname()[1]}",
        "PROBE_ABSENT": os.pathsep.join(
            [str(db), str(elsewhere), str(REPO / ".git"), "/run", str(home_secret)]
        ),
        "HF_TOKEN": "hf_host_secret",  # the host's secrets: never passed unless named with --pass-env
        "AWS_SECRET_ACCESS_KEY": "aws_host_secret",
        "POLARPROXY_CONTROL_TOKEN": "host-control-token",
    }
    args = [str(EXAMPLE / "tasks.jsonl"), "--backend", stub_backend.url, "--model", str(tiny_model_dir)]
    args += ["--db", str(db), "--isolation", "bwrap", "--workdir", str(work), "--json"]
    args += ["--pass-env", "PROBE_HIDDEN", "--pass-env", "PROBE_OUTSIDE", "--pass-env", "PROBE_PORTS"]
    args += ["--pass-env", "PROBE_ABSENT"]
    args += ["--", sys.executable, str(HERE / "probe_agent.py")]
    try:
        proc = subprocess.run(
            rollout_argv(*args), capture_output=True, text=True, timeout=120, env=env, cwd=REPO
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout)
        assert summary["isolation"] == "bwrap"
        probe = json.loads((work / "greet" / "0" / "workspace" / "probe.json").read_text())
        assert probe["model_status"] == 200 and probe["reached_gateway"], probe
        assert probe["reached"] == {str(stub_backend.port): False, str(listener.getsockname()[1]): False}
        assert accepted == []
        assert probe["read_hidden"] == {str(hidden_test): None, str(db): None}, probe["read_hidden"]
        assert probe["wrote_workspace"] and not probe["wrote_outside"]
        assert not outside.exists()
        assert probe["cwd"] == str(work / "greet" / "0" / "workspace")
        assert probe["home"] == str(work / "greet" / "0" / "home") and probe["home_entries"] == ["tmp"]
        assert probe["instruction"].startswith("Write a short greeting")
        # the attacker's routes: none of them is there
        assert not probe["remount_rw"] and not probe["umount_tmp"], probe
        assert int(probe["cap_eff"], 16) == 0
        assert not probe["read_shadow"]
        assert probe["seen"] == {p: False for p in env["PROBE_ABSENT"].split(os.pathsep)}
        assert not {"HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "POLARPROXY_CONTROL_TOKEN", "POLARPROXY_DB"} & set(
            probe["env_names"]
        )
        assert {"PROBE_HIDDEN", "PATH", "HOME", "OPENAI_API_KEY"} <= set(probe["env_names"])
        assert (
            set(summary["env_passed"]) >= {"PATH", "PROBE_HIDDEN"} and "HF_TOKEN" not in summary["env_passed"]
        )
        assert probe["self_reward_status"] == 403
        if os.geteuid() == 0:  # started by root (as CI runs it): a host user of its own, not root
            assert probe["uid"] >= 400_000
        # the verifier saw the hidden tests and the harness's answer: greet is solved, shout is not
        assert summary["tasks"]["greet"]["rewards"] == [1.0]
        assert summary["tasks"]["shout"]["rewards"] == [0.0]
    finally:
        listener.close()
        outside.unlink(missing_ok=True)
        home_secret.unlink(missing_ok=True)
