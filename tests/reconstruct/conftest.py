"""A real store holding two recorded episodes: tool calls, reasoning, a failed and an in-flight call."""

from __future__ import annotations

import pytest

from polarproxy.store import CallResult, CallStart, EpisodeStart, Store

TOOLS = [
    {"name": "read_file", "description": "Read a file.", "parameters": {"type": "object", "properties": {}}}
]


def _start(eid: str, messages: list[dict], prompt: list[int]) -> CallStart:
    return CallStart(
        episode_id=eid,
        dialect="openai_chat",
        method="POST",
        path="/v1/chat/completions",
        model="tiny-qwen3",
        stream=True,
        request_headers={},
        request_body="{}",
        prompt_ids=prompt,
        backend_kind="sglang",
        conversation={"messages": messages, "tools": TOOLS, "sampling": {}, "model": "tiny-qwen3"},
    )


def _done(output: list[int], completion: dict, **kw) -> CallResult:
    return CallResult(
        status="ok",
        output_ids=output,
        output_logprobs=[-0.5 - i / 8 for i in range(len(output))],
        completion=completion,
        finish_reason=completion.get("finish_reason", "stop"),
        weight_version="w7",
        **kw,
    )


def record_sample(store: Store) -> dict[str, list[str]]:
    """Two episodes; returns {episode_id: [call ids in order]}."""
    out: dict[str, list[str]] = {}
    user = {"role": "user", "content": "read a.txt", "tool_calls": [], "reasoning": None}
    sys_msg = {"role": "system", "content": "You are terse.", "tool_calls": []}

    ep1 = store.create_episode(EpisodeStart(command=["pi"], harness="pi", task="t", group_id="g1"))
    turn1 = {
        "text": "",
        "reasoning": "need the file",
        "finish_reason": "tool_calls",
        "tool_calls": [{"id": "call_a", "name": "read_file", "arguments": '{"path": "a.txt"}'}],
    }
    c1, _ = store.begin_call(_start(ep1, [sys_msg, user], [1, 2, 3, 4]))
    store.finish_call(c1, _done([10, 11, 12], turn1))
    assistant = {
        "role": "assistant",
        "content": "",
        "reasoning": "need the file",
        "tool_calls": turn1["tool_calls"],
    }
    tool = {"role": "tool", "content": "hello", "tool_call_id": "call_a", "tool_calls": []}
    c2, _ = store.begin_call(_start(ep1, [sys_msg, user, assistant, tool], [1, 2, 3, 4, 10, 11, 12, 5, 6]))
    store.finish_call(c2, _done([13, 14], {"text": "It says hello.", "reasoning": None, "tool_calls": []}))
    c3, _ = store.begin_call(_start(ep1, [user], [7, 8]))
    store.finish_call(
        c3, CallResult(status="failed", error="backend 500", output_ids=[20], output_logprobs=[-3.0])
    )
    c4, _ = store.begin_call(_start(ep1, [user], [9]))  # left in flight
    store.finish_episode(ep1, status="ok", exit_code=0)
    store.set_reward(ep1, 1.0)
    out[ep1] = [c1, c2, c3, c4]

    ep2 = store.create_episode(EpisodeStart(command=["pi"], harness="pi", task="t", group_id="g1"))
    c5, _ = store.begin_call(_start(ep2, [user], [1, 2]))
    store.finish_call(c5, _done([30], {"text": "no", "reasoning": None, "tool_calls": []}))
    out[ep2] = [c5]
    return out


@pytest.fixture
def recorded(tmp_path):
    store = Store.open(tmp_path / "pp.db")
    ids = record_sample(store)
    yield store, ids
    store.close()
