"""The thin addon script in a real `mitmdump -s addons/polarproxy_recorder.py`, against a real backend double."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from factories import free_port

from polarproxy.store.store import Store

REPO = Path(__file__).resolve().parents[2]
MITMDUMP = Path(sys.executable).parent / "mitmdump"
pytestmark = pytest.mark.integration


def test_mitmdump_loads_the_recorder_and_records_calls(make_stub, tiny_model_dir, tmp_path):
    stub = make_stub("Recorded through mitmdump.")
    port = free_port()
    db = tmp_path / "m.db"
    proc = subprocess.Popen(
        _mitmdump(port, stub.url, tiny_model_dir, db, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        deadline = time.time() + 60
        while True:
            try:
                r = httpx.post(
                    url,
                    json={"messages": [{"role": "user", "content": "hi"}]},
                    headers={"authorization": "Bearer sk-mitmdump-secret"},
                    timeout=30,
                )
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
                time.sleep(0.3)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "Recorded through mitmdump."
        with httpx.stream(
            "POST", url, json={"messages": [{"role": "user", "content": "hi"}], "stream": True}, timeout=30
        ) as s:
            assert s.headers["content-type"] == "text/event-stream"
            body = s.read()
        assert body.endswith(b"data: [DONE]\n\n")
    finally:
        proc.terminate()
        proc.wait(20)
    calls = Store.open(str(db)).list_calls("ep_mitmdump")
    assert [(c.status, c.stream) for c in calls] == [("ok", False), ("ok", True)]
    assert calls[0].request_headers["authorization"] == "<redacted>"
    for f in tmp_path.glob("m.db*"):
        assert b"sk-mitmdump-secret" not in f.read_bytes()


def _mitmdump(port: int, backend: str, model: Path, db: Path, tmp_path: Path) -> list[str]:
    return [
        str(MITMDUMP),
        "-q",
        "--listen-host",
        "127.0.0.1",
        "-p",
        str(port),
        "--mode",
        f"reverse:{backend}",
        "-s",
        str(REPO / "addons" / "polarproxy_recorder.py"),
        "--set",
        f"polarproxy_model={model}",
        "--set",
        f"polarproxy_db={db}",
        "--set",
        "polarproxy_episode=ep_mitmdump",
        "--set",
        f"confdir={tmp_path / 'mitm'}",
    ]


def test_mitmdump_detects_a_vllm_backend_as_record_does(tiny_model_dir, tmp_path):
    """The addon builds its gateway with the same assembly as `record` (capture/stack.py): a vLLM server is
    detected and spoken to through /v1/completions, not sent SGLang's /generate."""
    sys.path.insert(0, str(REPO / "tests" / "backends"))  # the vLLM contract double lives with its tests
    from vllm_double import VLLMDouble

    from polarproxy.render.renderer import Renderer

    renderer = Renderer(tiny_model_dir)
    ids = [*renderer.encode("Served by vLLM."), renderer.stop_token_ids[0]]
    port, db = free_port(), tmp_path / "v.db"
    with VLLMDouble(outputs=ids, eos_token_ids=frozenset(renderer.stop_token_ids)) as double:
        proc = subprocess.Popen(
            _mitmdump(port, double.url, tiny_model_dir, db, tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.time() + 60
            while True:
                try:
                    r = httpx.post(
                        f"http://127.0.0.1:{port}/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16},
                        timeout=30,
                    )
                    break
                except httpx.ConnectError:
                    assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
                    time.sleep(0.3)
        finally:
            proc.terminate()
            proc.wait(20)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "Served by vLLM."
        assert any(isinstance(q.get("prompt"), list) for q in double.requests)  # token IDs, /v1/completions
    (call,) = Store.open(str(db)).list_calls("ep_mitmdump")
    assert call.status == "ok" and call.backend_kind == "vllm"


def test_mitmdump_with_no_backend_answering_exits_1_with_the_reason(tiny_model_dir, tmp_path):
    r = subprocess.run(
        _mitmdump(free_port(), "http://127.0.0.1:9", tiny_model_dir, tmp_path / "x.db", tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "polarproxy cannot start" in r.stdout + r.stderr and "127.0.0.1:9" in r.stdout + r.stderr


def test_mitmdump_without_a_model_option_refuses_to_start(tmp_path):
    r = subprocess.run(
        [
            str(MITMDUMP),
            "-q",
            "-p",
            str(free_port()),
            "--mode",
            "reverse:http://127.0.0.1:9",
            "-s",
            str(REPO / "addons" / "polarproxy_recorder.py"),
            "--set",
            f"polarproxy_db={tmp_path / 'x.db'}",
            "--set",
            f"confdir={tmp_path / 'mitm'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "polarproxy_model is not set" in r.stdout + r.stderr


def test_an_installed_package_names_its_mitmdump_addon_and_ships_its_schemas():
    """A wheel user has no checkout: `python -m polarproxy.mitmdump_addon` prints the script to load, and the
    schemas are package data."""
    r = subprocess.run([sys.executable, "-m", "polarproxy.mitmdump_addon"], capture_output=True, text=True)
    path = Path(r.stdout.strip())
    assert (
        r.returncode == 0
        and path.is_file()
        and path.resolve() == (REPO / "addons" / "polarproxy_recorder.py").resolve()
    )
    import polarproxy
    from polarproxy.export import load_schema

    assert (Path(polarproxy.__file__).parent / "schemas" / "export-row.v3.json").is_file()
    assert load_schema("export-row.v3")["$schema"]
