"""Scripted policies: the local backend answers from a script instead of sampling.

Real harnesses then run multi-turn tool loops on a tiny model deterministically, while every recorded
token and logprob stays true: the answer's token IDs are the tokenized script text, and their logprobs
come from a teacher-forced forward pass of the model (`ModelRunner.score`).

A script file (YAML or JSON):

    steps:                       # one per call that offers tools, in order
      - reasoning: "I should look around."        # optional, becomes <think>...</think>
        text: "Listing the files."                # optional
        tool_calls:                               # optional
          - {name: run_shell_command, arguments: {command: ls}}
      - raw: "Done."                              # or the model's own output format, verbatim
    side_answer: "A short title"  # calls without tools: titles, routers, commit messages (no step used)
    final: "Done."                # calls after the last step
    no_tools: side                # or `steps`: calls without tools play the steps too (harnesses that
                                  # have no tools, e.g. Aider, whose edits are text in the reply)
    side_when: ["commit message"] # with `no_tools: steps`: calls without tools whose prompt holds one
                                  # of these are side requests and get `side_answer`
    cases:                        # optional: other steps for some calls; the first case that matches wins
      - when: {prompt: "add() subtracts", tool: Bash}   # every condition given must hold: the prompt
        steps: [...]              # holds the text; the tools offered include one of this name
        final: "Could not fix it."                      # optional (default: the script's `final`)

Cases let one script play a different policy per task (a text of its prompt) and per harness (the name of
a tool only that harness offers: Codex `exec_command`, Claude Code `Bash`, Qwen Code `run_shell_command`),
so that one policy solves some tasks under one harness and fails them under another. A case looks at the
prompt up to its last user query (system, tools, the task), never at the tool outputs since.

Which step a call gets is read from its prompt, so the backend keeps no state and concurrent episodes
do not interfere: it is the number of assistant turns since the last user message that is not a tool
result. Calls without tools that play the steps (`no_tools: steps`) cannot count turns that way (such
harnesses send results back as user messages, and may rebuild their history), so there it is the number
of steps, in order, whose reply (without its reasoning) the prompt already holds. Answers are written in
the format of the model's family, read from its chat template (`polarproxy.tiny.formats`: hermes
`<tool_call>` JSON and `<think>` for the tiny template of DESIGN.md §4; Qwen3-Coder XML, Llama 3.1 JSON,
DeepSeek and Mistral for a tiny model built with `--chat-template`); so are the turn markers counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from polarproxy.backends.local.model_runner import GenStep, ModelRunner, SamplingParams
from polarproxy.tiny.formats import HERMES, Family, detect_family

ASSISTANT = "<|im_start|>assistant\n"
USER = "<|im_start|>user\n"
TOOL_RESPONSE = "<tool_response>"
TOOLS_MARK = "</tools>"
THINK_END = "</think>"
FIELDS = ("steps", "side_answer", "final", "no_tools", "side_when", "cases")
WHEN = ("prompt", "tool")
NO_TOOLS = ("side", "steps")


class ScriptError(ValueError):
    """A script file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Step:
    text: str  # the assistant output in the tiny template's format (hermes), without the end-of-turn token
    # the parts of a structured step, for other families' formats; `raw` steps have none
    content: str = ""
    reasoning: str | None = None
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    structured: bool = False

    def for_family(self, family: Family) -> str:
        """The answer as a model of `family` writes it (raw steps are verbatim)."""
        if not self.structured:
            return self.text
        return family.write(self.content, list(self.calls), self.reasoning)


def offers_tool(prompt_text: str, name: str) -> bool:
    """Whether a rendered prompt's tool definitions name a tool `name` (as JSON, or as Qwen3-Coder's XML)."""
    return any(form in prompt_text for form in (f'"{name}"', f"<name>{name}</name>", f"<function={name}>"))


@dataclass(frozen=True, slots=True)
class Case:
    """Steps for the calls whose prompt holds `prompt` and offers a tool named `tool` (each when given)."""

    steps: tuple[Step, ...]
    final: str | None = None
    prompt: str | None = None
    tool: str | None = None

    def matches(self, prompt_text: str) -> bool:
        return (self.prompt is None or self.prompt in prompt_text) and (
            self.tool is None or offers_tool(prompt_text, self.tool)
        )


@dataclass(frozen=True, slots=True)
class Script:
    steps: tuple[Step, ...]
    side_answer: str = "OK"
    final: str = "Done."
    no_tools: str = "side"
    side_when: tuple[str, ...] = ()
    source: str = ""
    cases: tuple[Case, ...] = ()
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def load(path: str | Path) -> Script:
        p = Path(path)
        try:
            raw = p.read_text()
        except OSError as e:
            raise ScriptError(f"Cannot read script '{p}': {e.strerror}.") from e
        try:
            if p.suffix.lower() == ".json":
                data = json.loads(raw)
            else:
                import yaml

                data = yaml.safe_load(raw)
        except Exception as e:  # both parsers raise their own types
            raise ScriptError(
                f"Script '{p}' is not valid {p.suffix.lstrip('.').upper() or 'YAML'}: {e}"
            ) from e
        return Script.from_data(data, source=str(p))

    @staticmethod
    def from_data(data: Any, *, source: str = "<script>") -> Script:
        if not isinstance(data, dict):
            raise ScriptError(f"Script '{source}' must be a mapping with 'steps', not {type(data).__name__}.")
        unknown = set(data) - set(FIELDS)
        if unknown:
            raise ScriptError(
                f"Script '{source}': unknown field(s) {', '.join(sorted(map(repr, unknown)))}. "
                f"Allowed: {', '.join(map(repr, FIELDS))}."
            )
        steps = data.get("steps")
        if not isinstance(steps, list) or not steps:
            raise ScriptError(f"Script '{source}': 'steps' must be a non-empty list.")
        for key in ("side_answer", "final"):
            if key in data and not isinstance(data[key], str):
                raise ScriptError(f"Script '{source}': '{key}' must be a string.")
        no_tools = data.get("no_tools", "side")
        if no_tools not in NO_TOOLS:
            raise ScriptError(
                f"Script '{source}': 'no_tools' is {no_tools!r}; allowed: {', '.join(map(repr, NO_TOOLS))}."
            )
        side_when = data.get("side_when", [])
        if not isinstance(side_when, list) or not all(isinstance(m, str) and m for m in side_when):
            raise ScriptError(f"Script '{source}': 'side_when' must be a list of non-empty strings.")
        if side_when and no_tools != "steps":
            raise ScriptError(
                f"Script '{source}': 'side_when' applies only with 'no_tools: steps' "
                "(else every call without tools is a side request)."
            )
        return Script(
            steps=tuple(_step(s, i, source) for i, s in enumerate(steps)),
            side_answer=data.get("side_answer", "OK"),
            final=data.get("final", "Done."),
            no_tools=no_tools,
            side_when=tuple(side_when),
            source=source,
            cases=_cases(data.get("cases", []), source),
        )

    def reply_for(self, prompt_text: str, family: Family | None = None) -> str:
        """The assistant output (in `family`'s format; the tiny template's by default) for a rendered
        prompt."""
        if family is None:
            family = HERMES_THINK
        # cases look at the prompt up to its last user query (system, tools, the task): never at the tool
        # outputs or answers since, which could name another case's text or tool
        head = family.task_part(prompt_text)
        case = next((c for c in self.cases if c.matches(head)), None)
        steps = case.steps if case is not None else self.steps
        final = case.final if case is not None and case.final is not None else self.final
        if family.tools_marker not in prompt_text:
            if self.no_tools == "side" or any(m in prompt_text for m in self.side_when):
                return self.side_answer
            index = steps_in_history(prompt_text, steps, family)
        else:
            index = family.step_index(prompt_text)
        return steps[index].for_family(family) if index < len(steps) else final


HERMES_THINK = replace(HERMES, reasoning=True)  # the tiny template's format


def steps_in_history(prompt_text: str, steps: tuple[Step, ...], family: Family | None = None) -> int:
    """How many steps, in order, the prompt already holds as replies (their text after any reasoning)."""
    n = 0
    for step in steps:
        text = step.for_family(family) if family is not None else step.text
        visible = text.split(THINK_END, 1)[-1].strip()
        if not visible or visible not in prompt_text:
            break
        n += 1
    return n


def step_index(prompt_text: str) -> int:
    """Assistant turns since the last user message that is not a tool result (the generation prompt
    at the end does not count)."""
    start = 0
    pos = prompt_text.find(USER)
    while pos >= 0:
        body = prompt_text[pos + len(USER) :]
        if not body.startswith(TOOL_RESPONSE):
            start = pos
        pos = prompt_text.find(USER, pos + 1)
    turns = prompt_text.count(ASSISTANT, start)
    return max(turns - 1, 0)


def _cases(raw: Any, source: str) -> tuple[Case, ...]:
    if not isinstance(raw, list):
        raise ScriptError(f"Script '{source}': 'cases' must be a list of {{when, steps, final}} mappings.")
    out = []
    for i, case in enumerate(raw):
        where = f"Script '{source}': cases[{i}]"
        if not isinstance(case, dict) or set(case) - {"when", "steps", "final"}:
            raise ScriptError(f"{where} must be a mapping of 'when', 'steps' and optionally 'final'.")
        when = case.get("when")
        if not isinstance(when, dict) or not when or set(when) - set(WHEN):
            raise ScriptError(
                f"{where}.when must give 'prompt' (a text of the prompt), 'tool' (a tool name) or both."
            )
        if not all(isinstance(v, str) and v for v in when.values()):
            raise ScriptError(f"{where}.when: 'prompt' and 'tool' must be non-empty strings.")
        steps = case.get("steps")
        if not isinstance(steps, list) or not steps:
            raise ScriptError(f"{where}.steps must be a non-empty list.")
        final = case.get("final")
        if final is not None and not isinstance(final, str):
            raise ScriptError(f"{where}.final must be a string.")
        out.append(
            Case(
                steps=tuple(_step(s, j, source, f"cases[{i}].steps") for j, s in enumerate(steps)),
                final=final,
                prompt=when.get("prompt"),
                tool=when.get("tool"),
            )
        )
    return tuple(out)


def _step(raw: Any, i: int, source: str, at: str = "steps") -> Step:
    where = f"Script '{source}': {at}[{i}]"
    if isinstance(raw, str):
        return Step(text=raw)
    if not isinstance(raw, dict):
        raise ScriptError(f"{where} must be a string or a mapping, not {type(raw).__name__}.")
    unknown = set(raw) - {"raw", "reasoning", "text", "tool_calls"}
    if unknown:
        raise ScriptError(
            f"{where}: unknown field(s) {', '.join(sorted(map(repr, unknown)))}. "
            "Allowed: 'raw', or 'reasoning', 'text', 'tool_calls'."
        )
    if "raw" in raw:
        if len(raw) > 1 or not isinstance(raw["raw"], str):
            raise ScriptError(f"{where}: 'raw' must be a string and stand alone.")
        return Step(text=raw["raw"])
    parts: list[str] = []
    structured: list[tuple[str, dict[str, Any]]] = []
    reasoning = raw.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise ScriptError(f"{where}.reasoning must be a string.")
        parts.append(f"<think>\n{reasoning}\n</think>\n\n")
    text = raw.get("text", "")
    if not isinstance(text, str):
        raise ScriptError(f"{where}.text must be a string.")
    calls = raw.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ScriptError(f"{where}.tool_calls must be a list.")
    rendered = []
    for j, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ScriptError(f"{where}.tool_calls[{j}] needs a string 'name'.")
        args = call.get("arguments", {})
        if not isinstance(args, dict):
            raise ScriptError(f"{where}.tool_calls[{j}].arguments must be a mapping.")
        body = json.dumps({"name": call["name"], "arguments": args}, ensure_ascii=False)
        rendered.append(f"<tool_call>\n{body}\n</tool_call>")
        structured.append((call["name"], args))
    body_text = text
    if rendered:
        body_text = (text + "\n" if text else "") + "\n".join(rendered)
    if not body_text and reasoning is None:
        raise ScriptError(f"{where} is empty: give 'text', 'tool_calls', 'reasoning' or 'raw'.")
    return Step(
        text="".join(parts) + body_text,
        content=text,
        reasoning=reasoning,
        calls=tuple(structured),
        structured=True,
    )


def runner_family(runner: ModelRunner, script: Script) -> Family:
    """The family of the runner's chat template (found once per script)."""
    template = getattr(runner.tokenizer, "chat_template", None) or ""
    key = ("family", template)
    if key not in script._cache:
        script._cache[key] = detect_family(template) if template else HERMES_THINK
    return script._cache[key]


def scripted_steps(
    runner: ModelRunner, script: Script, prompt: list[int], params: SamplingParams
) -> Iterator[GenStep]:
    """The script's answer for `prompt` as generation steps: token IDs of its text plus the end-of-turn
    token, each with the model's teacher-forced logprob; cut at `max_new_tokens` (finish 'length')."""
    runner.check_prompt(prompt)
    family = runner_family(runner, script)
    reply = script.reply_for(runner.decode(prompt, skip_special_tokens=False), family)
    eos = runner.eos_token_ids[0]
    for token in (family.eos, runner.tokenizer.eos_token):
        end = runner.tokenizer.convert_tokens_to_ids(token) if token else None
        if isinstance(end, int) and end >= 0 and end != runner.tokenizer.unk_token_id:
            eos = end
            break
    ids = [*runner.encode(reply), eos]
    limit = params.max_new_tokens
    if limit == 0:
        return _emit([])
    ids = ids[:limit]
    logprobs = runner.score(prompt, ids, temperature=params.logprob_temperature)
    steps = []
    for i, (tid, lp) in enumerate(zip(ids, logprobs, strict=True)):
        finish = None
        if i == len(ids) - 1:
            finish = {"type": "stop", "matched": tid} if tid == eos else {"type": "length", "length": limit}
        steps.append(GenStep(tid, lp, finish))
    return _emit(steps)


def _emit(steps: list[GenStep]) -> Iterator[GenStep]:
    """A generator (the server closes what it iterates), over steps computed up front."""
    yield from steps
