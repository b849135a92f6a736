"""The proxy's tokenizer loads while the harness starts: `record` does not wait for it before running the
harness, the first call waits for it, and a tokenizer that cannot load fails that call with a
provider-shaped error and a failed record (the folder's cheap checks still refuse before anything runs)."""

from __future__ import annotations

import asyncio
import shutil
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from polarproxy.capture.stack import ProxyConfig
from polarproxy.errors import UsageError
from polarproxy.harness.record import record
from polarproxy.render import renderer as renderer_module
from polarproxy.render.renderer import Renderer


def test_the_harness_starts_before_the_tokenizer_is_loaded(tiny_model_dir, tmp_path, monkeypatch):
    marker, loading = tmp_path / "harness-ran", tmp_path / "loading"
    real = renderer_module._load_tokenizer
    seen: list[bool] = []

    def slow_load(path: Path):
        # Loads only once the harness has run: if `record` waited for the tokenizer first, nothing would
        # ever write the marker (the harness below does) and this would give up after 30 s.
        loading.touch()
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        seen.append(marker.exists())
        return real(path)

    monkeypatch.setattr(renderer_module, "_load_tokenizer", slow_load)
    cfg = ProxyConfig(
        backend="http://127.0.0.1:9", model=tiny_model_dir, db=str(tmp_path / "r.db"), check_backend=False
    )
    # The harness waits until the load has begun (the proxy is up; a harness that ends before that never
    # needed the proxy, and then neither is started: tests/capture/test_early_proxy.py).
    wait = (
        "import os, time; t = time.time() + 30\n"
        f"while not os.path.exists({str(loading)!r}) and time.time() < t: time.sleep(0.01)"
    )
    harness = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()\n{wait}"]
    outcome = asyncio.run(asyncio.wait_for(record(cfg, harness), 60))
    assert outcome.exit_code == 0 and marker.exists()
    deadline = time.monotonic() + 30  # the loader thread goes on after record returned
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen == [True]


def test_a_deferred_renderer_checks_the_folder_at_once_and_loads_on_first_use(tiny_model_dir, tmp_path):
    bare = tmp_path / "no-template"
    bare.mkdir()
    shutil.copy(tiny_model_dir / "tokenizer.json", bare / "tokenizer.json")
    with pytest.raises(UsageError, match="no chat template"):
        Renderer(bare, defer=True)
    with pytest.raises(UsageError, match="does not exist"):
        Renderer(tmp_path / "missing", defer=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no tokenizer"):
        Renderer(tmp_path / "empty", defer=True)

    eager, deferred = Renderer(tiny_model_dir), Renderer(tiny_model_dir, defer=True)
    assert not deferred.loaded
    assert deferred.encode("hello world") == eager.encode("hello world")  # loads there and then
    assert deferred.loaded and deferred.stop_token_ids == eager.stop_token_ids

    waited = Renderer(tiny_model_dir, defer=True)
    waited.load_in_background()
    asyncio.run(waited.ready())
    assert waited.loaded and waited.encode("hi") == eager.encode("hi")


def _broken_model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    (broken / "tokenizer.json").write_text("{not json")
    return broken


def test_a_tokenizer_that_cannot_load_is_raised_where_it_is_waited_for(tiny_model_dir, tmp_path):
    deferred = Renderer(_broken_model(tiny_model_dir, tmp_path), defer=True)  # the cheap checks pass
    deferred.load_in_background()
    with pytest.raises(UsageError, match="Cannot load a tokenizer"):
        asyncio.run(deferred.ready())
    with pytest.raises(UsageError, match="Cannot load a tokenizer"):
        deferred.encode("hi")


def test_a_call_made_while_the_tokenizer_cannot_load_gets_an_error_and_a_failed_record(
    tiny_model_dir, tmp_path, make_proxy
):
    proxy = make_proxy(
        "http://127.0.0.1:9", check_backend=False, model=_broken_model(tiny_model_dir, tmp_path)
    )
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):  # the proxy keeps serving (and keeps saying why)
        r = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 500 and "Cannot load a tokenizer" in r.json()["error"]["message"]
    calls = proxy.store.list_calls(proxy.episode_id)
    assert [c.status for c in calls] == ["failed", "failed"]
    assert all("Cannot load a tokenizer" in (c.error or "") for c in calls)


def test_a_waiter_cancelled_while_the_tokenizer_loads_leaves_the_load_to_the_others(
    tiny_model_dir, monkeypatch
):
    """A call waiting for the deferred tokenizer whose harness hangs up is cancelled; the one shared load
    goes on, and the next call gets the tokenizer (it was once cancelled with that waiter)."""
    gate = threading.Event()
    real = renderer_module._load_tokenizer

    def gated(path: Path):
        gate.wait(30)
        return real(path)

    monkeypatch.setattr(renderer_module, "_load_tokenizer", gated)
    deferred = Renderer(tiny_model_dir, defer=True)

    async def go() -> None:
        first = asyncio.ensure_future(deferred.ready())
        await asyncio.sleep(0.1)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        gate.set()
        await asyncio.wait_for(deferred.ready(), 30)

    asyncio.run(go())
    assert deferred.loaded and deferred.encode("hi") == Renderer(tiny_model_dir).encode("hi")
