"""Start a real vLLM (the `make test-vllm` tier's venv) serving a model folder on loopback, for the vLLM
integration tests: `with vllm_server(model_dir, log) as url: ...`, or POLARPROXY_VLLM_URL's server when set
(then only for the model it serves)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("POLARPROXY_VLLM_PYTHON")
VLLM_URL = os.environ.get("POLARPROXY_VLLM_URL")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def vllm_server(model_dir: Path, log: Path, *, use_env_url: bool = True) -> Iterator[str]:
    """vLLM on 127.0.0.1 serving `model_dir` in float32 with polarproxy's weight-reload worker extension;
    yields its URL, stops it at the end. A server that exits or does not get healthy fails the test with
    the tail of its log."""
    if VLLM_URL and use_env_url:
        yield VLLM_URL.rstrip("/")
        return
    assert VLLM_PYTHON, "POLARPROXY_VLLM_PYTHON names the vLLM venv's interpreter (make test-vllm sets it)"
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_SERVER_DEV_MODE": "1",  # the weight-reload routes polarproxy's sync uses (docs/rl.md)
        # polarproxy's worker extension (polarproxy/backends/vllm_worker.py) imports only vLLM
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    argv += ["--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--max-model-len", "8192"]
    argv += ["--worker-extension-cls", "polarproxy.backends.vllm_worker.PolarproxyWeightReload"]
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + float(os.environ.get("POLARPROXY_VLLM_START_S", "900"))
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode} while starting:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not become healthy in time:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        print(f"vLLM ready in {time.monotonic() - started:.0f} s ({model_dir.name})", file=sys.stderr)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
