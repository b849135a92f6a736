"""prefix-merge folds a recorded multi-turn thinking episode into one trajectory.

The tiny model's chat template is Qwen3-style: it drops the reasoning of assistant turns before the last
user message. A chat agent that talks for three user turns, each answered with reasoning, is recorded with
`polarproxy record` against the real local backend (a scripted policy whose logprobs are the model's own).
A fresh render of turn 2 would have lost turn 1's `<think>` block; T2 kept each prompt prefix-preserving,
so prefix-merge folds the three calls into one sequence whose trainable tokens are the three sampled
outputs, reasoning included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from polarproxy.conversation import Conversation
from polarproxy.reconstruct import assert_round_trip, prefix_merge
from polarproxy.render.renderer import Renderer
from polarproxy.store import Store

pytestmark = pytest.mark.integration

REASONING = "The user wants a short answer."
TEXT = "Here it is."
AGENT = textwrap.dedent(
    """
    import json, os, httpx
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    tools = [{"type": "function", "function": {"name": "noop", "description": "Do nothing.",
              "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "system", "content": "Think, then answer briefly."}]
    with httpx.Client(headers={"authorization": "Bearer none"}, timeout=300) as client:
        for question in ("What is one plus one?", "And two plus two?", "And three plus three?"):
            messages.append({"role": "user", "content": question})
            r = client.post(base + "/chat/completions",
                            json={"model": "tiny", "messages": messages, "tools": tools, "max_tokens": 64})
            r.raise_for_status()
            reply = r.json()["choices"][0]["message"]
            print(json.dumps({"reasoning": reply.get("reasoning_content"), "content": reply["content"]}))
            messages.append({"role": "assistant", "content": reply["content"]})  # reasoning dropped
    """
)


def _record(tiny_model_dir, backend_url, tmp_path):
    db = tmp_path / "think.db"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "polarproxy",
            "record",
            "--backend",
            backend_url,
            "--model",
            str(tiny_model_dir),
            "--db",
            str(db),
            "--",
            sys.executable,
            "-c",
            AGENT,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    replies = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"reasoning"')]
    assert replies == [{"reasoning": REASONING, "content": TEXT}] * 3
    return db


def test_a_multi_turn_thinking_episode_is_one_trajectory(make_backend, tiny_model_dir, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"steps": [{"reasoning": REASONING, "text": TEXT}], "final": TEXT}))
    backend = make_backend(tiny_model_dir, "--script", str(script))
    db = _record(tiny_model_dir, backend.url, tmp_path)

    store = Store.open(db)
    try:
        calls = store.list_calls(store.list_episodes()[0].id)
    finally:
        store.close()
    assert [c.render_mode for c in calls] == ["fresh", "extended", "extended"]
    renderer = Renderer(tiny_model_dir)
    think = renderer.encode(f"<think>\n{REASONING}\n</think>")
    first = calls[0]
    assert _contains(first.output_ids, think)
    # A fresh render of the later requests drops the earlier reasoning: it would not extend anything.
    fresh = renderer.render(Conversation.from_dict(calls[1].conversation)).ids
    assert fresh[: len(first.prompt_ids) + len(first.output_ids)] != first.prompt_ids + first.output_ids
    assert not _contains(fresh, think)

    (traj,) = prefix_merge(calls)
    assert traj.call_ids == [c.id for c in calls]
    assert_round_trip(traj, calls)
    trainable = [t for t, m in zip(traj.input_ids, traj.loss_mask, strict=True) if m]
    assert trainable == [t for c in calls for t in c.output_ids]
    # Every turn's reasoning is in the merged sequence, as the model saw it.
    assert sum(_contains(traj.input_ids[a:b], think) for a, b in traj.call_spans) == 3
    assert traj.input_ids == calls[-1].prompt_ids + calls[-1].output_ids


def _contains(seq: list[int], part: list[int]) -> bool:
    n = len(part)
    return any(seq[i : i + n] == part for i in range(len(seq) - n + 1))
