"""Render a neutral `Conversation` into the prompt token IDs the backend consumes.

The tokenizer and chat template come from the model folder as transformers reads it (render/snapshot.py,
once per folder; torch is never imported here). Rendering is `apply_chat_template`
(render/chat_template.py: transformers' way, without importing it) followed by a plain encode without added
special tokens, so the IDs are exactly the template's text, tokenized once.

What real templates need, handled here the same way for every call:
- tool-call arguments are handed over as the template reads them: the JSON text where it writes a string
  verbatim (Qwen3, the tiny template), the parsed object where it iterates `arguments|items` or writes
  `arguments|tojson` (Qwen3-Coder, Llama 3.1, DeepSeek, Hermes, Mistral). Which one is found once per
  template by rendering a probe conversation (`arguments_form`).
- a tool message without `name` gets the name of the tool call it answers (Hermes raises without it).
- a conversation the template refuses as it stands (it raises) is folded (`polarproxy.render.folds`) and
  the fold used is recorded; a template that accepts it renders it in place.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from polarproxy import heap
from polarproxy.conversation import Conversation, Message, Tool, ToolCall
from polarproxy.errors import UsageError
from polarproxy.render import snapshot
from polarproxy.render.chat_template import ChatTokenizer
from polarproxy.render.folds import FOLDS, fold, fold_name

ArgumentsForm = Literal["string", "object"]
PROBE_ARGUMENTS = '{"polarproxy_probe": "argument-value"}'


def _arguments(text: str, form: ArgumentsForm) -> Any:
    """Tool-call arguments as the template reads them; text that is not a JSON object stays text."""
    if form == "string":
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def template_message(
    m: Message, *, arguments_form: ArgumentsForm = "string", name: str | None = None
) -> dict[str, Any]:
    """A neutral message as the chat template expects it (OpenAI-style keys; arguments as JSON text, or
    parsed with `arguments_form="object"`; `name` for a tool message that has none)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning:
        out["reasoning_content"] = m.reasoning
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": t.id,
                "type": "function",
                "function": {"name": t.name, "arguments": _arguments(t.arguments, arguments_form)},
            }
            for t in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    elif name is not None:
        out["name"] = name
    return out


def template_messages(
    messages: list[Message], arguments_form: ArgumentsForm = "string"
) -> list[dict[str, Any]]:
    """The messages for the template; each tool message carries the name of the call it answers."""
    names = {t.id: t.name for m in messages for t in m.tool_calls}
    return [
        template_message(
            m,
            arguments_form=arguments_form,
            name=names.get(m.tool_call_id) if m.role == "tool" and m.tool_call_id is not None else None,
        )
        for m in messages
    ]


def template_tool(t: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


def _load_tokenizer(path: Path) -> ChatTokenizer:
    """The folder's tokenizer and chat template (render/snapshot.py: transformers reads the folder once,
    later loads read what it found)."""
    return snapshot.load(path)


@dataclass(slots=True)
class RenderedPrompt:
    text: str
    ids: list[int]
    fold: str | None = None  # the fold the template needed (`polarproxy.render.folds`), None: as sent


class TemplateRefused(ValueError):
    """The chat template refuses the conversation even after every fold. The gateway answers 400."""


_NO_CHAT_TEMPLATE_HINT = "Add chat_template.jinja (or chat_template in tokenizer_config.json) to the folder."
_LOADED = ("tokenizer", "_fast", "stop_token_ids")  # what loading the tokenizer sets
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _has_chat_template(path: Path) -> bool:
    """Whether the folder names a chat template where transformers looks for one, read without it."""
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def _stop_ids(tokenizer: Any, path: Path) -> list[int]:
    ids: list[int] = []
    gen = path / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _load(path: Path, model_dir: str | Path) -> dict[str, Any]:
    """The attributes of `_LOADED` for a model folder; UsageError saying what is wrong with it."""
    try:
        tokenizer = _load_tokenizer(path)
    except Exception as e:  # transformers raises many types for an unreadable folder
        raise UsageError(
            f"Cannot load a tokenizer from '{model_dir}': {e}",
            hint="The folder needs tokenizer.json (or tokenizer files) that transformers can load offline.",
        ) from e
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"The tokenizer in '{model_dir}' has no chat template.", hint=_NO_CHAT_TEMPLATE_HINT)
    # the Rust tokenizer: encode/decode without overhead
    return {
        "tokenizer": tokenizer,
        "_fast": tokenizer.backend_tokenizer,
        "stop_token_ids": _stop_ids(tokenizer, path),
    }


class Renderer:
    """One model folder's tokenizer and chat template.

    `defer=True` (the proxy's start-up) checks the folder without loading anything (it exists, holds
    tokenizer files, names a chat template) and leaves the tokenizer unloaded: reading it takes ~0.1 s from
    its snapshot, ~1.5 s the first time (transformers' import), which a `record` would otherwise spend
    before its harness starts. `load_in_background()`
    then loads it in a daemon thread while the harness starts up, `await ready()` waits for it off the
    event loop, and any other use of the tokenizer waits for it (or loads it) there and then. A load
    that fails raises its UsageError at that first use."""

    def __init__(self, model_dir: str | Path, *, defer: bool = False) -> None:
        self._loading: Future[dict[str, Any]] | None = None
        self._arguments_form: ArgumentsForm | None = None
        path = Path(model_dir)
        if not path.is_dir():
            raise UsageError(
                f"Model folder '{model_dir}' does not exist.",
                hint="Pass --model DIR with a folder holding tokenizer.json and a chat template "
                "(`polarproxy tiny-model ./tiny` builds one).",
            )
        self.model_dir = path
        self._source = model_dir
        if not defer:
            self.__dict__.update(_load(path, model_dir))
        elif not any((path / name).is_file() for name in _TOKENIZER_FILES):
            raise UsageError(
                f"The model folder '{model_dir}' holds no tokenizer ({', '.join(_TOKENIZER_FILES)}).",
                hint="Pass --model DIR with the model's tokenizer files and chat template.",
            )
        elif not _has_chat_template(path):
            raise UsageError(
                f"The model folder '{model_dir}' has no chat template.", hint=_NO_CHAT_TEMPLATE_HINT
            )

    tokenizer: ChatTokenizer
    _fast: Any
    stop_token_ids: list[int]

    def __getattr__(self, name: str) -> Any:
        # Reached only while a deferred tokenizer is not loaded yet (then the attributes are set).
        if name in _LOADED:
            self._ensure_loaded()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def loaded(self) -> bool:
        return "tokenizer" in self.__dict__

    def load_in_background(self) -> None:
        """Start loading a deferred tokenizer in a daemon thread (nothing waits for it at exit)."""
        if self.loaded or self._loading is not None:
            return
        future: Future[dict[str, Any]] = Future()
        self._loading = future

        def load() -> None:
            try:
                loaded = _load(self.model_dir, self._source)
                heap.settle()  # the tokenizer and transformers' modules, out of the collector's passes
                future.set_result(loaded)
            except BaseException as e:  # handed to whoever waits
                future.set_exception(e)

        threading.Thread(target=load, name="polarproxy-tokenizer", daemon=True).start()

    def _ensure_loaded(self) -> None:
        if self.loaded:
            return
        loaded = self._loading.result() if self._loading is not None else _load(self.model_dir, self._source)
        self.__dict__.update(loaded)

    async def ready(self) -> None:
        """Wait until the tokenizer is loaded, off the event loop; raises the load's UsageError."""
        if not self.loaded:
            self.load_in_background()
            assert self._loading is not None
            # shielded: a waiter cancelled (its harness hung up) must not cancel the one shared load,
            # or every later call would find it cancelled
            await asyncio.shield(asyncio.wrap_future(self._loading))
            self._ensure_loaded()

    @property
    def arguments_form(self) -> ArgumentsForm:
        """How this template takes tool-call arguments: 'string' when it writes the JSON text verbatim,
        else 'object'. Found once, by rendering a probe tool call both ways."""
        if self._arguments_form is None:
            self._arguments_form = self._probe_arguments_form()
        return self._arguments_form

    def _probe_arguments_form(self) -> ArgumentsForm:
        probe = [
            Message(role="user", content="polarproxy probe"),
            Message(
                role="assistant", tool_calls=[ToolCall("call_polarproxy_probe", "probe", PROBE_ARGUMENTS)]
            ),
        ]
        tools = [template_tool(Tool(name="probe", description="probe", parameters={"type": "object"}))]
        for form in ("string", "object"):
            try:
                text = self._apply(template_messages(probe, form), tools, add_generation_prompt=False)
            except Exception:  # the template cannot take this form (e.g. `items` of a string)
                continue
            if form == "object" or PROBE_ARGUMENTS in text:
                return form  # type: ignore[return-value]
        return "string"

    def _apply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kw: Any) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, **kw)

    def render_folded(
        self, conv: Conversation, *, add_generation_prompt: bool = True, min_fold: int = 0
    ) -> tuple[str, int]:
        """The template's text for `conv` and the fold level it needed (0: rendered as sent). Folds are
        tried in order only while the template raises (`polarproxy.render.folds`); `min_fold` starts
        there (to render a continuation the way its earlier turns were rendered)."""
        from jinja2 import TemplateError

        tools = [template_tool(t) for t in conv.tools] or None
        form = self.arguments_form
        first: Exception | None = None
        previous: list[Message] | None = None
        for level in range(min_fold, len(FOLDS) + 1):
            messages = fold(conv.messages, level)
            if previous is not None and messages == previous:
                continue  # this fold changes nothing here: the template would refuse it again
            previous = messages
            try:
                return self._apply(
                    template_messages(messages, form), tools, add_generation_prompt=add_generation_prompt
                ), level
            except TemplateError as e:
                first = first or e
        assert first is not None
        tried = f"; folding its system and user messages ({fold_name(len(FOLDS))}) did not help"
        raise TemplateRefused(f"{first}{tried if len(FOLDS) > min_fold else ''}") from first

    def render_text(self, conv: Conversation, *, add_generation_prompt: bool = True) -> str:
        return self.render_folded(conv, add_generation_prompt=add_generation_prompt)[0]

    def render(self, conv: Conversation) -> RenderedPrompt:
        text, level = self.render_folded(conv)
        return RenderedPrompt(text=text, ids=self.encode(text), fold=fold_name(level))

    @functools.cached_property
    def context_length(self) -> int | None:
        """The model's context in tokens (config.json's max_position_embeddings, a multimodal model's
        text_config's), or None when the folder does not say."""
        try:
            config = json.loads((self.model_dir / "config.json").read_text())
        except (OSError, ValueError):
            return None
        for section in (config, config.get("text_config") or {}):
            value = section.get("max_position_embeddings")
            if isinstance(value, int) and value > 0:
                return value
        return None

    def encode(self, text: str) -> list[int]:
        # encode_batch releases the GIL while it tokenizes (encode does not), so a long prompt rendered in a
        # worker thread does not stall the proxy's event loop.
        return self._fast.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int]) -> str:
        return self._fast.decode(ids, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """How one token reads on its own (for display)."""
        return self._fast.decode([token_id], skip_special_tokens=False)
