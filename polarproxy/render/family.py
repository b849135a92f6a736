# ruff: noqa: RUF001, RUF002  (DeepSeek spells its special tokens with U+FF5C FULLWIDTH VERTICAL LINE)
"""Which output format a model writes, detected from its chat template and tokenizer, or given by the user.

The chat template shows how the model was taught to write tool calls (it renders earlier calls the same
way, or tells the model the format in its system prompt), so its source names the format:

| template mentions | tool format |
|---|---|
| `<|channel|>` (gpt-oss harmony) | harmony |
| `<｜tool▁calls▁begin｜>` | deepseek |
| `[TOOL_CALLS]` | mistral |
| `<function=` | qwen-xml (Qwen3-Coder, Qwen3.5) |
| `"parameters"` with `<|python_tag|>` or `ipython` | llama-json |
| `<tool_call>` | hermes (Qwen2.5, Qwen3, Hermes) |

A template that names none of them is checked against the tokenizer's added tokens in the same order,
then falls back to hermes. Reasoning is `think` when the template or the tokens have `<think>`, else
`none`. `--tool-format` and `--reasoning-format` override what is detected.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from polarproxy.errors import UsageError
from polarproxy.render.output_parser import REASONING_FORMATS
from polarproxy.render.parsers import TOOL_FORMATS

DEFAULT_TOOL_FORMAT = "hermes"

# (format, what the template or the vocabulary must contain: every group needs one of its strings)
_SIGNS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("harmony", (("<|channel|>",),)),
    ("deepseek", (("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),)),
    ("mistral", (("[TOOL_CALLS]",),)),
    ("qwen-xml", (("<function=",),)),
    ("llama-json", (('"parameters"',), ("<|python_tag|>", "ipython"))),
    ("hermes", (("<tool_call>",),)),
)
# Tokens alone (no template text) that name a format.
_TOKEN_SIGNS: tuple[tuple[str, str], ...] = (
    ("harmony", "<|channel|>"),
    ("deepseek", "<｜tool▁calls▁begin｜>"),
    ("mistral", "[TOOL_CALLS]"),
    ("llama-json", "<|python_tag|>"),
    ("hermes", "<tool_call>"),
)


@dataclass(frozen=True, slots=True)
class OutputFormat:
    tool: str  # one of TOOL_FORMATS
    reasoning: str  # one of REASONING_FORMATS
    detected: bool = True  # False when both were given by the user


def _matches(text: str, groups: tuple[tuple[str, ...], ...]) -> bool:
    return all(any(s in text for s in group) for group in groups)


def detect_tool_format(template: str, tokens: Iterable[str] = ()) -> str:
    """The tool-call format that `template` (and, failing that, the tokenizer's added `tokens`) names."""
    for name, groups in _SIGNS:
        if _matches(template, groups):
            return name
    vocab = set(tokens)
    for name, token in _TOKEN_SIGNS:
        if token in vocab:
            return name
    return DEFAULT_TOOL_FORMAT


def detect_reasoning_format(template: str, tokens: Iterable[str] = ()) -> str:
    return "think" if "<think>" in template or "<think>" in set(tokens) else "none"


def check_tool_format(value: str) -> str:
    if value not in TOOL_FORMATS:
        raise UsageError(
            f"Unknown tool format {value!r}. Must be one of {', '.join(map(repr, TOOL_FORMATS))}.",
            hint="Leave --tool-format unset to detect it from the model's chat template.",
        )
    return value


def check_reasoning_format(value: str) -> str:
    if value not in REASONING_FORMATS:
        raise UsageError(
            f"Unknown reasoning format {value!r}. Must be one of {', '.join(map(repr, REASONING_FORMATS))}.",
            hint="Leave --reasoning-format unset to detect it from the model's chat template.",
        )
    return value


def output_format(
    template: str,
    tokens: Iterable[str] = (),
    *,
    tool_format: str | None = None,
    reasoning_format: str | None = None,
) -> OutputFormat:
    """The format to parse: what the user gave, else what the template and tokens show."""
    tokens = list(tokens)
    tool = check_tool_format(tool_format) if tool_format else detect_tool_format(template, tokens)
    reasoning = (
        check_reasoning_format(reasoning_format)
        if reasoning_format
        else detect_reasoning_format(template, tokens)
    )
    return OutputFormat(tool=tool, reasoning=reasoning, detected=not (tool_format and reasoning_format))


def template_text(tokenizer: Any) -> str:
    """A tokenizer's chat template source; all of them when it has several named ones."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    if isinstance(template, list):  # [{"name": ..., "template": ...}]
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else ""


def added_tokens(tokenizer: Any) -> list[str]:
    """The tokenizer's added (special and control) tokens, where it can list them."""
    get = getattr(tokenizer, "get_added_vocab", None)
    try:
        return list(get()) if callable(get) else []
    except Exception:  # a tokenizer without an added vocabulary
        return []


def tokenizer_output_format(
    tokenizer: Any, *, tool_format: str | None = None, reasoning_format: str | None = None
) -> OutputFormat:
    """`output_format` for a transformers tokenizer (its chat template and added tokens)."""
    return output_format(
        template_text(tokenizer),
        added_tokens(tokenizer),
        tool_format=tool_format,
        reasoning_format=reasoning_format,
    )
