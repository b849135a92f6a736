# ruff: noqa: RUF001, RUF002, RUF003  (DeepSeek markup is written with full-width bars: they are its real tokens)
"""Model families as a chat template shows them: the special tokens it writes, its end-of-turn token, and
how a model of that family writes tool calls and reasoning, and where its prompts mark turns.

Pure Python (no torch, no transformers): the tiny-model build reads a template's tokens from here, and the
local backend's scripts (`polarproxy.backends.local.script`) write scripted answers in the family's own
format, so a tiny model built for any real template plays tool loops through every dialect offline.

| family | tool calls the model writes | turns in a prompt |
|---|---|---|
| hermes (Qwen2.5/Qwen3, Hermes 2 Pro, the tiny template) | `<tool_call>\\n{"name": N, "arguments": A}\\n</tool_call>` | `<\\|im_start\\|>assistant\\n` |
| qwen-xml (Qwen3-Coder, Qwen3.5) | `<tool_call>\\n<function=N>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>` | `<\\|im_start\\|>assistant\\n` |
| llama-json (Llama 3.1) | `{"name": N, "parameters": A}` (one call a turn) | `<\\|start_header_id\\|>assistant<\\|end_header_id\\|>` |
| deepseek (V3) | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\\n```json\\nA\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>` | `<｜User｜>` |
| mistral | `[TOOL_CALLS] [{"name": N, "arguments": A}]` | `[INST]` |

Reasoning (`<think>\\n...\\n</think>\\n\\n` before the answer) is written only for templates that have it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# Named as `polarproxy.render.family` names tool formats (its detector picks the family).
FAMILIES = ("hermes", "qwen-xml", "llama-json", "deepseek", "mistral")

# Markup a template writes as literal text: <|...|>, DeepSeek's full-width <｜...｜>, [INST]-style tags.
SPECIAL_PATTERNS = (r"<\|[A-Za-z0-9_]+\|>", r"<｜[^｜<>\s]{1,40}｜>", r"\[/?[A-Z][A-Z_]{2,}\]")
# Tags that real tokenizers of these families hold as added tokens (not special: they are text).
ADDED_TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
PAD = "<|endoftext|>"


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    bos: str  # what `bos_token` is for this family's tokenizers
    eos: str  # what `eos_token` is (the end of an assistant turn)
    user_marker: str  # where a user turn starts in a prompt
    turn_marker: str  # counted since the last user turn: one per assistant turn (see `step_index`)
    counts_generation_prompt: bool  # the generation prompt at the end holds a `turn_marker` too
    tool_result_marker: str | None  # a user turn starting with this holds tool results, not a query
    tools_marker: str  # in a prompt exactly when tools are offered
    reasoning: bool = False  # the template has `<think>` reasoning

    def write(self, text: str, calls: list[tuple[str, dict[str, Any]]], reasoning: str | None) -> str:
        """An assistant answer as this family's model writes it (without the end-of-turn token)."""
        head = f"<think>\n{reasoning}\n</think>\n\n" if reasoning is not None and self.reasoning else ""
        if not calls:
            return head + text
        if self.name == "hermes":
            body = "\n".join(_hermes(name, args) for name, args in calls)
            return head + (text + "\n" if text else "") + body
        if self.name == "qwen-xml":
            body = "\n".join(_xml(name, args) for name, args in calls)
            return head + (text + "\n" if text else "") + body
        if self.name == "llama-json":
            if len(calls) > 1:
                raise ValueError("Llama 3.1 makes one tool call a turn; the script's step has more.")
            name, args = calls[0]
            return head + json.dumps({"name": name, "parameters": args}, ensure_ascii=False)
        if self.name == "deepseek":
            body = "\n".join(
                f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n"
                f"{json.dumps(args, ensure_ascii=False)}\n```<｜tool▁call▁end｜>"
                for name, args in calls
            )
            return head + text + "<｜tool▁calls▁begin｜>" + body + "<｜tool▁calls▁end｜>"
        arr = ", ".join(json.dumps({"name": n, "arguments": a}, ensure_ascii=False) for n, a in calls)
        return head + f"[TOOL_CALLS] [{arr}]"

    def last_query(self, prompt_text: str) -> int:
        """Where the last user query (a user turn that is not tool results) starts (0: none)."""
        start = 0
        pos = prompt_text.find(self.user_marker)
        while pos >= 0:
            body = prompt_text[pos + len(self.user_marker) :]
            if self.tool_result_marker is None or not body.startswith(self.tool_result_marker):
                start = pos
            pos = prompt_text.find(self.user_marker, pos + 1)
        return start

    def step_index(self, prompt_text: str) -> int:
        """Assistant turns since the last user query, not counting the generation prompt: which scripted
        step a prompt asks for."""
        turns = prompt_text.count(self.turn_marker, self.last_query(prompt_text))
        return max(turns - 1, 0) if self.counts_generation_prompt else turns

    def task_part(self, prompt_text: str) -> str:
        """The prompt up to the end of its last user query: system, tools, context and the task, without the
        answers and tool outputs of the turns since."""
        end = prompt_text.find(self.turn_marker, self.last_query(prompt_text))
        return prompt_text if end < 0 else prompt_text[:end]


def _hermes(name: str, args: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n</tool_call>"


def _xml(name: str, args: dict[str, Any]) -> str:
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


CHATML = dict(
    bos=PAD,
    eos="<|im_end|>",
    user_marker="<|im_start|>user\n",
    turn_marker="<|im_start|>assistant\n",
    counts_generation_prompt=True,
    tool_result_marker="<tool_response>",
    tools_marker="</tools>",
)
HERMES = Family("hermes", **CHATML)  # type: ignore[arg-type]


def detect_family(template: str) -> Family:
    """The family whose tool-call format `template` writes, as the proxy's output side detects it
    (`polarproxy.render.family.detect_tool_format`; hermes when it shows none)."""
    from polarproxy.render.family import detect_tool_format

    think = "<think>" in template
    name = detect_tool_format(template)
    if name == "qwen-xml":
        return Family("qwen-xml", **CHATML, reasoning=think)  # type: ignore[arg-type]
    if name == "deepseek":
        return Family(
            "deepseek",
            bos="<｜begin▁of▁sentence｜>",
            eos="<｜end▁of▁sentence｜>",
            user_marker="<｜User｜>",
            turn_marker="<｜tool▁calls▁begin｜>",
            counts_generation_prompt=False,
            tool_result_marker=None,
            tools_marker="</tools>",
            reasoning=think,
        )
    if name == "mistral":
        return Family(
            "mistral",
            bos="<s>",
            eos="</s>",
            user_marker="[INST]",
            turn_marker="[TOOL_CALLS]",
            counts_generation_prompt=False,
            tool_result_marker=None,
            tools_marker="[AVAILABLE_TOOLS]",
            reasoning=think,
        )
    if name == "llama-json":
        return Family(
            "llama-json",
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
            user_marker="<|start_header_id|>user<|end_header_id|>",
            turn_marker="<|start_header_id|>assistant<|end_header_id|>",
            counts_generation_prompt=True,
            tool_result_marker=None,
            tools_marker="Given the following functions",
            reasoning=think,
        )
    if name != "hermes":
        raise ValueError(
            f"Tool format {name!r} has no tiny-model writer; supported: {', '.join(map(repr, FAMILIES))}."
        )
    return Family("hermes", **CHATML, reasoning=think)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TemplateTokens:
    """The tokens a tokenizer needs for a template: special markup (never split, never merged), added
    tags (text the family's tokenizers hold as one token), and the values of `bos_token`/`eos_token`."""

    special: tuple[str, ...]
    added: tuple[str, ...]
    bos: str
    eos: str
    pad: str = PAD


def template_tokens(template: str) -> TemplateTokens:
    """The markup `template` writes, found by scanning its source (deterministic: in order of first use)."""
    family = detect_family(template)
    found: dict[int, str] = {}
    for pattern in SPECIAL_PATTERNS:
        for m in re.finditer(pattern, template):
            found.setdefault(m.start(), m.group(0))
    special: list[str] = []
    for _, tok in sorted(found.items()):
        if tok not in special:
            special.append(tok)
    for tok in (PAD, family.bos, family.eos):
        if tok not in special:
            special.append(tok)
    added = tuple(t for t in ADDED_TAGS if t in template and t not in special)
    return TemplateTokens(special=tuple(special), added=added, bos=family.bos, eos=family.eos)


def end_of_turn(rendered: str, answer: str, special: tuple[str, ...]) -> str | None:
    """The special token the template writes first after an assistant `answer` in `rendered`."""
    at = rendered.rfind(answer)
    if at < 0:
        return None
    rest = rendered[at + len(answer) :]
    hits = [(i, tok) for tok in special if (i := rest.find(tok)) >= 0]
    return min(hits, key=lambda h: (h[0], -len(h[1])))[1] if hits else None
