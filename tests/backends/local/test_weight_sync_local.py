"""Weight sync on the local backend: after `sync_weights` it samples the checkpoint, reports its version,
and never mixes two versions in one call unless it was paused in place (as SGLang)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from polarproxy.backends.local.model_runner import ModelRunner
from polarproxy.backends.local.server import LocalServer
from polarproxy.train.sync import SyncError, sync_weights

PROMPT = [11, 12, 13, 14, 15, 16]
TOLERANCE = 1e-4  # KV-cached sampling against one teacher-forced forward pass, both float32 on the CPU


@pytest.fixture(scope="module")
def checkpoint(random_model_dir: Path, tmp_path_factory) -> Path:
    """The random tiny model with every weight perturbed, saved as the trainer saves a step."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(random_model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    out = tmp_path_factory.mktemp("train-out") / "step-1"
    model.save_pretrained(str(out))
    (out / "polarproxy.json").write_text(json.dumps({"weight_version": "step-1", "step": 1}))
    return out


@pytest.fixture
def server(random_model_dir: Path) -> Iterator[LocalServer]:
    with LocalServer(ModelRunner(random_model_dir), weight_version="step-0") as srv:
        yield srv


def teacher_forced(model_dir: Path, prompt: list[int], output: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logprobs.gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def generate(url: str, n: int = 12, **extra) -> dict:
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": n, "temperature": 1.0, "sampling_seed": 5, "ignore_eos": True},
        "return_logprob": True,
        **extra,
    }
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def stream_events(url: str, n: int, first: threading.Event | None = None) -> list[dict]:
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "sampling_seed": 1},
        "return_logprob": True,
        "stream": True,
    }
    events = []
    buf = b""
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=120) as r:
        for chunk in r.iter_bytes():
            buf += chunk
            while b"\n\n" in buf:
                line, buf = buf.split(b"\n\n", 1)
                if line == b"data: [DONE]":
                    return events
                events.append(orjson.loads(line[len(b"data: ") :]))
                if first is not None:
                    first.set()
    raise AssertionError("the stream ended without [DONE]")


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the server state")
        time.sleep(0.005)


def test_after_a_sync_the_backend_samples_the_checkpoint_and_reports_its_version(
    server, checkpoint, random_model_dir
):
    before = generate(server.url)
    assert before["meta_info"]["weight_version"] == "step-0"

    result = sync_weights(server.url, checkpoint, kind="local", timeout=60)  # version from polarproxy.json

    assert result.weight_version == "step-1" and "Weight version updated to step-1" in result.message
    info = httpx.get(f"{server.url}/model_info").json()
    assert info["weight_version"] == "step-1" and info["model_path"] == str(checkpoint)
    assert httpx.get(f"{server.url}/get_model_info").json()["weight_version"] == "step-1"
    after = generate(server.url)
    meta = after["meta_info"]
    assert meta["weight_version"] == "step-1"
    output = after["output_ids"]
    sampled = [lp for lp, _, _ in meta["output_token_logprobs"]]
    expected = teacher_forced(checkpoint, PROMPT, output)
    assert max(abs(a - b) for a, b in zip(sampled, expected, strict=True)) < TOLERANCE
    old = teacher_forced(random_model_dir, PROMPT, output)
    assert max(abs(a - b) for a, b in zip(sampled, old, strict=True)) > 100 * TOLERANCE, "weights unchanged"


def test_a_stream_started_before_the_update_finishes_on_the_old_version_and_new_calls_wait(
    server, checkpoint
):
    gate = server.httpd.gate
    first = threading.Event()
    streamed: list[list[dict]] = []
    streamer = threading.Thread(target=lambda: streamed.append(stream_events(server.url, 400, first)))
    streamer.start()
    assert first.wait(60)
    updated: list[httpx.Response] = []
    updater = threading.Thread(
        target=lambda: updated.append(
            httpx.post(
                f"{server.url}/update_weights_from_disk",
                json={"model_path": str(checkpoint), "weight_version": "step-1"},
                timeout=120,
            )
        )
    )
    updater.start()
    wait_for(lambda: gate.pending_swaps == 1)
    assert gate.in_flight == 1, "the swap must wait for the generation in flight"
    later: list[dict] = []
    newcomer = threading.Thread(target=lambda: later.append(generate(server.url, n=3)))
    newcomer.start()
    time.sleep(0.2)
    assert not later, "a generation that arrives while a swap is pending waits for it"
    for t in (streamer, updater, newcomer):
        t.join(120)

    (events,) = streamed
    assert len(events) == 400 and events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert {e["meta_info"]["weight_version"] for e in events} == {"step-0"}
    assert updated[0].status_code == 200 and updated[0].json()["success"] is True
    assert later[0]["meta_info"]["weight_version"] == "step-1"


def test_pause_aborts_the_generation_in_flight_and_holds_new_ones_until_continue(server):
    gate = server.httpd.gate
    first = threading.Event()
    streamed: list[list[dict]] = []
    streamer = threading.Thread(target=lambda: streamed.append(stream_events(server.url, 2000, first)))
    streamer.start()
    assert first.wait(60)
    r = httpx.post(f"{server.url}/pause_generation", json={}, timeout=60)  # SGLang's default mode: abort
    assert r.json() == {"message": "Generation paused successfully.", "status": "ok"}
    streamer.join(60)
    last = streamed[0][-1]["meta_info"]
    assert last["finish_reason"]["type"] == "abort" and last["completion_tokens"] < 2000
    assert gate.in_flight == 0

    later: list[dict] = []
    waiter = threading.Thread(target=lambda: later.append(generate(server.url, n=2)))
    waiter.start()
    time.sleep(0.3)
    assert not later, "no generation is admitted while paused"
    r = httpx.post(f"{server.url}/continue_generation", json={}, timeout=60)
    assert r.json() == {"message": "Generation continued successfully.", "status": "ok"}
    waiter.join(60)
    assert later[0]["meta_info"]["finish_reason"]["type"] == "length"
    bad = httpx.post(f"{server.url}/pause_generation", json={"mode": "later"}, timeout=10)
    assert bad.status_code == 400 and "Invalid mode: 'later'" in bad.json()["error"]["message"]


def test_a_generation_paused_in_place_continues_on_the_new_weights_and_reports_both_versions(
    server, checkpoint
):
    gate = server.httpd.gate
    first = threading.Event()
    streamed: list[list[dict]] = []
    streamer = threading.Thread(target=lambda: streamed.append(stream_events(server.url, 400, first)))
    streamer.start()
    assert first.wait(60)
    httpx.post(f"{server.url}/pause_generation", json={"mode": "in_place"}, timeout=60).raise_for_status()
    assert gate.in_flight == 1, "an in-place pause keeps the generation"
    r = httpx.post(  # a paused server swaps at once, as SGLang does
        f"{server.url}/update_weights_from_disk",
        json={"model_path": str(checkpoint), "weight_version": "step-1", "flush_cache": False},
        timeout=60,
    )
    assert r.json()["success"] is True
    httpx.post(f"{server.url}/continue_generation", json={}, timeout=60).raise_for_status()
    streamer.join(60)
    versions = [e["meta_info"]["weight_version"] for e in streamed[0]]
    assert len(versions) == 400 and versions[0] == "step-0" and versions[-1] == "step-1"


def test_a_bad_checkpoint_fails_with_a_message_and_the_old_weights_keep_serving(
    server, random_model_dir, tmp_path
):
    missing = tmp_path / "step-9"
    r = httpx.post(f"{server.url}/update_weights_from_disk", json={"model_path": str(missing)}, timeout=60)
    assert r.status_code == 400
    body = r.json()
    assert body["success"] is False and str(missing) in body["message"] and body["num_paused_requests"] == 0

    broken = tmp_path / "step-10"  # a folder that looks like a checkpoint but holds no readable weights
    broken.mkdir()
    (broken / "config.json").write_bytes((random_model_dir / "config.json").read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SyncError) as e:
        sync_weights(server.url, broken, "step-10", kind="local", timeout=60)
    message = str(e.value)
    assert (
        server.url in message and str(broken) in message and "keeps serving its previous weights" in message
    )

    assert not server.httpd.gate.paused
    answer = generate(server.url)
    assert answer["meta_info"]["weight_version"] == "step-0"
    sampled = [lp for lp, _, _ in answer["meta_info"]["output_token_logprobs"]]
    expected = teacher_forced(random_model_dir, PROMPT, answer["output_ids"])
    assert max(abs(a - b) for a, b in zip(sampled, expected, strict=True)) < TOLERANCE


def test_polarproxy_sync_pushes_a_checkpoint_again_with_the_backends_key(
    checkpoint: Path, random_model_dir: Path, monkeypatch
):
    """`polarproxy sync CHECKPOINT --backend URL`: what `train --sync` says to do when a sync failed; it
    sends POLARPROXY_SYNC_API_KEY as `train --sync` does."""
    from typer.testing import CliRunner

    from polarproxy.cli import app

    with LocalServer(ModelRunner(random_model_dir), weight_version="step-0", api_key="k-sync") as srv:
        args = ["sync", str(checkpoint), "--backend", srv.url, "--sync-kind", "local", "--json"]
        monkeypatch.delenv("POLARPROXY_SYNC_API_KEY", raising=False)
        refused = CliRunner().invoke(app, args)
        assert refused.exit_code == 1 and "401" in refused.stderr
        monkeypatch.setenv("POLARPROXY_SYNC_API_KEY", "k-sync")
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["weight_version"] == srv.httpd.weight_version != "step-0"
