"""Calls recorded through the gateway carry the weight version that sampled them, across a weight sync,
and a call sampled by two versions (a sync while the server was paused in place) is flagged."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from polarproxy.backends.local.model_runner import ModelRunner
from polarproxy.backends.local.server import LocalServer
from polarproxy.train.sync import sync_weights

CHAT = "/v1/chat/completions"


def body(max_tokens: int, stream: bool) -> dict:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Count for me."}],
        "max_tokens": max_tokens,
        "stream": stream,
        "seed": 3,
    }


@pytest.fixture(scope="module")
def checkpoint(random_model_dir: Path, tmp_path_factory) -> Path:
    """A checkpoint as the trainer writes it: the random tiny model, perturbed, with its polarproxy.json."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(random_model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    out = tmp_path_factory.mktemp("train-out") / "step-1"
    model.save_pretrained(str(out))
    (out / "polarproxy.json").write_text(json.dumps({"weight_version": "step-1"}))
    return out


@pytest.fixture
def backend(random_model_dir: Path):
    with LocalServer(ModelRunner(random_model_dir), weight_version="step-0") as srv:
        yield srv


def test_calls_before_and_after_a_sync_carry_the_version_that_sampled_them(backend, checkpoint, make_proxy):
    proxy = make_proxy(backend.url)
    for stream in (False, True):
        assert httpx.post(proxy.url + CHAT, json=body(8, stream), timeout=60).status_code == 200
    sync_weights(backend.url, checkpoint, kind="local", timeout=60)
    for stream in (False, True):
        assert httpx.post(proxy.url + CHAT, json=body(8, stream), timeout=60).status_code == 200

    calls = proxy.store.list_calls(proxy.episode_id)
    assert [(c.weight_version, c.weight_version_first, c.weight_version_last) for c in calls] == [
        ("step-0", "step-0", "step-0"),
        ("step-0", "step-0", "step-0"),
        ("step-1", "step-1", "step-1"),
        ("step-1", "step-1", "step-1"),
    ]
    assert not any(c.mixed_weight_versions for c in calls)


def test_a_call_sampled_across_an_in_place_sync_is_flagged(backend, checkpoint, make_proxy):
    proxy = make_proxy(backend.url)
    synced, done = threading.Event(), threading.Event()

    def sync_mid_call() -> None:
        sync_weights(backend.url, checkpoint, kind="local", pause_mode="in_place", timeout=60)
        done.set()

    with httpx.stream("POST", proxy.url + CHAT, json=body(300, True), timeout=60) as r:
        assert r.status_code == 200
        seen = b""
        for chunk in r.iter_bytes():
            seen += chunk
            if not synced.is_set() and seen.count(b'"delta":') >= 3:  # the role, then sampled tokens
                threading.Thread(target=sync_mid_call, daemon=True).start()
                synced.set()
    assert done.wait(30)

    (call,) = proxy.store.list_calls(proxy.episode_id)
    assert call.status == "ok" and len(call.output_ids) > 1
    assert (call.weight_version_first, call.weight_version_last) == ("step-0", "step-1")
    assert call.mixed_weight_versions
