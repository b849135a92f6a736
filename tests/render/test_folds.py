"""Folds: a conversation a chat template refuses as it stands (a second system message, a system message
inside the conversation, roles that do not alternate) is folded in one documented way, recorded, and
keeps the earlier turns' tokens from call to call; templates that accept it render it in place."""

from __future__ import annotations

import json

import pytest
from real_templates import TOOLS, Answer, Episode, renderer, template_text

from polarproxy.conversation import Conversation, Message, ToolCall
from polarproxy.dialects.anthropic import AnthropicMessages
from polarproxy.dialects.openai_responses import OpenAIResponses
from polarproxy.render.folds import fold, fold_level, fold_name
from polarproxy.render.renderer import Renderer, TemplateRefused
from polarproxy.tiny import write_tokenizer_folder

# A ChatML template that refuses a system message anywhere but first (as Qwen3.5's does).
ONE_SYSTEM = """{%- for m in messages -%}
{%- if m.role == 'system' and not loop.first -%}{{ raise_exception('System message must be at the beginning.') }}{%- endif -%}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"""


@pytest.fixture(scope="module")
def one_system(tmp_path_factory) -> Renderer:
    return Renderer(write_tokenizer_folder(tmp_path_factory.mktemp("one-system"), chat_template=ONE_SYSTEM))


def msgs(*pairs: tuple[str, str]) -> list[Message]:
    return [Message(role=role, content=text) for role, text in pairs]  # type: ignore[arg-type]


def test_each_fold_looks_only_backwards_so_a_prefix_folds_the_same_way_later():
    history = msgs(
        ("system", "S"), ("developer-as-system", "D"), ("user", "U1"), ("system", "R"), ("user", "U2")
    )
    history[1].role = "system"
    for level in range(4):
        whole = fold(history, level)
        for k in range(1, len(history)):
            part = fold(history[:k], level)
            assert whole[: len(part) - 1] == part[:-1]  # only the last folded message can still grow


def test_fold_names_round_trip():
    assert fold_name(0) is None and fold_level(None) == 0
    for level in (1, 2, 3):
        assert fold_level(fold_name(level)) == level
    assert fold_name(2) == "system-merged+system-into-user"


def test_a_template_that_accepts_system_messages_anywhere_renders_them_in_place():
    r = renderer("qwen3")
    conv = Conversation(messages=msgs(("system", "S"), ("user", "U"), ("system", "Reminder"), ("user", "U2")))
    text, level = r.render_folded(conv)
    assert level == 0 and "<|im_start|>system\nReminder<|im_end|>" in text
    assert r.render(conv).fold is None


def test_a_second_leading_system_message_is_merged_into_the_first(one_system):
    conv = Conversation(messages=msgs(("system", "S"), ("system", "D"), ("user", "U")))
    p = one_system.render(conv)
    assert p.fold == "system-merged"
    assert p.text.startswith("<|im_start|>system\nS\n\nD<|im_end|>\n<|im_start|>user\nU<|im_end|>")


def test_a_system_message_inside_the_conversation_joins_the_user_message_before_it(one_system):
    conv = Conversation(
        messages=msgs(("system", "S"), ("user", "U"), ("system", "Reminder"), ("assistant", "A"))
    )
    p = one_system.render(conv)
    assert p.fold == "system-merged+system-into-user"
    assert "<|im_start|>user\nU\n\nReminder<|im_end|>\n<|im_start|>assistant\nA" in p.text


def test_a_template_that_refuses_even_the_folded_conversation_raises_a_clear_error():
    r = renderer("llama3.1-json-tools")
    two_calls = Message(
        role="assistant",
        tool_calls=[ToolCall("call_00000001", "ls", "{}"), ToolCall("call_00000002", "ls", "{}")],
    )
    conv = Conversation(messages=[*msgs(("user", "U")), two_calls])
    with pytest.raises(TemplateRefused, match="only supports single tool-calls"):
        r.render(conv)


def _codex_and_claude(traffic):
    codex = traffic("codex")[-1]
    claude = traffic("claude")[-1]
    return (
        OpenAIResponses().parse(
            codex["body"] if isinstance(codex["body"], dict) else json.loads(codex["body"])
        ),
        AnthropicMessages().parse(
            claude["body"] if isinstance(claude["body"], dict) else json.loads(claude["body"])
        ),
    )


def test_codex_developer_item_and_claude_code_inner_system_message_on_mistral(traffic):
    codex, claude = _codex_and_claude(traffic)
    r = renderer("mistral-parallel-tools")
    # Codex: system + developer up front and two user messages in a row: all three folds
    assert [m.role for m in codex.messages[:4]] == ["system", "system", "user", "user"]
    assert r.render(codex).fold == "system-merged+system-into-user+users-joined"
    # Claude Code: a system message between the user's prompt and the answer
    assert [m.role for m in claude.messages[:3]] == ["system", "user", "system"]
    p = r.render(claude)
    assert p.fold == "system-merged+system-into-user"
    assert claude.messages[2].content[:40] in p.text
    for name in ("qwen3", "deepseek-v3-tools", "hermes-2-pro-tools"):  # they take them in place
        assert renderer(name).render(codex).fold is None and renderer(name).render(claude).fold is None


def test_a_folded_episode_keeps_extending_and_records_its_fold():
    ep = Episode("mistral-parallel-tools")
    ep.user("List the files.")
    ep.system("Reminder: be brief.")  # Claude Code style, inside the conversation
    first = ep.call(Answer(calls=[("list_files", {"path": "."})]))
    ep.tool_results({"list_files": "README.md"})
    second = ep.call(Answer(text="One file."))
    ep.user("Thanks.")
    third = ep.call(Answer(text="Welcome."))
    assert first.prompt.fold == "system-merged+system-into-user"
    for call in (second, third):
        assert call.prompt.mode == "extended" and call.prompt.fold == "system-merged+system-into-user"
    assert "Reminder: be brief." in ep.r.decode(third.prompt.ids)


def test_a_new_system_message_the_template_moves_before_the_answer_is_rendered_fresh_with_the_reason():
    ep = Episode("mistral-parallel-tools")
    ep.user("List the files.")
    ep.call(Answer(calls=[("list_files", {"path": "."})]))
    ep.tool_results({"list_files": "README.md"})
    ep.system("Reminder: the user is waiting.")  # no user message follows: folds into the first one
    p = ep.call(Answer(text="One file.")).prompt
    assert p.mode == "fresh" and p.fold == "system-merged+system-into-user"
    assert "message 4 (system)" in p.note and "earlier in the prompt" in p.note


def test_deepseek_moves_every_system_message_to_the_front_so_a_new_one_cannot_be_appended():
    ep = Episode("deepseek-v3-tools")
    ep.user("List the files.")
    ep.call(Answer(text="Which folder?"))
    ep.system("Reminder: use the tools.")
    ep.user("This one.")
    p = ep.call(Answer(text="OK.")).prompt
    assert p.mode == "fresh" and "message 3 (system)" in p.note


def test_a_tool_message_without_name_gets_the_name_of_the_call_it_answers():
    r = renderer("hermes-2-pro-tools")
    call = ToolCall("call_00000001", "list_files", '{"path": "."}')
    conv = Conversation(
        messages=[
            *msgs(("user", "U")),
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", content="README.md", tool_call_id="call_00000001"),
        ],
        tools=TOOLS,
    )
    assert '{"name": "list_files", "content": "README.md"}' in r.render(conv).text


@pytest.mark.parametrize(
    "name, form",
    [
        ("qwen3", "string"),
        ("tiny", "string"),
        ("qwen3-coder-xml-tools", "object"),
        ("llama3.1-json-tools", "object"),
        ("deepseek-v3-tools", "object"),
        ("hermes-2-pro-tools", "object"),
        ("mistral-parallel-tools", "object"),
    ],
)
def test_tool_call_arguments_are_handed_over_as_the_template_reads_them(name, form):
    r = renderer(name)
    assert r.arguments_form == form
    call = ToolCall("call_00000001", "read_file", '{"path": "README.md"}')
    conv = Conversation(
        messages=[*msgs(("user", "U")), Message(role="assistant", tool_calls=[call])], tools=TOOLS
    )
    text = r.render_folded(conv, add_generation_prompt=False)[0]
    assert '\\"path\\"' not in text  # never the JSON text quoted as a string
    assert "README.md" in text
    if name == "qwen3-coder-xml-tools":
        assert "<parameter=path>\nREADME.md\n</parameter>" in text
    assert template_text(name) is None or "polarproxy" not in text
