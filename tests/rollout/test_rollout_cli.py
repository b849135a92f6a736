"""`polarproxy rollout` end to end: real subprocesses, the in-process gateway, a stub backend on loopback,
the example agent and the example tasks' hidden-test verifiers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rollout_support import AGENT, EXAMPLE, REPO, rollout_argv, run_rollout

from polarproxy.rollout.run import FINISHED
from polarproxy.store.store import Store


def _args(stub_url: str, model: Path, db: Path, *more: str) -> list[str]:
    return [
        str(EXAMPLE / "tasks.jsonl"),
        "--backend",
        stub_url,
        "--model",
        str(model),
        "--db",
        str(db),
        "--isolation",
        "none",
        "--json",
        *more,
        "--",
        sys.executable,
        str(AGENT),
    ]


def test_sixteen_episodes_at_concurrency_eight_complete_with_rewards_and_groups(
    stub_backend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "r.db"
    proc = run_rollout(*_args(stub_backend.url, tiny_model_dir, db, "--samples", "8", "--concurrency", "8"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["states"] == {"done": 16}, summary["states"]
    # the stub answers "Hello there.": greet's hidden test passes, shout's fails
    assert summary["tasks"]["greet"]["rewards"] == [1.0] * 8
    assert summary["tasks"]["shout"]["rewards"] == [0.0] * 8
    assert all(e["trajectories"] == 1 for e in summary["episodes"])
    store = Store.open(str(db))
    try:
        everything = store.list_episodes(limit=None)
        assert all(e.task for e in everything), "the rollout left an episode of no task"
        eps = [e for e in everything if e.metadata.get("rollout_id") == summary["rollout_id"]]
        assert len(eps) == 16
        groups = {e.group_id for e in eps}
        assert groups == {f"{summary['rollout_id']}:greet", f"{summary['rollout_id']}:shout"}
        assert sorted((e.task, int(e.metadata["sample"])) for e in eps) == sorted(
            (t, i) for t in ("greet", "shout") for i in range(8)
        )
        for e in eps:
            assert e.status == "ok" and e.calls == 1, (e.status, e.calls)
            assert e.reward == (1.0 if e.task == "greet" else 0.0)
            assert e.metadata["difficulty"] in ("easy", "hard")
    finally:
        store.close()
    assert summary["stage_times"]["execute"]["n"] == 16
    assert set(summary["queue_times"]) == {"prewarm", "execute", "evaluate", "reconstruct"}


def _finished(db: Path, rollout_id: str) -> dict[tuple[str, int], tuple[str, float]]:
    """(task, sample) -> (episode id, reward) of the episodes of the rollout that finished: ran to their end
    and got a reward, the rule `--resume` skips by (rollout/run.py). A kill between the verifier's reward
    and the episode's finish leaves one rewarded but still running: not finished, so it is run again."""
    if not db.exists():
        return {}
    store = Store.open(str(db))
    try:
        return {
            (e.task, int(e.metadata["sample"])): (e.id, e.reward)
            for e in store.list_episodes(limit=None)
            if e.task
            and e.metadata.get("rollout_id") == rollout_id
            and e.reward is not None
            and e.status in FINISHED
        }
    finally:
        store.close()


def test_killed_rollout_loses_no_finished_episode_and_resume_runs_only_the_unfinished(
    make_stub_backend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    stub = make_stub_backend(per_token_ms=60.0)  # each episode takes most of a second
    db, rid = tmp_path / "r.db", "ro_kill_test"
    args = _args(stub.url, tiny_model_dir, db, "--samples", "8", "--concurrency", "2", "--rollout-id", rid)
    proc = subprocess.Popen(rollout_argv(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    before: dict = {}
    while time.monotonic() < deadline and len(before) < 3:
        time.sleep(0.2)
        before = _finished(db, rid)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    before = _finished(db, rid)
    assert 3 <= len(before) < 16, before
    resumed = run_rollout(*_resume_args(args), timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout)
    skipped = {(e["task"], e["sample"]) for e in summary["episodes"] if e["state"] == "skipped"}
    rerun = {(e["task"], e["sample"]) for e in summary["episodes"] if e["state"] == "done"}
    assert skipped == set(before)  # every episode finished before the kill is kept, none is re-run
    assert rerun == {(t, i) for t in ("greet", "shout") for i in range(8)} - set(before)
    after = _finished(db, rid)
    assert len(after) == 16
    for key, (eid, reward) in before.items():
        assert after[key] == (eid, reward)  # the same episode, untouched


def _resume_args(args: list[str]) -> list[str]:
    i = args.index("--")
    return [*args[:i], "--resume", *args[i:]]


def _cli(*args: str):
    import typer
    from typer.testing import CliRunner

    from polarproxy.commands.rollout import rollout

    app = typer.Typer()
    app.command()(rollout)
    app.command("other")(lambda: None)  # two commands: `rollout` is a subcommand, as in the real app
    return CliRunner().invoke(app, ["rollout", *args])


def test_rollout_without_harness_or_command_is_a_usage_error() -> None:
    result = _cli(str(EXAMPLE / "tasks.jsonl"))
    assert result.exit_code == 2
    assert "Error: Give either --harness NAME or an agent command after --." in result.output


def test_harness_arg_goes_with_a_preset_not_with_an_own_command() -> None:
    result = _cli(str(EXAMPLE / "tasks.jsonl"), "--harness-arg=--sandbox", "--", "true")
    assert result.exit_code == 2 and "--harness-arg adds to a --harness preset's command" in result.output


def test_rollout_with_a_bad_tasks_file_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"id": "x"}\n')
    result = _cli(str(bad), "--isolation", "none", "--", "true")
    assert result.exit_code == 1
    assert f"Error: {bad}:1: field 'instruction' is missing" in result.output


def test_min_samples_above_samples_is_a_usage_error() -> None:
    result = _cli(str(EXAMPLE / "tasks.jsonl"), "--samples", "2", "--min-samples", "3", "--", "true")
    assert result.exit_code == 2 and "--min-samples 3 must be between 1 and --samples (2)" in result.output


def test_serve_and_a_typed_store_or_backend_exclude_each_other(tmp_path: Path) -> None:
    for typed in (["--db", str(tmp_path / "x.db")], ["--backend", "http://127.0.0.1:9"]):
        args = [str(EXAMPLE / "tasks.jsonl"), "--serve", "http://127.0.0.1:9", *typed, "--", "true"]
        result = _cli(*args)
        assert result.exit_code == 2, result.output
        assert "--serve and --backend/--model/--db exclude each other" in result.output


def test_rollout_against_a_running_serve_through_its_control_api(
    stub_backend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    db, token = tmp_path / "serve.db", "test-control-token-123"
    argv = [
        sys.executable,
        "-m",
        "polarproxy",
        "serve",
        "--backend",
        stub_backend.url,
        "--model",
        str(tiny_model_dir),
    ]
    argv += ["--db", str(db), "--port", "0", "--json", "--control-token", token]
    serve = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert serve.stdout is not None
        ready = ""
        while not ready.endswith("}\n"):  # the ready line: one JSON object (printed indented)
            line = serve.stdout.readline()
            assert line, serve.stderr.read() if serve.stderr else ""
            ready += line
        url = json.loads(ready)["url"]
        env_args = [str(EXAMPLE / "tasks.jsonl"), "--serve", url, "--isolation", "none", "--samples", "2"]
        # travels with each episode (its `sampling`) to the serve; override: the agent sends 1.0 itself
        env_args += ["--temperature", "0.7", "--sampling-policy", "override"]
        proc = subprocess.run(
            rollout_argv(*env_args, "--json", "--", sys.executable, str(AGENT)),
            capture_output=True,
            text=True,
            timeout=120,
            env={  # a user's exported defaults for record/serve do not clash with --serve: only typed flags do
                **os.environ,
                "POLARPROXY_CONTROL_TOKEN": token,
                "POLARPROXY_DB": str(tmp_path / "mine.db"),
                "POLARPROXY_BACKEND": "http://127.0.0.1:9",
                "POLARPROXY_MODEL": str(tiny_model_dir),
                "POLARPROXY_BACKEND_LOGPROBS": "raw",
            },
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout)
        assert summary["db"] is None and summary["serve"] == url  # its store is the serve's, not named here
        assert summary["tasks"]["greet"]["rewards"] == [1.0, 1.0]
        assert summary["tasks"]["shout"]["rewards"] == [0.0, 0.0]
        assert token not in proc.stdout + proc.stderr
    finally:
        serve.terminate()
        serve.communicate(timeout=30)
    store = Store.open(str(db))
    try:
        eps = [e for e in store.list_episodes(limit=None) if e.task]
        assert len(eps) == 4 and all(e.status == "ok" and e.calls == 1 for e in eps)
        calls = [c for e in eps for c in store.list_calls(e.id)]
        assert [c.temperature for c in calls] == [0.7] * 4
        assert {c.conversation["sent_sampling"]["chosen_by"]["temperature"] for c in calls} == {"episode"}
        assert {e.group_id for e in eps} == {
            f"{summary['rollout_id']}:greet",
            f"{summary['rollout_id']}:shout",
        }
    finally:
        store.close()


def test_the_readme_agent_path_relative_to_the_checkout_runs_in_every_workspace(
    stub_backend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`rollout ... -- python examples/rollout/agent.py` from the repository root, as the README writes it:
    the path names the checkout's file, not one in each workspace copy (where every episode used to exit 2
    with no call)."""
    args = _args(stub_backend.url, tiny_model_dir, tmp_path / "r.db")
    args[-1] = "examples/rollout/agent.py"
    proc = run_rollout(*args, timeout=300)  # in the repository root
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["states"] == {"done": 2} and summary["tasks"]["greet"]["rewards"] == [1.0]
    assert summary["db"].endswith(str(tmp_path / "r.db"))  # the store, not the gateway's URL
    with Store.open(str(tmp_path / "r.db")) as store:  # each episode shows the agent's command, not `serve`
        eps = [e for e in store.list_episodes(limit=None) if e.task]
    assert {tuple(e.command) for e in eps} == {(sys.executable, str(AGENT))}
    # the model folder goes with every episode, so `audit` re-renders a rollout's calls without --model
    assert {e.metadata.get("model_dir") for e in eps} == {str(tiny_model_dir.resolve())}


def test_repeated_harness_runs_every_task_under_each_into_one_store_and_compare_reads_them(
    stub_backend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`--harness codex --harness claude`: one rollout, a run per harness into one store, a group per task
    and harness, each episode's harness recorded; `polarproxy compare --rollout ID` sets them side by side.
    Stand-in CLIs on PATH (codex answers the greeting, claude writes nothing) keep it fast."""
    import os
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("codex", "echo 'Hello there.' > answer.txt"), ("claude", "true")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    db = tmp_path / "r.db"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    argv = [
        sys.executable,
        "-m",
        "polarproxy",
        "rollout",
        str(EXAMPLE / "tasks.jsonl"),
        "--isolation",
        "none",
    ]
    argv += ["--harness", "codex", "--harness", "claude", "--samples", "2", "--json"]
    argv += ["--backend", stub_backend.url, "--model", str(tiny_model_dir), "--db", str(db)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    rid = summary["rollout_id"]
    assert set(summary["harnesses"]) == {"codex", "claude"} and summary["states"] == {"done": 8}
    groups = {(e["harness"], e["group"]) for e in summary["episodes"]}
    assert groups == {(h, f"{rid}:{t}:{h}") for h in ("codex", "claude") for t in ("greet", "shout")}
    res = subprocess.run(
        [sys.executable, "-m", "polarproxy", "compare", "--db", str(db), "--rollout", rid, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    report = json.loads(res.stdout)
    assert report["harnesses"]["codex"]["resolved"] == 2 and report["harnesses"]["claude"]["resolved"] == 0
    assert report["harnesses"]["codex"]["episodes"] == 4 and report["tasks"]["greet"] == ["codex"]
    # the same rollout ID again is refused per harness, as for one harness
    again = subprocess.run(
        [*argv, "--rollout-id", rid], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )
    assert again.returncode != 0 and "already has episodes" in again.stderr
