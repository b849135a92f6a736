"""The renderer over the tiny model's real tokenizer and chat template, and the round trip back."""

from __future__ import annotations

import itertools
import subprocess
import sys

from polarproxy.conversation import Conversation, Message, Tool, ToolCall
from polarproxy.render.detokenize import IncrementalDetokenizer
from polarproxy.render.output_parser import parse_output
from polarproxy.render.renderer import Renderer


def ids():
    c = itertools.count()
    return lambda: f"call_{next(c)}"


def conversation() -> Conversation:
    return Conversation(
        messages=[
            Message(role="system", content="You are terse."),
            Message(role="user", content="List the files."),
            Message(
                role="assistant",
                content="Sure.",
                reasoning="They want ls.",
                tool_calls=[ToolCall(id="c1", name="list_files", arguments='{"path": "."}')],
            ),
        ],
        tools=[Tool(name="list_files", description="List files.", parameters={"type": "object"})],
    )


def test_prompt_ids_are_the_template_text_tokenized_once(tiny_model_dir):
    r = Renderer(tiny_model_dir)
    conv = conversation()
    prompt = r.render(conv)
    assert prompt.text == r.render_text(conv)
    assert r.decode(prompt.ids) == prompt.text
    assert prompt.text.endswith("<|im_start|>assistant\n")
    assert r.tokenizer.convert_tokens_to_ids("<|im_end|>") in r.stop_token_ids


def test_an_assistant_turn_rendered_by_the_template_parses_back_to_the_same_turn(tiny_model_dir):
    r = Renderer(tiny_model_dir)
    conv = conversation()
    without = Conversation(messages=conv.messages[:-1], tools=conv.tools)
    before = r.render_text(without)
    full = r.render_text(conv, add_generation_prompt=False)
    assert full.startswith(before)
    turn = full[len(before) :].removesuffix("<|im_end|>\n")
    parsed = parse_output(turn, new_call_id=ids())
    original = conv.messages[-1]
    assert parsed.text == original.content
    assert parsed.reasoning == original.reasoning
    assert [(t.name, t.arguments) for t in parsed.tool_calls] == [("list_files", '{"path": "."}')]


def test_incremental_detokenizing_never_splits_a_character(tiny_model_dir):
    r = Renderer(tiny_model_dir)
    text = 'naïve café ✓ 日本語テキスト 🙂 <tool_call>\n{"a": 1}\n</tool_call> end'
    token_ids = r.encode(text)
    d = IncrementalDetokenizer(r.decode)
    pieces = [d.push([t]) for t in token_ids] + [d.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_the_proxy_path_does_not_import_torch(tiny_model_dir):
    code = f"""
import sys
import polarproxy.capture.addon, polarproxy.capture.stack
from polarproxy.conversation import Conversation, Message
from polarproxy.render.renderer import Renderer
Renderer({str(tiny_model_dir)!r}).render(Conversation(messages=[Message(role="user", content="hi")]))
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
