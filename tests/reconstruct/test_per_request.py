import dataclasses

import pytest

from polarproxy.reconstruct import assert_round_trip, get_strategy, per_request, reconstruct
from polarproxy.store import CallResult, CallStart, EpisodeStart


def _episodes(store):
    return {e.id: e for e in store.list_episodes(limit=None)}


def test_one_trajectory_per_ok_call_with_prompt_masked_and_output_trainable(recorded):
    store, ids = recorded
    calls = {c.id: c for c in store.iter_calls()}
    trajs = list(per_request(store.iter_calls(), episodes=_episodes(store)))
    ep1, ep2 = ids
    assert [t.call_ids for t in trajs] == [[ids[ep1][0]], [ids[ep1][1]], [ids[ep2][0]]]
    for t in trajs:
        call = calls[t.call_ids[0]]
        p, o = len(call.prompt_ids), len(call.output_ids)
        assert t.input_ids == call.prompt_ids + call.output_ids
        assert t.loss_mask == [0] * p + [1] * o
        assert t.logprobs == [None] * p + call.output_logprobs
        assert len(t.input_ids) == len(t.loss_mask) == len(t.logprobs)
        assert (t.strategy, t.model, t.weight_version, t.episode_id) == (
            "per-request",
            "tiny-qwen3",
            "w7",
            call.episode_id,
        )
        assert_round_trip(t, [call])


def test_failed_calls_only_with_include_failed_and_in_flight_never(recorded):
    store, ids = recorded
    ep1 = next(iter(ids))
    with_failed = list(per_request(store.iter_calls(), include_failed=True))
    assert [t.call_ids[0] for t in with_failed if t.episode_id == ep1] == ids[ep1][:3]
    failed = with_failed[2]
    assert failed.metadata["call_status"] == "failed" and failed.loss_mask == [0, 0, 1]
    assert_round_trip(failed, [store.get_call(ids[ep1][2])])


def test_messages_are_openai_style_and_end_with_the_reply(recorded):
    store, _ids = recorded
    first, second, _ = per_request(store.iter_calls())
    assert first.messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "read a.txt"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "need the file",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                }
            ],
        },
    ]
    assert first.finish_reason == "tool_calls"
    assert second.messages[3] == {"role": "tool", "content": "hello", "tool_call_id": "call_a"}
    assert second.messages[-1] == {"role": "assistant", "content": "It says hello."}
    assert first.tools == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]


def test_reward_and_group_come_from_the_episode_and_a_call_reward_overrides(recorded):
    store, ids = recorded
    ep1, _ep2 = ids
    episodes = _episodes(store)
    trajs = list(per_request(store.iter_calls(), episodes=episodes))
    assert [(t.reward, t.group_id) for t in trajs] == [(1.0, "g1"), (1.0, "g1"), (None, "g1")]
    assert trajs[0].metadata == {
        "dialect": "openai_chat",
        "harness": "pi",
        "task": "t",
        "fidelity": "tokens",
        "render_mode": "fresh",
        "backend": "",
        "backend_kind": "sglang",
        "call_status": "ok",
        "has_tools": True,
        "episode_metadata": episodes[ep1].metadata,  # the task's and the rollout's keys
    }
    calls = list(store.iter_calls([ep1], status="ok"))
    calls[1].reward = 0.25
    assert [t.reward for t in per_request(calls, episodes=episodes)] == [1.0, 0.25]
    assert [t.reward for t in per_request(calls)] == [None, 0.25]  # no episodes given


def test_round_trip_check_catches_every_kind_of_drift(recorded):
    store, _ = recorded
    call = next(store.iter_calls(status="ok"))
    good = next(per_request([call]))
    assert_round_trip(good, [call])
    tampered = {
        "a prompt token trainable": {"loss_mask": [1, *good.loss_mask[1:]]},
        "an output token masked": {"loss_mask": [*good.loss_mask[:-1], 0]},
        "a logprob changed": {"logprobs": [*good.logprobs[:-1], -9.0]},
        "a logprob on a masked token": {"logprobs": [-1.0, *good.logprobs[1:]]},
        "an output id changed": {"input_ids": [*good.input_ids[:-1], 99]},
        "a prompt id changed": {"input_ids": [99, *good.input_ids[1:]]},
        "a token appended": {
            "input_ids": [*good.input_ids, 5],
            "loss_mask": [*good.loss_mask, 0],
            "logprobs": [*good.logprobs, None],
        },
        "lengths differ": {"logprobs": good.logprobs[:-1]},
        "a mask value of 2": {"loss_mask": [2, *good.loss_mask[1:]]},
    }
    for what, change in tampered.items():
        with pytest.raises(AssertionError, match="T4 violated"):
            assert_round_trip(dataclasses.replace(good, **change), [call])
            pytest.fail(f"not caught: {what}")


def test_strategies_are_looked_up_by_name():
    assert get_strategy("per-request") is per_request
    assert list(reconstruct("per-request", [])) == []
    with pytest.raises(ValueError, match=r"Unknown strategy 'prefix'. Must be one of 'per-request'"):
        get_strategy("prefix")


def test_side_requests_are_ordinary_calls_marked_as_having_no_tools(recorded):
    """A title/router/commit-message request offers no tools: it stays a call of its episode, marked so."""
    store, _ids = recorded
    ep = store.create_episode(EpisodeStart(command=["opencode"]))
    tool = {"name": "ls", "description": "List.", "parameters": {"type": "object", "properties": {}}}
    ids = []
    for tools, prompt in (([tool], [1, 2]), ([], [4])):
        conv = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "sampling": {}, "model": "m"}
        start = CallStart(
            episode_id=ep,
            dialect="openai_chat",
            method="POST",
            path="/v1/chat/completions",
            model="m",
            stream=False,
            request_headers={},
            request_body="{}",
            prompt_ids=prompt,
            backend_kind="sglang",
            conversation=conv,
        )
        call_id, _ = store.begin_call(start)
        store.finish_call(call_id, CallResult(status="ok", output_ids=[3], output_logprobs=[-0.1]))
        ids.append(call_id)
    main, side = ids
    calls = {c.id: c for c in store.list_calls(ep)}
    assert calls[main].has_tools and not calls[side].has_tools
    rows = {t.call_ids[0]: t.metadata["has_tools"] for t in per_request(store.list_calls(ep))}
    assert rows == {main: True, side: False}
