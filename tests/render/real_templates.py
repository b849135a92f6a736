"""Real chat templates for render tests: a tokenizer folder per template (the tiny kit's tokenizer with the
special tokens that template writes, random nothing: no model weights needed), built once per kit version
under .cache/, and a scripted multi-turn episode driven through `PrefixIndex` the way the gateway does."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from factories import shared_template

from polarproxy.conversation import Completion, Conversation, Message, Tool, ToolCall
from polarproxy.render.prefix import PrefixIndex, Prompt, Turn
from polarproxy.render.renderer import Renderer
from polarproxy.tiny.formats import Family, detect_family

REPO = Path(__file__).resolve().parents[2]
TINY = "tiny"  # the project's own template
NAMES = (
    "deepseek-v3-tools",
    "hermes-2-pro-tools",
    "llama3.1-json-tools",
    "mistral-parallel-tools",
    "qwen3-coder-xml-tools",
    "qwen3",
    TINY,
)
_folders: dict[str, Path] = {}
_renderers: dict[str, Renderer] = {}


def template_text(name: str) -> str | None:
    return None if name == TINY else shared_template(name).read_text()


def _key(template: str | None) -> str:
    h = hashlib.sha256((template or "").encode())
    for p in sorted((REPO / "polarproxy" / "tiny").glob("*.py")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def template_folder(name: str) -> Path:
    """A tokenizer folder for template `name`, cached under .cache/ (safe across parallel runs)."""
    if name in _folders:
        return _folders[name]
    from polarproxy.tiny import write_tokenizer_folder

    template = template_text(name)
    target = REPO / ".cache" / f"template-{name}-{_key(template)}"
    if not (target / "tokenizer.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".building-"))
        write_tokenizer_folder(tmp / "t", chat_template=template)
        try:
            os.rename(tmp / "t", target)
        except OSError:
            pass  # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    _folders[name] = target
    return target


def renderer(name: str) -> Renderer:
    if name not in _renderers:
        _renderers[name] = Renderer(template_folder(name))
    return _renderers[name]


def family(name: str) -> Family:
    return detect_family(renderer(name).tokenizer.chat_template)


TOOLS = [
    Tool(
        name="list_files",
        description="List the files in a directory.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Directory."}},
        },
    ),
    Tool(
        name="read_file",
        description="Read a text file.",
        parameters={"type": "object", "properties": {"path": {"type": "string", "description": "File."}}},
    ),
]


@dataclass
class Answer:
    """What the scripted model samples for one call."""

    text: str = ""
    calls: list[tuple[str, dict]] = field(default_factory=list)
    reasoning: str | None = None
    cut_after: int | None = None  # finish 'length' after this many tokens (no end-of-turn token)


@dataclass
class Call:
    conversation: Conversation
    prompt: Prompt
    turn: Turn


class Episode:
    """A harness and a scripted model around one `PrefixIndex`: each call is built by the index, the
    model's answer is tokenized in the family's own format, and the harness sends the answer back."""

    def __init__(
        self, name: str, *, policy: str = "extend", system: str = "You are a careful coding agent."
    ) -> None:
        self.name = name
        self.r = renderer(name)
        self.family = family(name)
        self.index = PrefixIndex(self.r, policy=policy, check="always")
        self.messages: list[Message] = [Message(role="system", content=system)]
        self.calls: list[Call] = []
        self._ids = 0
        eos = self.r.tokenizer.eos_token
        self.eos_id = self.r.tokenizer.convert_tokens_to_ids(eos)
        self.eos = eos

    def conversation(self) -> Conversation:
        return Conversation(messages=list(self.messages), tools=TOOLS)

    def user(self, text: str) -> None:
        self.messages.append(Message(role="user", content=text))

    def system(self, text: str) -> None:
        self.messages.append(Message(role="system", content=text))

    def call(self, answer: Answer) -> Call:
        conv = self.conversation()
        prompt = self.index.build("ep", conv)
        sampled = self.family.write(answer.text, answer.calls, answer.reasoning)
        out = self.r.encode(sampled)
        closing: str | None = self.eos
        if answer.cut_after is not None:
            out, closing = out[: answer.cut_after], None
            finish = "length"
        else:
            out = [*out, self.eos_id]
            finish = "tool_calls" if answer.calls else "stop"
        calls = []
        for name, args in answer.calls if closing is not None else []:
            self._ids += 1
            calls.append(ToolCall(f"call_{self._ids:08x}", name, _json(args)))
        text = answer.text if closing is not None else self.r.decode(out)
        completion = Completion(
            text=text,
            reasoning=answer.reasoning if closing is not None and self.family.reasoning else None,
            tool_calls=calls,
            finish_reason=finish,  # type: ignore[arg-type]
        )
        turn = Turn(
            f"c{len(self.calls) + 1}",
            conv,
            completion,
            prompt.tokens,
            array("i", out),
            closing,
            fold=prompt.fold,
        )
        self.index.remember("ep", turn)
        self.messages.append(completion.as_message())
        call = Call(conv, prompt, turn)
        self.calls.append(call)
        return call

    def tool_results(self, results: dict[str, str]) -> None:
        """One tool message per call of the last answer, in order; `results` by tool name."""
        for t in self.messages[-1].tool_calls:
            self.messages.append(Message(role="tool", content=results[t.name], tool_call_id=t.id))


def _json(args: dict) -> str:
    import json

    return json.dumps(args, ensure_ascii=False)


def run_standard_episode(name: str, *, policy: str = "extend") -> Episode:
    """Tool calls, tool results, a final answer, a follow-up user message, an answer cut by max_tokens,
    reasoning where the family has it, parallel tool calls where the family allows them."""
    ep = Episode(name, policy=policy)
    fam = ep.family
    ep.user("List the files, then read README.md.")
    ep.call(Answer(calls=[("list_files", {"path": "."})], reasoning="I should look around first."))
    ep.tool_results({"list_files": "README.md\nsrc/\nsetup.cfg"})
    parallel = fam.name != "llama-json"
    second = [("read_file", {"path": "README.md"})] + ([("list_files", {"path": "src"})] if parallel else [])
    ep.call(Answer(calls=second, reasoning="README.md is there."))
    ep.tool_results({"read_file": '# Demo\n\nA small "demo" tool.', "list_files": "main.py"})
    ep.call(Answer(text="The README describes a small demo tool.", reasoning="Enough to answer."))
    ep.user("Now explain it in detail, please.")
    ep.call(Answer(text="The demo tool is a small program that reads files and prints reports", cut_after=7))
    ep.user("Shorter, please.")
    ep.call(Answer(calls=[("read_file", {"path": "setup.cfg"})], reasoning="Check the config."))
    ep.tool_results({"read_file": "[metadata]\nname = demo"})
    ep.call(Answer(text="A demo tool named demo."))
    ep.user("Thanks.")
    ep.call(Answer(text="You are welcome."))
    return ep
