"""Backend selection: --backend-kind (or detection), --backend-mode, and the health check at start."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sglang_double import Fault, SGLangDouble
from vllm_double import VLLMDouble

from polarproxy.backends.base import BackendError
from polarproxy.backends.chat import ChatBackend
from polarproxy.backends.selection import SelectionError, detect_kind, make_backend, open_backend
from polarproxy.backends.sglang import SGLangBackend
from polarproxy.backends.stub import StubBackend, StubConfig
from polarproxy.backends.vllm import VLLMBackend

CLI = [sys.executable, "-m", "polarproxy"]


class _NotFound(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def unknown_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


async def test_sglang_is_detected():
    with SGLangDouble(outputs=[1]) as d:
        assert await detect_kind(d.url) == "sglang"


async def test_vllm_is_detected():
    with VLLMDouble(outputs=[1]) as d:
        assert await detect_kind(d.url) == "vllm"


async def test_local_backend_is_detected(tiny_model_dir):
    from polarproxy.backends.local.model_runner import ModelRunner
    from polarproxy.backends.local.server import LocalServer

    with LocalServer(ModelRunner(tiny_model_dir)) as srv:
        assert await detect_kind(srv.url) == "local"
        backend = await open_backend(srv.url)
        try:
            assert isinstance(backend, SGLangBackend) and backend.kind == "local"
        finally:
            await backend.aclose()


async def test_the_fixed_time_stub_reads_as_sglang():
    stub = StubBackend(StubConfig(output_ids=[1]))
    await stub.start()
    try:
        assert await detect_kind(f"http://127.0.0.1:{stub.port}") == "sglang"
    finally:
        await stub.stop()


async def test_an_unknown_server_asks_for_the_kind(unknown_server):
    with pytest.raises(SelectionError) as e:
        await detect_kind(unknown_server)
    assert unknown_server in str(e.value)


async def test_nothing_listening_is_unreachable():
    with pytest.raises(BackendError) as e:
        await open_backend("http://127.0.0.1:1")
    assert e.value.kind == "backend_unreachable" and "http://127.0.0.1:1" in e.value.message


async def test_an_unhealthy_server_is_refused():
    with SGLangDouble(outputs=[1], fault=Fault(health_status=503)) as d:
        with pytest.raises(BackendError) as e:
            await open_backend(d.url, "sglang")
        assert "/health answered 503" in e.value.message


def test_clients_for_each_kind_and_mode():
    assert isinstance(make_backend("http://h:1", "sglang"), SGLangBackend)
    assert make_backend("http://h:1", "local").kind == "local"
    assert isinstance(make_backend("http://h:1", "vllm"), VLLMBackend)
    chat = make_backend("http://h:1", "vllm", "chat")
    assert isinstance(chat, ChatBackend) and chat.mode == "chat" and chat.kind == "vllm-chat"
    assert make_backend("http://h:1", "sglang", "chat").kind == "sglang-chat"


@pytest.mark.parametrize(
    ("kind", "mode", "message"),
    [
        ("tgi", "tokens", "Unknown backend kind 'tgi'. Must be one of 'sglang', 'vllm', 'local'."),
        ("vllm", "text", "Unknown backend mode 'text'. Must be one of 'tokens', 'chat'."),
        ("local", "chat", "--backend-mode tokens"),
    ],
)
def test_bad_choices_name_the_allowed_values(kind, mode, message):
    with pytest.raises(SelectionError) as e:
        make_backend("http://h:1", kind, mode)
    assert message in str(e.value)


def _record(backend: str, model, tmp_path, *extra: str, marker=None) -> subprocess.CompletedProcess[str]:
    cmd = ["true"] if marker is None else [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"]
    return subprocess.run(
        [
            *CLI,
            "record",
            "--backend",
            backend,
            "--model",
            str(model),
            "--db",
            str(tmp_path / "x.db"),
            *extra,
            "--",
            *cmd,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_record_refuses_an_unknown_server_and_starts_nothing(unknown_server, tiny_model_dir, tmp_path):
    marker = tmp_path / "ran"
    r = _record(unknown_server, tiny_model_dir, tmp_path, marker=marker)
    assert r.returncode == 1 and not marker.exists()
    assert unknown_server in r.stderr and "--backend-kind" in r.stderr


def test_record_refuses_an_unhealthy_backend_and_starts_nothing(tiny_model_dir, tmp_path):
    marker = tmp_path / "ran"
    with SGLangDouble(outputs=[1], fault=Fault(health_status=503)) as d:
        r = _record(d.url, tiny_model_dir, tmp_path, "--backend-kind", "sglang", marker=marker)
    assert r.returncode == 1 and not marker.exists()
    assert f"{d.url}/health answered 503" in r.stderr and "nothing was run" in r.stderr


def test_record_with_a_detected_vllm_backend(tiny_model_dir, tmp_path):
    marker = tmp_path / "ran"
    with VLLMDouble(outputs=[1]) as d:
        r = _record(d.url, tiny_model_dir, tmp_path, "--backend-mode", "tokens", marker=marker)
    assert r.returncode == 0, r.stderr
    assert marker.read_text() == "ran"


async def test_a_given_kind_the_server_contradicts_is_refused_at_start():
    with SGLangDouble(outputs=[1]) as d:
        with pytest.raises(SelectionError, match=r"--backend-kind vllm does not match .* answers as sglang"):
            await open_backend(d.url, "vllm")
        backend = await open_backend(d.url, "local")  # the same protocol: accepted
        await backend.aclose()
    with (
        VLLMDouble(outputs=[1]) as d,
        pytest.raises(SelectionError, match=r"--backend-kind sglang does not match .* answers as vllm"),
    ):
        await open_backend(d.url, "sglang")


def test_bad_kind_is_a_usage_error(tiny_model_dir, tmp_path):
    r = _record("http://127.0.0.1:1", tiny_model_dir, tmp_path, "--backend-kind", "tgi")
    assert r.returncode == 2 and "tgi" in r.stderr


def test_serve_refuses_an_unreachable_backend(tiny_model_dir, tmp_path):
    r = subprocess.run(
        [
            *CLI,
            "serve",
            "--backend",
            "http://127.0.0.1:1",
            "--model",
            str(tiny_model_dir),
            "--db",
            str(tmp_path / "x.db"),
            "--port",
            "0",
            "--backend-kind",
            "vllm",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "http://127.0.0.1:1 is unreachable" in r.stderr


@pytest.mark.parametrize("incremental", [False, True])
async def test_an_sglang_server_that_streams_cumulatively_is_named_at_start(incremental, caplog):
    with SGLangDouble(outputs=[1], incremental_streaming_output=incremental) as d:
        backend = await open_backend(d.url)
        await backend.aclose()
    warned = [r.getMessage() for r in caplog.records if r.name == "polarproxy.backends"]
    if incremental:
        assert warned == []
    else:
        (message,) = warned
        assert d.url in message and "--incremental-streaming-output" in message


async def test_a_server_without_the_streaming_setting_gets_no_warning(caplog):
    stub = StubBackend(StubConfig(output_ids=[1]))  # answers /get_server_info without the key
    await stub.start()
    try:
        backend = await open_backend(f"http://127.0.0.1:{stub.port}")
        await backend.aclose()
    finally:
        await stub.stop()
    assert not [r for r in caplog.records if r.name == "polarproxy.backends"]
