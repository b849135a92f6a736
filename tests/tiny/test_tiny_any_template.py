"""`build_tiny_model(..., chat_template=...)`: a tiny model for a real family's chat template loads offline,
holds the special tokens the template writes, stops on the template's end-of-turn token, and the local
backend's scripts answer in that family's tool-call format (so every dialect runs offline on it)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from factories import shared_template

from polarproxy.conversation import Conversation, Message, Tool
from polarproxy.render.output_parser import parse_output
from polarproxy.render.renderer import Renderer
from polarproxy.tiny.formats import detect_family, end_of_turn, template_tokens

REPO = Path(__file__).resolve().parents[2]
NAMES = (
    "deepseek-v3-tools",
    "hermes-2-pro-tools",
    "llama3.1-json-tools",
    "mistral-parallel-tools",
    "qwen3-coder-xml-tools",
    "qwen3",
)
END_OF_TURN = {
    "deepseek-v3-tools": "<｜end▁of▁sentence｜>",  # noqa: RUF001
    "hermes-2-pro-tools": "<|im_end|>",
    "llama3.1-json-tools": "<|eot_id|>",
    "mistral-parallel-tools": "</s>",
    "qwen3-coder-xml-tools": "<|im_end|>",
    "qwen3": "<|im_end|>",
}
FAMILY = {
    "deepseek-v3-tools": "deepseek",
    "hermes-2-pro-tools": "hermes",
    "llama3.1-json-tools": "llama-json",
    "mistral-parallel-tools": "mistral",
    "qwen3-coder-xml-tools": "qwen-xml",
    "qwen3": "hermes",
}
TOOLS = [
    Tool(
        name="list_files",
        description="List files.",
        parameters={"type": "object", "properties": {"path": {"type": "string", "description": "Dir."}}},
    ),
    Tool(
        name="read_file",
        description="Read a file.",
        parameters={"type": "object", "properties": {"path": {"type": "string", "description": "File."}}},
    ),
]
SCRIPT = {
    "steps": [
        {"reasoning": "Look first.", "tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
    ],
    "final": "Done.",
}


def template_path(name: str) -> Path:
    return shared_template(name)


def cached_model(name: str) -> Path:
    """The random-weights tiny model for template `name`, built once per kit version under .cache/."""
    from polarproxy.tiny import build_tiny_model

    path = template_path(name)
    h = hashlib.sha256(path.read_bytes())
    for p in sorted((REPO / "polarproxy" / "tiny").glob("*.py")):
        h.update(p.name.encode() + p.read_bytes())
    target = REPO / ".cache" / f"tiny-{name}-{h.hexdigest()[:16]}"
    if not (target / "config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".building-"))
        build_tiny_model(tmp / "m", train_steps=0, chat_template=path)
        try:
            os.rename(tmp / "m", target)
        except OSError:
            pass  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@pytest.fixture(scope="module", params=NAMES)
def built(request) -> tuple[str, Path]:
    return request.param, cached_model(request.param)


def test_the_model_loads_offline_and_stops_on_the_templates_end_of_turn_token(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    name, folder = built
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
    eos = GenerationConfig.from_pretrained(str(folder), local_files_only=True).eos_token_id
    stop = eos[0] if isinstance(eos, list) else eos
    assert tok.convert_ids_to_tokens(stop) == END_OF_TURN[name] == tok.eos_token
    # ...which is what the template writes right after an assistant answer
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
    rendered = tok.apply_chat_template(messages, tokenize=False)
    assert (
        end_of_turn(rendered, "Hello there", template_tokens(template_path(name).read_text()).special)
        == (END_OF_TURN[name])
    )
    assert Renderer(folder).stop_token_ids[0] == stop


def test_every_marker_the_template_writes_is_one_token(built):
    name, folder = built
    r = Renderer(folder)
    found = template_tokens(template_path(name).read_text())
    assert found.special, name
    for marker in (*found.special, *found.added):
        assert len(r.encode(marker)) == 1, marker
    # the tokenizer never splits a rendered prompt's markers into pieces
    conv = Conversation(messages=[Message(role="user", content="List the files.")], tools=TOOLS)
    ids = r.render(conv).ids
    assert r.decode(ids) == r.render_text(conv)


def test_scripted_tool_calls_come_out_in_the_familys_format_and_parse_back(built):
    from polarproxy.backends.local.model_runner import ModelRunner, SamplingParams
    from polarproxy.backends.local.script import Script, scripted_steps

    name, folder = built
    r = Renderer(folder)
    runner = ModelRunner(folder, device="cpu")
    script = Script.from_data(SCRIPT)
    family = detect_family(r.tokenizer.chat_template)
    assert family.name == FAMILY[name]
    conv = Conversation(
        messages=[Message(role="user", content="List the files, then read README.md.")], tools=TOOLS
    )
    calls_seen = []
    for _ in range(2):
        prompt = r.render(conv).ids
        steps = list(
            scripted_steps(runner, script, prompt, SamplingParams.from_dict({"max_new_tokens": 256}))
        )
        ids = [s.token_id for s in steps]
        assert ids[-1] == r.stop_token_ids[0] and steps[-1].finish_reason["type"] == "stop"
        assert all(s.logprob <= 0 for s in steps)
        text = r.decode(ids[:-1])
        completion = parse_output(
            text, new_call_id=lambda: "call_00000001", tool_format=family.name, tools=TOOLS
        )
        assert len(completion.tool_calls) == 1, text
        call = completion.tool_calls[0]
        calls_seen.append(call.name)
        conv = Conversation(
            messages=[
                *conv.messages,
                completion.as_message(),
                Message(role="tool", content="README.md", tool_call_id=call.id),
            ],
            tools=TOOLS,
        )
    # the prompt's turn markers tell the script which step comes next, in every family's format
    assert calls_seen == ["list_files", "read_file"]
    prompt = r.render(conv).ids
    final = list(scripted_steps(runner, script, prompt, SamplingParams.from_dict({"max_new_tokens": 64})))
    assert r.decode([s.token_id for s in final[:-1]]) == "Done."


def test_a_template_build_refuses_training_steps(tmp_path):
    from polarproxy.tiny import build_tiny_model

    with pytest.raises(ValueError, match="train_steps=0"):
        build_tiny_model(tmp_path / "m", train_steps=5, chat_template=template_path("qwen3"))
