"""Agents as adversaries, under `rollout --isolation bwrap` run as CI runs it (root): each task is one
attack on the reward or the host, made after a real model call. None of them pays: a reward set with the
episode's own key is refused, a FIFO or a link out of the workspace is not copied for grading, the code a
verifier imports sees none of the host, and a process it leaves behind does not hold the grader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rollout_support import REPO, bwrap_or_skip, rollout_argv

from polarproxy.store.store import Store

HERE = Path(__file__).resolve().parent
VERIFY = "python3 -c \"import sys; t=open('answer.txt').read(); print(t); sys.exit(0 if t.startswith('Hello') else 1)\""


def _task(root: Path, task_id: str, verify: str, setup: list[str] | None = None) -> dict:
    ws = root / task_id / "workspace"
    ws.mkdir(parents=True)
    (ws / "README.md").write_text(f"task {task_id}\n")
    row = {"id": task_id, "instruction": task_id, "workspace": str(ws), "verify": verify, "timeout_s": 120}
    if setup:
        row["setup"] = setup
    return row


def test_hostile_agents_get_no_reward_and_reach_nothing_of_the_host(stub_backend, tiny_model_dir, tmp_path):
    bwrap_or_skip()
    secret = tmp_path / "host-secret.txt"
    secret.write_text("Hello from the host: token=hf_abcdef1234567890\n")  # would pass the verifier if read
    db = tmp_path / "r.db"
    absent = [str(db), str(secret), str(tmp_path / "tasks"), "/run"]
    tasks = tmp_path / "tasks"
    rows = [
        _task(tasks, "self-reward", VERIFY),
        _task(tasks, "link-out", VERIFY),
        _task(tasks, "import", "python3 -c 'import solution'"),
        # a setup command runs repository code: sandboxed too, it sees nothing of the host either
        _task(tasks, "setup", "true", setup=[f"test ! -e {secret} && test ! -e {db} && test ! -e /run"]),
        _task(tasks, "fork-bomb", "true"),
        _task(tasks, "memory-bomb", "true"),
    ]
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {
        **os.environ,
        "HOST_SECRET_FILE": str(secret),
        "PROBE_ABSENT": os.pathsep.join(absent),
        "HF_TOKEN": "hf_host_secret",
    }
    args = [str(tasks_file), "--backend", stub_backend.url, "--model", str(tiny_model_dir), "--db", str(db)]
    args += ["--isolation", "bwrap", "--json", "--verify-timeout", "120", "--concurrency", "2"]
    args += ["--max-procs", "32", "--max-memory", "256M"]  # small: a regression cannot take the machine down
    args += ["--pass-env", "HOST_SECRET_FILE", "--pass-env", "PROBE_ABSENT"]
    args += ["--", sys.executable, str(HERE / "hostile_agent.py")]
    proc = subprocess.run(rollout_argv(*args), capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    summary = json.loads(proc.stdout)
    by_task = {e["task"]: e for e in summary["episodes"]}
    assert by_task["self-reward"]["reward"] == 0.0, by_task["self-reward"]
    assert "1 fifo" in by_task["self-reward"]["reward_note"]
    assert by_task["link-out"]["reward"] == 0.0 and "1 link-out" in by_task["link-out"]["reward_note"]
    assert by_task["import"]["reward"] == 1.0, by_task[
        "import"
    ]  # graded in time: the setsid child held nothing
    assert by_task["setup"]["state"] == "done", by_task["setup"]
    if os.geteuid() == 0:  # the limits are held by the episode's user and cgroup (root, as CI runs it)
        assert by_task["fork-bomb"]["limit_hit"].startswith("--max-procs 32"), by_task["fork-bomb"]
        assert by_task["memory-bomb"]["limit_hit"].startswith("--max-memory"), by_task["memory-bomb"]
        assert "--max-memory" in by_task["memory-bomb"]["reward_note"]
    with Store.open(str(db)) as store:
        eps = {e.task: e for e in store.list_episodes(limit=None) if e.task}
        assert eps["self-reward"].reward == 0.0  # not the 1.0 it posted
        (verified,) = [r for r in store.list_rewards(eps["import"].id) if r.origin.source == "command"]
    seen = json.loads(verified.origin.output_tail.strip().splitlines()[0])
    assert seen["seen"] == {p: False for p in absent}, seen  # the imported code saw nothing of the host
    if os.geteuid() == 0:
        assert seen["uid"] >= 400_000  # the verifier too runs as a user of its own, not root
    stored = b"".join(f.read_bytes() for f in tmp_path.glob("r.db*"))
    assert b"hf_abcdef1234567890" not in stored  # the host file was never read into the store
