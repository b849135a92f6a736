"""Anthropic Messages: a `message` object, or the `message_start` ... `message_stop` event stream."""

from __future__ import annotations

import json
from typing import Any

from polarproxy.conversation import FinishReason
from polarproxy.dialects.anthropic import RAW_ARGUMENTS_KEY, _assistant
from polarproxy.dialects.base import DialectError
from polarproxy.dialects.replies.base import Reply, ReplyError, count, obj

STOP: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "pause_turn": "stop",
    "refusal": "stop",
}
OUTPUT_DELTAS = ("text_delta", "thinking_delta", "input_json_delta")


class AnthropicReply:
    def __init__(self, *, turns: int = 0) -> None:
        self.reply = Reply()
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._input = 0
        self._output = 0
        self._assembled = False

    def _usage(self, u: Any) -> None:
        if not isinstance(u, dict):
            return
        self.reply.usage_reported = True
        prompt = [
            u.get(k) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        ]
        if any(isinstance(v, int) for v in prompt):
            self._input = sum(count(v) for v in prompt)
        if isinstance(u.get("output_tokens"), int):
            self._output = count(u["output_tokens"])
        self.reply.completion.usage.prompt_tokens = self._input
        self.reply.completion.usage.completion_tokens = self._output

    def _content(self, blocks: list[Any]) -> None:
        try:
            msg = _assistant({"content": blocks}, "content")
        except DialectError as e:
            raise ReplyError(e.message) from e
        c = self.reply.completion
        c.text, c.reasoning, c.tool_calls, c.signature = (
            msg.content,
            msg.reasoning,
            msg.tool_calls,
            msg.signature,
        )

    def body(self, data: Any) -> None:
        data = obj(data, "The response")
        if data.get("type") == "error":
            self.reply.error = str((data.get("error") or {}).get("message") or data)
            return
        self.reply.model = str(data.get("model") or "")
        self.reply.response_id = str(data.get("id") or "")
        self._usage(data.get("usage"))
        content = data.get("content")
        if not isinstance(content, list):
            raise ReplyError("The response has no content array.")
        self._content(content)
        self.reply.completion.finish_reason = STOP.get(str(data.get("stop_reason")), "stop")
        self.reply.complete = True

    def event(self, data: Any, name: str = "message") -> bool:
        data = obj(data, "A stream event")
        kind = data.get("type") or name
        if kind == "message_start":
            msg = data.get("message") or {}
            self.reply.model = str(msg.get("model") or "")
            self.reply.response_id = str(msg.get("id") or "")
            self._usage(msg.get("usage"))
        elif kind == "content_block_start":
            block = dict(data.get("content_block") or {})
            self._blocks[int(data.get("index", len(self._blocks)))] = block
            return block.get("type") == "tool_use"
        elif kind == "content_block_delta":
            i = int(data.get("index", 0))
            block = self._blocks.setdefault(i, {"type": "text", "text": ""})
            delta = data.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif dtype == "signature_delta":
                block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
            elif dtype == "input_json_delta":
                self._json.setdefault(i, []).append(str(delta.get("partial_json", "")))
            return dtype in OUTPUT_DELTAS
        elif kind == "message_delta":
            stop = (data.get("delta") or {}).get("stop_reason")
            if stop:
                self.reply.completion.finish_reason = STOP.get(str(stop), "stop")
            self._usage(data.get("usage"))
        elif kind == "message_stop":
            self.reply.complete = True
        elif kind == "error":
            self.reply.error = str((data.get("error") or {}).get("message") or data)
        return False

    def result(self) -> Reply:
        if self._blocks and not self._assembled:
            self._assembled = True
            blocks = []
            for i, block in sorted(self._blocks.items()):
                if block.get("type") == "tool_use" and i in self._json:
                    text = "".join(self._json[i])
                    block["input"] = _input_object(text) if text else block.get("input", {})
                blocks.append(block)
            self._content(blocks)
        return self.reply


def _input_object(text: str) -> dict[str, Any]:
    """A streamed tool input: the object it spells, or (when it is not one) the text kept verbatim."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {RAW_ARGUMENTS_KEY: text}
