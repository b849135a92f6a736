"""Every reward path through a real proxy: `record --reward-cmd` (exit code, stdout JSON, a timeout), the
HTTP endpoint a harness or verifier posts to, and `polarproxy reward` afterwards. Each sets what it should
and records where the reward came from."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import typer
from typer.testing import CliRunner

from polarproxy.backends.stub import StubBackend, StubConfig
from polarproxy.capture.stack import ProxyConfig
from polarproxy.commands import reward as reward_command
from polarproxy.harness.record import HarnessRun, record
from polarproxy.rewards import Verifier
from polarproxy.rewards import verifier as verifier_module
from polarproxy.store import Store

pytestmark = pytest.mark.integration

# The harness: one chat call through the proxy, then reward requests to $POLARPROXY_URL (a verifier inside
# the harness's environment does the same); it writes the answers' statuses to `statuses.json`.
HARNESS = textwrap.dedent(
    """
    import json, os, sys, httpx
    base, episode = os.environ["POLARPROXY_URL"], os.environ["POLARPROXY_EPISODE"]
    r = httpx.post(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                   json={"model": "m", "temperature": 0.8, "messages": [{"role": "user", "content": "hi"}]},
                   timeout=30)
    r.raise_for_status()
    url = f"{base}/polarproxy/v1/episodes/{episode}/reward"
    answers = {
        "call": httpx.post(url, json={"reward": 0.25, "call": 0}, timeout=30),
        "bad_body": httpx.post(url, content=b"{not json", timeout=30),
        "bad_reward": httpx.post(url, json={"reward": "high"}, timeout=30),
        "extra_key": httpx.post(url, json={"reward": 1, "why": "x"}, timeout=30),
        "no_such_call": httpx.post(url, json={"reward": 1, "call": 9}, timeout=30),
        "unknown_episode": httpx.post(f"{base}/polarproxy/v1/episodes/ep_nope/reward", json={"reward": 1}, timeout=30),
        "get": httpx.get(url, timeout=30),
        "models_still_served": httpx.get(os.environ["OPENAI_BASE_URL"] + "/models", timeout=30),
    }
    json.dump({k: [v.status_code, v.json()] for k, v in answers.items()}, open("statuses.json", "w"))
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.fixture
def harness(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the harness and the verifier run in the current folder
    path = tmp_path / "harness.py"
    path.write_text(HARNESS)
    return path


def _record(tiny_model_dir, tmp_path, verifier, rc, harness):
    from polarproxy.render.renderer import Renderer

    renderer = Renderer(tiny_model_dir)

    async def main():
        stub = StubBackend(StubConfig(output_ids=[*renderer.encode("Done."), renderer.stop_token_ids[0]]))
        port = await stub.start()
        try:
            cfg = ProxyConfig(
                backend=f"http://127.0.0.1:{port}",
                model=tiny_model_dir,
                db=str(tmp_path / "r.db"),
                check_backend=False,
                backend_kind="sglang",
                task="t1",
                group_id="g1",
            )
            return await record(
                cfg, [sys.executable, str(harness), str(rc)], run=HarnessRun(verifier=verifier)
            )
        finally:
            await stub.stop()

    return asyncio.run(main())


def test_exit_code_verifier_and_the_http_endpoint(tiny_model_dir, tmp_path, harness):
    verifier = Verifier('test "$POLARPROXY_EXIT_CODE" = 3 && test -f statuses.json', "exit")
    outcome = _record(tiny_model_dir, tmp_path, verifier, 3, harness)
    assert outcome.exit_code == 3  # the harness's, whatever the verifier did
    assert outcome.reward is not None and outcome.reward.reward == 1.0 and outcome.reward_error is None
    answers = json.loads((tmp_path / "statuses.json").read_text())
    assert answers["call"] == [
        200,
        {"episode_id": outcome.episode_id, "call": 0, "reward": 0.25, "source": "http"},
    ]
    assert {k: v[0] for k, v in answers.items()} == {
        "call": 200,
        "bad_body": 400,
        "bad_reward": 400,
        "extra_key": 400,
        "no_such_call": 404,
        "unknown_episode": 404,
        "get": 405,
        "models_still_served": 200,
    }
    assert "'reward' must be a finite number, got 'high'" in answers["bad_reward"][1]["error"]
    assert "has no call #9" in answers["no_such_call"][1]["error"]
    with Store.open(tmp_path / "r.db") as store:
        ep = store.get_episode(outcome.episode_id)
        (call,) = store.list_calls(ep.id)
        assert (ep.reward, ep.exit_code, ep.status, ep.task, ep.group_id) == (1.0, 3, "failed", "t1", "g1")
        assert (call.reward, call.temperature) == (0.25, 0.8)
        http, command = store.list_rewards(ep.id)
        assert (http.call_seq, http.reward, http.origin.source) == (0, 0.25, "http")
        assert (command.call_seq, command.reward, command.origin.source) == (None, 1.0, "command")
        assert command.origin.command == ["/bin/sh", "-c", verifier.command]
        assert (command.origin.exit_code, command.origin.note) == (0, "exit code 0")


def test_stdout_verifier_sets_episode_and_per_call_rewards(tiny_model_dir, tmp_path, harness):
    verifier = Verifier("""echo checking; echo '{"reward": 0.5, "calls": {"0": -1}}'""", "stdout")
    outcome = _record(tiny_model_dir, tmp_path, verifier, 0, harness)
    assert outcome.exit_code == 0 and outcome.reward_error is None
    with Store.open(tmp_path / "r.db") as store:
        ep = store.get_episode(outcome.episode_id)
        assert ep.reward == 0.5 and store.list_calls(ep.id)[0].reward == -1.0  # the verifier's came last
        last = store.list_rewards(ep.id)[-2:]
        assert [(r.call_seq, r.reward, r.origin.source) for r in last] == [
            (None, 0.5, "command"),
            (0, -1.0, "command"),
        ]
        assert "checking" in last[0].origin.output_tail


def test_a_verifier_that_times_out_gives_zero_and_the_record_says_so(
    tiny_model_dir, tmp_path, harness, monkeypatch
):
    monkeypatch.setattr(verifier_module, "KILL_GRACE_S", 1.0)
    outcome = _record(tiny_model_dir, tmp_path, Verifier("echo 1.0; sleep 30", "stdout", 0.5), 0, harness)
    assert outcome.exit_code == 0 and outcome.reward is not None and outcome.reward.timed_out
    with Store.open(tmp_path / "r.db") as store:
        assert store.get_episode(outcome.episode_id).reward == 0.0
        last = store.list_rewards(outcome.episode_id)[-1]
        assert (last.reward, last.origin.exit_code) == (0.0, None)
        assert last.origin.note.startswith("timeout: the verifier ran past 0.5 s and was killed")


def test_polarproxy_reward_sets_an_episode_or_a_call_reward(tmp_path, monkeypatch):
    from polarproxy.store.records import CallResult, CallStart, EpisodeStart

    db = tmp_path / "c.db"
    with Store.open(db) as store:
        eid = store.create_episode(EpisodeStart(command=["agent"]))
        for _ in range(2):
            cid, _ = store.begin_call(
                CallStart(
                    eid, "openai_chat", "POST", "/v1/chat/completions", "m", False, {}, "{}", None, [1, 2]
                )
            )
            store.finish_call(cid, CallResult(status="ok", output_ids=[3], output_logprobs=[-0.5]))
    app = typer.Typer()
    app.command("reward", context_settings=reward_command.CONTEXT_SETTINGS)(reward_command.reward)
    app.command("other")(lambda: None)  # a group, so that `reward` is a subcommand as in the real CLI
    runner = CliRunner()

    def run(*args):
        return runner.invoke(app, ["reward", *args, "--db", str(db)])

    r = run(eid[:7], "-1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"episode_id": eid, "call": None, "reward": -1.0, "source": "cli"}
    r = run(eid, "0.5", "--call", "1")
    assert r.exit_code == 0 and f"reward 0.5 set for call #1 of episode {eid}" in r.output
    assert run(eid, "high").exit_code == 2
    assert run(eid, "nan").exit_code == 2
    r = run(eid, "1", "--call", "7")
    assert r.exit_code == 1 and "has no call #7; it has calls 0..1" in r.output
    assert run("ep_zzzz", "1").exit_code == 1
    with Store.open(db) as store:
        assert store.get_episode(eid).reward == -1.0
        assert [c.reward for c in store.list_calls(eid)] == [None, 0.5]
        assert [(r.call_seq, r.reward, r.origin.source) for r in store.list_rewards(eid)] == [
            (None, -1.0, "cli"),
            (1, 0.5, "cli"),
        ]


@pytest.fixture
def stub_url():
    """A stub backend on its own event loop in a thread (it answers /health for `record`'s start check)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stub = StubBackend(StubConfig(output_ids=[1]))
    port = asyncio.run_coroutine_threadsafe(stub.start(), loop).result(10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(stub.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_record_cli_takes_the_reward_options(tiny_model_dir, tmp_path, stub_url):
    """The flags as a user types them; the harness makes no call."""
    from factories import record_summary

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "polarproxy",
            "record",
            "--backend",
            stub_url,
            "--backend-kind",
            "sglang",
            "--model",
            str(tiny_model_dir),
            "--db",
            str(tmp_path / "cli.db"),
            "--reward-cmd",
            "echo 0.75",
            "--reward-from",
            "stdout",
            "--json",
            "--",
            sys.executable,
            "-c",
            "import sys; sys.exit(2)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "POLARPROXY_SPOOL_DIR": str(tmp_path / "spool")},
    )
    summary = record_summary(r.stderr)
    assert r.returncode == 2, r.stderr
    assert summary["reward"] == 0.75 and summary["reward_note"] == "from stdout (exit code 0)"
