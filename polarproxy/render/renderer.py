"""Render a neutral `Conversation` into the prompt token IDs the backend consumes.

The tokenizer and chat template come from the model folder through transformers (the tokenizer only:
torch is never imported here). Rendering is `apply_chat_template(..., tokenize=False)` followed by a plain
encode without added special tokens, so the IDs are exactly the template's text, tokenized once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polarproxy.conversation import Conversation, Message, Tool
from polarproxy.errors import UsageError


def template_message(m: Message) -> dict[str, Any]:
    """A neutral message as the chat template expects it (OpenAI-style keys, arguments as JSON text)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning:
        out["reasoning_content"] = m.reasoning
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
            for t in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def template_tool(t: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


def _load_tokenizer(path: Path) -> Any:
    """The fast tokenizer of a model folder. `PreTrainedTokenizerFast` reads tokenizer.json, the special
    tokens and the chat template without importing torch (`AutoTokenizer` imports it: +500 MB in the proxy);
    folders without tokenizer.json fall back to AutoTokenizer."""
    if (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


@dataclass(slots=True)
class RenderedPrompt:
    text: str
    ids: list[int]


class Renderer:
    """One model folder's tokenizer and chat template."""

    def __init__(self, model_dir: str | Path) -> None:
        path = Path(model_dir)
        if not path.is_dir():
            raise UsageError(
                f"Model folder '{model_dir}' does not exist.",
                hint="Pass --model DIR with a folder holding tokenizer.json and a chat template "
                "(`polarproxy tiny-model ./tiny` builds one).",
            )
        try:
            self.tokenizer = _load_tokenizer(path)
        except Exception as e:  # transformers raises many types for an unreadable folder
            raise UsageError(
                f"Cannot load a tokenizer from '{model_dir}': {e}",
                hint="The folder needs tokenizer.json (or tokenizer files) that transformers can load offline.",
            ) from e
        if not getattr(self.tokenizer, "chat_template", None):
            raise UsageError(
                f"The tokenizer in '{model_dir}' has no chat template.",
                hint="Add chat_template.jinja (or chat_template in tokenizer_config.json) to the folder.",
            )
        self.model_dir = path
        self._fast = self.tokenizer.backend_tokenizer  # the Rust tokenizer: encode/decode without overhead
        self.stop_token_ids: list[int] = self._stop_ids(path)

    def _stop_ids(self, path: Path) -> list[int]:
        ids: list[int] = []
        gen = path / "generation_config.json"
        if gen.is_file():
            import json

            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    def render_text(self, conv: Conversation, *, add_generation_prompt: bool = True) -> str:
        messages = [template_message(m) for m in conv.messages]
        tools = [template_tool(t) for t in conv.tools] or None
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def render(self, conv: Conversation) -> RenderedPrompt:
        text = self.render_text(conv)
        return RenderedPrompt(text=text, ids=self.encode(text))

    def encode(self, text: str) -> list[int]:
        # encode_batch releases the GIL while it tokenizes (encode does not), so a long prompt rendered in a
        # worker thread does not stall the proxy's event loop.
        return self._fast.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int]) -> str:
        return self._fast.decode(ids, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """How one token reads on its own (for display)."""
        return self._fast.decode([token_id], skip_special_tokens=False)
