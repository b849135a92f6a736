"""The tiny model's chat template renders exactly the Qwen3-style format the proxy depends on."""

from __future__ import annotations

import random

import pytest

from polarproxy.tiny import script

TOOL = {
    "type": "function",
    "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}},
}
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}}\n'
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


@pytest.fixture(scope="module")
def tok(random_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(random_model_dir)


@pytest.fixture(scope="module")
def render(tok):
    def _render(messages, **kwargs):
        return tok.apply_chat_template(messages, tokenize=False, **kwargs)

    return _render


def _call(name, arguments, call_id="call_0"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_system_and_user_turns_with_generation_prompt(render):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(messages, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_generation_prompt_without_thinking_has_an_empty_think_block(render):
    messages = [{"role": "user", "content": "Hi"}]
    assert render(messages, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render(messages, add_generation_prompt=True, enable_thinking=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_follow_the_system_text(render):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(messages, tools=[TOOL]) == (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_BLOCK + "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_tools_without_system_message_start_the_system_turn(render):
    assert render([{"role": "user", "content": "Hi"}], tools=[TOOL]) == (
        "<|im_start|>system\n" + TOOLS_BLOCK + "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_bare_function_tools_are_wrapped(render):
    assert render([{"role": "user", "content": "Hi"}], tools=[TOOL["function"]]) == render(
        [{"role": "user", "content": "Hi"}], tools=[TOOL]
    )


def test_assistant_tool_calls_after_content(render):
    messages = [
        {"role": "user", "content": "Go"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                _call("list_files", {"path": "."}),
                _call("read_file", '{"path":"a b"}', "call_1"),
            ],
        },
    ]
    assert render(messages) == (
        "<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\nLet me look.\n<tool_call>\n"
        '{"name": "list_files", "arguments": {"path": "."}}\n</tool_call>\n<tool_call>\n'
        '{"name": "read_file", "arguments": {"path":"a b"}}\n</tool_call><|im_end|>\n'
    )


def test_assistant_tool_call_without_content_has_no_leading_newline(render):
    messages = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "", "tool_calls": [_call("list_files", {"path": "."})]},
    ]
    assert render(messages) == (
        "<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "list_files", "arguments": {"path": "."}}\n</tool_call><|im_end|>\n'
    )
    none_content = [messages[0], dict(messages[1], content=None)]
    assert render(none_content) == render(messages)


def test_non_ascii_arguments_are_not_escaped(render):
    messages = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "", "tool_calls": [_call("read_file", {"path": "café/日本.md"})]},
    ]
    assert '{"name": "read_file", "arguments": {"path": "café/日本.md"}}' in render(messages)


def test_consecutive_tool_results_share_one_user_turn(render):
    messages = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "", "tool_calls": [_call("a", {}), _call("b", {}, "call_1")]},
        {"role": "tool", "tool_call_id": "call_0", "content": "r1"},
        {"role": "tool", "tool_call_id": "call_1", "content": "r2"},
        {"role": "assistant", "content": "Done."},
    ]
    assert render(messages) == (
        "<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
        '{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n"
        "<tool_response>\nr2\n</tool_response><|im_end|>\n<|im_start|>assistant\nDone.<|im_end|>\n"
    )


def test_reasoning_is_kept_only_after_the_last_user_message(render):
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "x", "reasoning_content": "r0"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "y", "reasoning_content": "r1"},
    ]
    assert render(messages) == (
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nx<|im_end|>\n"
        "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\ny<|im_end|>\n"
    )


def test_reasoning_survives_tool_turns_after_the_last_user_message(render):
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "reasoning_content": "plan", "tool_calls": [_call("f", {})]},
        {"role": "tool", "tool_call_id": "call_0", "content": "ok"},
    ]
    assert render(messages) == (
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\nplan\n</think>\n\n<tool_call>\n"
        '{"name": "f", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
    )


def test_empty_reasoning_renders_like_a_prompt_without_thinking(render):
    prefix = [{"role": "user", "content": "Hi"}]
    with_reply = [*prefix, {"role": "assistant", "content": "x", "reasoning_content": ""}]
    assert (
        render(with_reply)
        == render(prefix, add_generation_prompt=True, enable_thinking=False) + "x<|im_end|>\n"
    )


def test_content_parts_are_concatenated(render):
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render(messages) == "<|im_start|>user\nab<|im_end|>\n"


def test_scripted_conversation_renders_prefix_preservingly(render):
    rng = random.Random(3)
    for thinking in (True, False):
        messages = script.scripted_conversation(script.USER_PROMPTS[0], script.random_workspace(rng))
        if not thinking:
            messages = [dict(m, reasoning_content="") if m["role"] == "assistant" else m for m in messages]
        full = render(messages, tools=script.TOOLS, enable_thinking=thinking)
        replies = 0
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                prompt = render(
                    messages[:i], tools=script.TOOLS, add_generation_prompt=True, enable_thinking=thinking
                )
                assert full.startswith(prompt)
                assert full[len(prompt) :].startswith(script.EXPECTED_REPLIES[replies] + "<|im_end|>\n")
                replies += 1
        assert replies == 3


def test_template_file_and_tokenizer_config_agree(random_model_dir):
    import json

    from polarproxy.tiny.template import CHAT_TEMPLATE

    config = json.loads((random_model_dir / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert (random_model_dir / "chat_template.jinja").read_text() == CHAT_TEMPLATE
