"""`polarproxy record` as a user runs it: environment, exit codes, signals, and refusals before start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from factories import record_summary

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "polarproxy"]


def record(stub_url, model, db, *cmd, **kw):
    return subprocess.run(
        [*CLI, "record", "--backend", stub_url, "--model", str(model), "--db", str(db), "--json", "--", *cmd],
        capture_output=True,
        text=True,
        timeout=120,
        **kw,
    )


def test_the_harness_never_gets_polarproxys_own_secrets(make_stub, tiny_model_dir, tmp_path):
    """The user's environment passes (intercept mode needs the real provider key), but not the store's URL
    with its password, nor the control and sync keys."""
    stub = make_stub()
    script = "import json, os; print(json.dumps(sorted(os.environ)))"
    secrets = {
        "POLARPROXY_CONTROL_TOKEN": "ctl-secret",
        "POLARPROXY_SYNC_API_KEY": "sync-secret",
        "MY_OWN_VARIABLE": "kept",
    }
    db = tmp_path / "r.db"
    env = {**os.environ, **secrets, "POLARPROXY_DB": str(db)}
    r = record(stub.url, tiny_model_dir, db, sys.executable, "-c", script, env=env)
    assert r.returncode == 0, r.stderr
    names = set(json.loads(r.stdout.splitlines()[0]))
    assert "MY_OWN_VARIABLE" in names
    assert not names & {"POLARPROXY_DB", "POLARPROXY_CONTROL_TOKEN", "POLARPROXY_SYNC_API_KEY"}


def test_child_gets_the_proxy_environment_and_its_exit_code_is_returned(make_stub, tiny_model_dir, tmp_path):
    stub = make_stub()
    script = (
        "import json, os, sys;"
        "keys = ['OPENAI_BASE_URL', 'OPENAI_API_KEY', 'ANTHROPIC_BASE_URL', 'ANTHROPIC_API_KEY',"
        " 'GOOGLE_GEMINI_BASE_URL', 'GEMINI_API_KEY', 'POLARPROXY_URL', 'POLARPROXY_EPISODE'];"
        "print(json.dumps({k: os.environ.get(k) for k in keys})); sys.exit(3)"
    )
    r = record(stub.url, tiny_model_dir, tmp_path / "r.db", sys.executable, "-c", script)
    assert r.returncode == 3
    env = json.loads(r.stdout.splitlines()[0])
    proxy = env["POLARPROXY_URL"]
    assert proxy.startswith("http://127.0.0.1:")
    assert env["OPENAI_BASE_URL"] == proxy + "/v1"
    assert env["ANTHROPIC_BASE_URL"] == env["GOOGLE_GEMINI_BASE_URL"] == proxy
    assert all(env[k] for k in env)
    summary = record_summary(r.stderr)
    assert summary["episode_id"] == env["POLARPROXY_EPISODE"] and summary["exit_code"] == 3


def test_a_harness_call_through_record_lands_in_the_episode(make_stub, tiny_model_dir, tmp_path):
    stub = make_stub("All good.")
    script = (
        "import os, httpx;"
        "r = httpx.post(os.environ['OPENAI_BASE_URL'] + '/chat/completions',"
        " json={'model': 'x', 'messages': [{'role': 'user', 'content': 'hi'}]}, timeout=30);"
        "print(r.json()['choices'][0]['message']['content'])"
    )
    r = record(stub.url, tiny_model_dir, tmp_path / "r.db", sys.executable, "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "All good."
    summary = record_summary(r.stderr)
    assert summary["calls"] == 1 and summary["statuses"] == {"ok": 1}
    assert "1 calls" not in r.stderr  # --json replaces the human summary


def test_sigterm_is_passed_to_the_child_and_reflected_in_the_exit_code(make_stub, tiny_model_dir, tmp_path):
    stub = make_stub()
    proc = subprocess.Popen(
        [
            *CLI,
            "record",
            "--backend",
            stub.url,
            "--model",
            str(tiny_model_dir),
            "--db",
            str(tmp_path / "s.db"),
            "--",
            sys.executable,
            "-c",
            "import time; print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert time.time() - t0 < 20
    assert "exit 143" in proc.stderr.read()


def test_missing_command_is_not_found_with_exit_127(make_stub, tiny_model_dir, tmp_path):
    r = record(make_stub().url, tiny_model_dir, tmp_path / "m.db", "definitely-not-a-command-xyz")
    assert r.returncode == 127
    assert "cannot run 'definitely-not-a-command-xyz'" in r.stderr


@pytest.mark.parametrize(
    "args, message, hint",
    [
        (["--model", "."], "Error: No backend given.", "--backend URL"),
        (["--backend", "http://127.0.0.1:9"], "Error: No model folder given.", "--model DIR"),
        (
            ["--backend", "http://127.0.0.1:9", "--model", "/nonexistent/model"],
            "does not exist",
            "tiny-model",
        ),
    ],
)
def test_refusals_before_start_say_what_and_what_next(args, message, hint, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLARPROXY_")}
    r = subprocess.run(
        [*CLI, "record", *args, "--db", str(tmp_path / "x.db"), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 1
    assert message in r.stderr and hint in r.stderr


def test_unreachable_backend_is_refused_at_start(tiny_model_dir, tmp_path):
    r = subprocess.run(
        [
            *CLI,
            "record",
            "--backend",
            "http://127.0.0.1:9",
            "--model",
            str(tiny_model_dir),
            "--db",
            str(tmp_path / "x.db"),
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "unreachable" in r.stderr and "polarproxy backend" in r.stderr


def test_unopenable_database_is_refused(make_stub, tiny_model_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = record(make_stub().url, tiny_model_dir, blocker / "sub" / "x.db", "true")
    assert r.returncode == 1
    assert "Error: Cannot open the store" in r.stderr


def test_unknown_export_strategy_names_the_allowed_values(tmp_path):
    r = subprocess.run(
        [
            *CLI,
            "export",
            "--strategy",
            "prefix",
            "--out",
            str(tmp_path / "o.jsonl"),
            "--db",
            str(tmp_path / "e.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2  # a usage error: the choices are listed in --help too
    flat = " ".join(r.stderr.replace("│", " ").split())  # rich wraps the message in a box
    assert "'prefix' is not one of 'per-request', 'prefix-merge'" in flat


def test_help_imports_no_heavy_module():
    code = (
        "import sys; from polarproxy.cli import app; from typer.testing import CliRunner;"
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output;"
        "heavy = [m for m in ('torch', 'transformers', 'mitmproxy') if m in sys.modules]; print(heavy)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr


def test_serve_stops_on_sigint_while_a_client_holds_a_keepalive_connection(
    make_stub, tiny_model_dir, tmp_path
):
    import re

    import httpx

    stub = make_stub()
    proc = subprocess.Popen(
        [
            *CLI,
            "serve",
            "--backend",
            stub.url,
            "--model",
            str(tiny_model_dir),
            "--db",
            str(tmp_path / "s.db"),
            "--port",
            "0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stderr.readline()
    url = re.search(r"recording on (http://\S+) ", line).group(1)
    with httpx.Client(timeout=30) as client:  # keeps its connection open across the SIGINT
        assert (
            client.post(
                url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
            ).status_code
            == 200
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0


def test_a_port_in_use_is_refused_with_a_hint(make_stub, tiny_model_dir, tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run(
            [
                *CLI,
                "record",
                "--backend",
                make_stub().url,
                "--model",
                str(tiny_model_dir),
                "--db",
                str(tmp_path / "p.db"),
                "--port",
                str(port),
                "--",
                "true",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr
