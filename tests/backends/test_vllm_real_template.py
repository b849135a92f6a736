"""Integration tier (`make test-vllm`): a real vLLM serving a tiny Qwen3-architecture model that carries the
real Qwen3 chat template (../shared/fixtures/chat-templates/qwen3.jinja), recorded through polarproxy.

Qwen3's template renders an assistant turn differently when it is the last message (an empty think block)
than when messages follow it, which broke T2 before the render rework (issue 10). A streamed three-turn chat
with a tool list, its answers cut by max_tokens (so each later call extends a turn the model did not close):
the first prompt is the template's render (T1), every later call extends the one before (T2) with the
template's closing text masked, prefix-merge gives one trajectory, and vLLM's logprobs are the model's own
(a teacher-forced pass agrees)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import record_summary
from vllm_server import VLLM_PYTHON, vllm_server

from polarproxy.conversation import Conversation
from polarproxy.render.renderer import Renderer
from polarproxy.store.store import Store

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "tiny"))
from test_tiny_any_template import cached_model  # noqa: E402

TOLERANCE = 1e-3  # fp32 on CPU, vLLM's kernels against transformers' eager forward pass
CUT = 12

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.skipif(
        not VLLM_PYTHON, reason="the vLLM tier runs under `make test-vllm` (POLARPROXY_VLLM_PYTHON)"
    ),
]

# Streams Chat Completions to the proxy; sends each answer back as it got it (content and any reasoning).
AGENT = r"""
import json, os, sys
import httpx

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
base = os.environ["OPENAI_BASE_URL"].rstrip("/")
messages = [{"role": "system", "content": "You are a careful assistant."}]
with httpx.Client(timeout=300) as client:
    for ask in ("Hello there.", "What does main.py print?", "Thanks, anything else?"):
        messages.append({"role": "user", "content": ask})
        body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": int(sys.argv[1]),
                "stream": True, "temperature": 1.0}
        reply = {"role": "assistant", "content": "", "reasoning_content": ""}
        finish = None
        with client.stream("POST", base + "/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise SystemExit(f"HTTP {r.status_code}: {r.read().decode()}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                delta = choice.get("delta") or {}
                reply["content"] += delta.get("content") or ""
                reply["reasoning_content"] += delta.get("reasoning_content") or ""
                finish = choice.get("finish_reason") or finish
        if not reply["reasoning_content"]:
            del reply["reasoning_content"]
        messages.append(reply)
        print(json.dumps({"finish": finish}), flush=True)
"""


@pytest.fixture(scope="module")
def qwen3_model() -> Path:
    return cached_model("qwen3")


@pytest.fixture(scope="module")
def vllm_qwen3(qwen3_model, tmp_path_factory) -> Iterator[str]:
    with vllm_server(
        qwen3_model, tmp_path_factory.mktemp("vllm-qwen3") / "server.log", use_env_url=False
    ) as url:
        yield url


def test_qwen3_template_episode_on_vllm_extends_every_call_with_the_models_own_logprobs(
    vllm_qwen3, qwen3_model, tmp_path
):
    from polarproxy.backends.local.model_runner import ModelRunner

    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    db = tmp_path / "rec.db"
    cmd = [sys.executable, "-m", "polarproxy", "record", "--backend", vllm_qwen3, "--model", str(qwen3_model)]
    cmd += ["--db", str(db), "--json", "--", sys.executable, str(agent), str(CUT)]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    calls = Store.open(str(db)).list_calls(record_summary(r.stderr)["episode_id"])
    renderer = Renderer(qwen3_model)
    runner = ModelRunner(qwen3_model)
    assert len(calls) == 3 and all(c.status == "ok" and c.backend_kind == "vllm" for c in calls)
    assert all(c.fidelity == "tokens" for c in calls)
    # T1: the first prompt is the real template's render of the request
    assert calls[0].prompt_ids == renderer.render(Conversation.from_dict(calls[0].conversation)).ids
    # T2: each later call starts with the earlier prompt + everything the model sampled
    assert [c.render_mode for c in calls] == ["fresh", "extended", "extended"], [
        (c.render_mode, c.render_note) for c in calls
    ]
    for prev, cur in itertools.pairwise(calls):
        assert cur.extended_from == prev.id
        n = len(prev.prompt_ids) + len(prev.output_ids)
        assert cur.prompt_ids[:n] == prev.prompt_ids + prev.output_ids
    gaps = []
    for call in calls:
        assert len(call.output_logprobs) == len(call.output_ids) > 0
        scored = runner.score(call.prompt_ids, call.output_ids)
        gaps.append(max(abs(a - b) for a, b in zip(scored, call.output_logprobs, strict=True)))
    print(f"max |vLLM logprob - teacher-forced| = {max(gaps):.2e}", file=sys.stderr)
    assert max(gaps) < TOLERANCE
    # prefix-merge: one trajectory, training exactly the sampled tokens
    out = tmp_path / "merged.jsonl"
    export = [sys.executable, "-m", "polarproxy", "export", "--db", str(db), "--strategy", "prefix-merge"]
    e = subprocess.run([*export, "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert e.returncode == 0, e.stderr
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert sum(row["loss_mask"]) == sum(len(c.output_ids) for c in calls)
    assert row["input_ids"] == calls[-1].prompt_ids + calls[-1].output_ids
