"""Which output format a model writes, detected from its chat template and tokenizer; options override it."""

from __future__ import annotations

import pytest
from factories import TEMPLATES, shared_template

from polarproxy.errors import UsageError
from polarproxy.render.family import (
    detect_tool_format,
    output_format,
    tokenizer_output_format,
)
from polarproxy.tiny.template import CHAT_TEMPLATE

EXPECTED = {
    "qwen3.jinja": ("hermes", "think"),
    "hermes-2-pro-tools.jinja": ("hermes", "none"),
    "qwen3-coder-xml-tools.jinja": ("qwen-xml", "none"),
    "llama3.1-json-tools.jinja": ("llama-json", "none"),
    "deepseek-v3-tools.jinja": ("deepseek", "none"),
    "mistral-parallel-tools.jinja": ("mistral", "none"),
}


def template(name):
    return shared_template(name).read_text()


def test_every_shared_template_has_an_expected_format():
    if not TEMPLATES.is_dir():
        pytest.skip(f"{TEMPLATES} is absent")
    assert sorted(p.name for p in TEMPLATES.glob("*.jinja")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_the_format_is_detected_from_each_real_template(name):
    fmt = output_format(template(name))
    assert (fmt.tool, fmt.reasoning) == EXPECTED[name]


def test_the_tiny_template_is_hermes_with_think():
    fmt = output_format(CHAT_TEMPLATE)
    assert (fmt.tool, fmt.reasoning) == ("hermes", "think")


def test_a_harmony_template_is_detected():
    gpt_oss = "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}"
    assert detect_tool_format(gpt_oss) == "harmony"


def test_tokens_decide_when_the_template_names_no_format():
    assert detect_tool_format("{{ messages }}", ["[TOOL_CALLS]", "[INST]"]) == "mistral"
    assert detect_tool_format("{{ messages }}", ["<|python_tag|>"]) == "llama-json"
    assert detect_tool_format("{{ messages }}") == "hermes"
    assert output_format("{{ messages }}", ["<think>"]).reasoning == "think"


def test_the_options_beat_detection():
    fmt = output_format(template("qwen3.jinja"), tool_format="qwen-xml", reasoning_format="none")
    assert (fmt.tool, fmt.reasoning, fmt.detected) == ("qwen-xml", "none", False)
    assert output_format(template("qwen3.jinja"), tool_format="mistral").reasoning == "think"


@pytest.mark.parametrize(
    ("kw", "allowed"), [({"tool_format": "json"}, "'hermes'"), ({"reasoning_format": "r1"}, "'think'")]
)
def test_an_unknown_format_names_the_allowed_ones(kw, allowed):
    with pytest.raises(UsageError) as e:
        output_format("", **kw)
    assert allowed in e.value.message and "Must be one of" in e.value.message
    assert e.value.hint


def test_the_tiny_tokenizer_is_detected_as_hermes_with_think(tiny_model_dir):
    from polarproxy.render.renderer import Renderer

    fmt = tokenizer_output_format(Renderer(tiny_model_dir).tokenizer)
    assert (fmt.tool, fmt.reasoning) == ("hermes", "think")
