"""How T2 computes what it appends, on templates the tests write: the check against the whole
conversation, turns that ended without their end-of-turn token, and the recorded reasons."""

from __future__ import annotations

from array import array

import pytest
from real_templates import TOOLS, Answer, Episode, renderer

from polarproxy.conversation import Completion, Conversation, Message, ToolCall
from polarproxy.errors import UsageError
from polarproxy.render.prefix import PrefixIndex, Turn
from polarproxy.render.renderer import Renderer
from polarproxy.tiny import write_tokenizer_folder

# ChatML that numbers user turns: what it writes after an answer depends on the whole history.
NUMBERED = """{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}{%- set ns.n = ns.n + 1 -%}{{- '<|im_start|>user ' + ns.n|string + '\\n' + m.content + '<|im_end|>\\n' -}}
{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"""


@pytest.fixture(scope="module")
def numbered(tmp_path_factory) -> Renderer:
    return Renderer(write_tokenizer_folder(tmp_path_factory.mktemp("numbered"), chat_template=NUMBERED))


def text_turn(r: Renderer, conv: Conversation, answer: str, call_id: str, *, closing: bool = True) -> Turn:
    prompt = r.render(conv).ids
    end = r.tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = r.encode(answer) + ([end] if closing else [])
    completion = Completion(text=answer, finish_reason="stop" if closing else "length")
    return Turn(
        call_id, conv, completion, array("i", prompt), array("i", out), "<|im_end|>" if closing else None
    )


def test_a_template_that_reads_more_history_is_found_and_rendered_from_the_whole_conversation(numbered):
    index = PrefixIndex(numbered)  # check="once": each shape of continuation at 1, 2, 4, 8... messages
    conv = Conversation(messages=[Message(role="user", content="q1")])
    prompts = []
    for i in range(1, 7):
        p = index.build("ep", conv) if i > 1 else None
        prompt_ids = p.ids if p else numbered.render(conv).ids
        if p:
            prompts.append(p)
            # numbered from the whole conversation: prefix-stable, so the extension is the fresh render
            assert p.mode == "extended" and p.ids == numbered.render(conv).ids
        answer = f"a{i}"
        end = numbered.tokenizer.convert_tokens_to_ids("<|im_end|>")
        out = [*numbered.encode(answer), end]
        completion = Completion(text=answer)
        index.remember(
            "ep", Turn(f"c{i}", conv, completion, array("i", prompt_ids), array("i", out), "<|im_end|>")
        )
        conv = Conversation(
            messages=[
                *conv.messages,
                Message(role="assistant", content=answer),
                Message(role="user", content=f"q{i + 1}"),
            ]
        )
    assert index.needs_history  # the stand-in numbers the new user turn 2; found when the history grew


def test_a_tool_call_cut_by_a_stop_string_is_closed_with_the_template_end_of_turn_only():
    r = renderer("qwen3")
    conv = Conversation(messages=[Message(role="user", content="List.")], tools=TOOLS)
    sampled = '<tool_call>\n{"name": "list_files", "arguments": {"path": "."}}\n</tool_call>\nSTOP'
    call = ToolCall("call_00000001", "list_files", '{"path": "."}')
    completion = Completion(tool_calls=[call], finish_reason="tool_calls")
    turn = Turn("c1", conv, completion, array("i", r.render(conv).ids), array("i", r.encode(sampled)), None)
    index = PrefixIndex(r, check="always")
    index.remember("ep", turn)
    nxt = Conversation(
        messages=[
            *conv.messages,
            completion.as_message(),
            Message(role="tool", content="a.txt", tool_call_id=call.id),
        ],
        tools=TOOLS,
    )
    p = index.build("ep", nxt)
    tail = r.decode(p.ids[len(turn.prompt_ids) + len(turn.output_ids) :])
    assert p.mode == "extended" and p.closing_added == "<|im_end|>"
    assert (
        tail
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_model_that_stopped_on_a_token_the_template_does_not_write_there_is_rendered_fresh():
    r = renderer("qwen3")
    conv = Conversation(messages=[Message(role="user", content="Hi.")])
    turn = text_turn(r, conv, "Hello.", "c1")
    turn = Turn(turn.call_id, conv, turn.completion, turn.prompt_ids, turn.output_ids, "<|endoftext|>")
    index = PrefixIndex(r)
    index.remember("ep", turn)
    nxt = Conversation(
        messages=[
            *conv.messages,
            Message(role="assistant", content="Hello."),
            Message(role="user", content="Bye."),
        ]
    )
    p = index.build("ep", nxt)
    assert p.mode == "fresh"
    assert "ended call c1's answer with '<|endoftext|>'" in p.note and "end-of-turn token" in p.note


def test_an_unknown_prefix_policy_names_the_allowed_ones():
    with pytest.raises(
        UsageError, match=r"Unknown prefix policy 'always'\. Must be one of 'extend', 'fresh'"
    ):
        PrefixIndex(renderer("qwen3"), policy="always")


def test_the_first_call_of_an_episode_under_policy_fresh_has_no_note():
    ep = Episode("qwen3", policy="fresh")
    ep.user("Hi.")
    first = ep.call(Answer(text="Hello."))
    assert first.prompt.mode == "fresh" and first.prompt.note is None and first.prompt.policy == "fresh"
