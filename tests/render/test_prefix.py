"""T2: a call that extends an earlier one is prompted with the earlier prompt + output + the template's
rendering of only the new messages; anything else is rendered fresh, with the reason recorded."""

from __future__ import annotations

from array import array
from dataclasses import replace

import pytest

from polarproxy.conversation import Completion, Conversation, Message, Tool, ToolCall
from polarproxy.render.prefix import PrefixIndex, Turn
from polarproxy.render.renderer import Renderer

TOOLS = [Tool(name="ls", description="List files.", parameters={"type": "object"})]


@pytest.fixture
def r(tiny_model_dir) -> Renderer:
    return Renderer(tiny_model_dir)


def first_turn(r: Renderer, *, reasoning: str | None = None, stop: bool = True):
    conv = Conversation(
        messages=[
            Message(role="system", content="Be brief."),
            Message(role="user", content="List the files."),
        ],
        tools=TOOLS,
    )
    prompt = r.render(conv).ids
    sampled = (f"<think>\n{reasoning}\n</think>\n\n" if reasoning else "") + (
        '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
    )
    end = r.tokenizer.convert_tokens_to_ids("<|im_end|>")
    output = r.encode(sampled) + ([end] if stop else [])
    completion = Completion(
        reasoning=reasoning,
        tool_calls=[ToolCall("call_ab12", "ls", '{"path": "."}')],
        finish_reason="tool_calls",
    )
    turn = Turn(
        "call_1", conv, completion, array("i", prompt), array("i", output), "<|im_end|>" if stop else None
    )
    return conv, turn


def next_request(
    conv: Conversation,
    arguments: str = '{"path": "."}',
    reasoning: str | None = None,
    then: list[Message] | None = None,
) -> Conversation:
    assistant = Message(
        role="assistant", reasoning=reasoning, tool_calls=[ToolCall("call_ab12", "ls", arguments)]
    )
    tool = Message(role="tool", content="README.md\nmain.py", tool_call_id="call_ab12")
    return Conversation(messages=[*conv.messages, assistant, tool, *(then or [])], tools=conv.tools)


def test_extension_is_earlier_prompt_plus_output_plus_the_new_messages(r):
    conv, turn = first_turn(r)
    index = PrefixIndex(r)
    index.remember("ep", turn)
    req = next_request(conv)
    p = index.build("ep", req)
    assert p.mode == "extended" and p.extended_from == "call_1" and p.note is None
    assert p.ids[: len(turn.prompt_ids) + len(turn.output_ids)] == [*turn.prompt_ids, *turn.output_ids]
    # nothing was dropped or re-serialized here, so the fresh render is the same token for token:
    # the rendering of the new messages is exactly the template's
    assert p.ids == r.render(req).ids
    # one int32 array, whose leading part is the earlier call's arrays copied (no Python int per token)
    assert p.tokens.typecode == "i" and p.tokens.tolist() == p.ids


def test_the_model_keeps_seeing_its_own_tokens_where_a_fresh_render_would_drift(r):
    conv, turn = first_turn(r, reasoning="The user wants a listing.")
    index = PrefixIndex(r)
    index.remember("ep", turn)
    # the harness re-serializes the arguments and drops the reasoning; then the user asks again
    req = next_request(conv, arguments='{"path":"."}', then=[Message(role="user", content="And again?")])
    p = index.build("ep", req)
    assert p.mode == "extended"
    fresh = r.render(req).ids
    assert fresh != p.ids  # a re-tokenizing system would train on a context the model never saw
    assert p.ids[: len(turn.prompt_ids) + len(turn.output_ids)] == [*turn.prompt_ids, *turn.output_ids]
    assert r.decode(p.ids).endswith("<|im_start|>user\nAnd again?<|im_end|>\n<|im_start|>assistant\n")


def test_an_output_cut_by_length_is_closed_by_the_template(r):
    conv, turn = first_turn(r, stop=False)
    index = PrefixIndex(r)
    index.remember("ep", turn)
    p = index.build("ep", next_request(conv))
    tail = r.decode(p.ids[len(turn.prompt_ids) + len(turn.output_ids) :])
    assert p.mode == "extended" and tail.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")


@pytest.mark.parametrize(
    "change, reason",
    [
        (
            lambda c: replace(c, messages=[Message(role="system", content="Be long."), *c.messages[1:]]),
            "message 0 differs",
        ),
        (lambda c: replace(c, tools=[]), "tools differ"),
        (
            lambda c: replace(
                c,
                messages=[
                    *c.messages[:2],
                    replace(c.messages[2], tool_calls=[ToolCall("call_other", "ls", "{}")]),
                    *c.messages[3:],
                ],
            ),
            "message 2 is not the assistant turn",
        ),
        (lambda c: replace(c, messages=c.messages[:3]), "no new messages"),
    ],
)
def test_anything_else_is_rendered_fresh_with_the_reason(r, change, reason):
    conv, turn = first_turn(r)
    index = PrefixIndex(r)
    index.remember("ep", turn)
    req = change(next_request(conv))
    p = index.build("ep", req)
    assert p.mode == "fresh" and reason in p.note
    assert p.ids == r.render(req).ids


def test_calls_of_other_episodes_are_never_extended(r):
    conv, turn = first_turn(r)
    index = PrefixIndex(r)
    index.remember("ep_a", turn)
    p = index.build("ep_b", next_request(conv))
    assert p.mode == "fresh" and p.note is None


def test_build_within_makes_only_the_extensions_whose_cost_does_not_grow_with_the_conversation(r):
    conv, turn = first_turn(r)
    index = PrefixIndex(r)
    assert index.build_within("ep", conv, 10_000) is None  # no earlier call: a fresh render
    index.remember("ep", turn)
    req = next_request(conv)
    # the first continuation of this shape is checked against a whole-conversation render
    assert index.build_within("ep", req, 10_000) is None
    built = index.build("ep", req)
    again = index.build_within("ep", req, 10_000)
    assert again is not None and again.mode == "extended" and again.tokens == built.tokens
    assert index.build_within("ep", req, 5) is None  # the new messages are longer than the budget
    edited = replace(req, messages=[Message(role="system", content="Be long."), *req.messages[1:]])
    assert index.build_within("ep", edited, 10_000) is None  # a fresh render
    assert PrefixIndex(r, policy="fresh").build_within("ep", req, 10_000) is None


def test_build_within_leaves_the_stores_read_of_an_unknown_episode_to_build(r):
    conv, turn = first_turn(r)
    loads: list[str] = []
    index = PrefixIndex(r, loader=lambda ep: loads.append(ep) or [turn])
    assert index.build_within("ep", next_request(conv), 10_000) is None and loads == []
    assert index.build("ep", next_request(conv)).mode == "extended" and loads == ["ep"]
