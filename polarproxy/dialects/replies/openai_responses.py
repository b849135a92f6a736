"""OpenAI Responses: a Response object, or `response.*` stream events ending with `response.completed`."""

from __future__ import annotations

from typing import Any

from polarproxy.conversation import Usage
from polarproxy.dialects.base import DialectError
from polarproxy.dialects.openai_responses import _input, _Turns
from polarproxy.dialects.replies.base import Reply, ReplyError, count, obj

OUTPUT_DELTAS = (
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
    "response.refusal.delta",
)
FINAL = ("response.completed", "response.incomplete", "response.failed")
ANSWER_ITEMS = ("message", "reasoning", "function_call", "custom_tool_call")


class ResponsesReply:
    def __init__(self, *, turns: int = 0) -> None:
        self.reply = Reply()
        self._items: list[dict[str, Any]] = []  # output items completed so far (a stream cut short)
        self._text: list[str] = []
        self._assembled = False

    def body(self, data: Any) -> None:
        data = obj(data, "The response")
        self.reply.model = str(data.get("model") or self.reply.model)
        self.reply.response_id = str(data.get("id") or self.reply.response_id)
        err = data.get("error")
        if isinstance(err, dict) and err:
            self.reply.error = str(err.get("message") or err)
        if isinstance(data.get("usage"), dict):
            u = data["usage"]
            self.reply.completion.usage = Usage(count(u.get("input_tokens")), count(u.get("output_tokens")))
            self.reply.usage_reported = True
        output = data.get("output")
        if not isinstance(output, list):
            if self.reply.error:
                return
            raise ReplyError("The response has no output array.")
        self._fill(output)
        status = data.get("status")
        details = data.get("incomplete_details") or {}
        if status == "incomplete" and details.get("reason") == "max_output_tokens":
            self.reply.completion.finish_reason = "length"
        self.reply.complete = True

    def _fill(self, output: list[Any]) -> None:
        turns = _Turns()
        try:
            _input([i for i in output if isinstance(i, dict) and i.get("type") in ANSWER_ITEMS], turns)
        except DialectError as e:
            raise ReplyError(e.message) from e
        c = self.reply.completion
        for m in turns.messages:
            c.text += m.content
            if m.reasoning is not None:
                c.reasoning = m.reasoning if c.reasoning is None else c.reasoning + "\n\n" + m.reasoning
            c.tool_calls += m.tool_calls
            c.signature = c.signature or m.signature
        c.finish_reason = "tool_calls" if c.tool_calls else "stop"

    def event(self, data: Any, name: str = "message") -> bool:
        data = obj(data, "A stream event")
        kind = data.get("type") or name
        if kind == "response.created" and isinstance(data.get("response"), dict):
            r = data["response"]
            self.reply.model = str(r.get("model") or "")
            self.reply.response_id = str(r.get("id") or "")
            return False
        if kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            self._items.append(data["item"])
            return data["item"].get("type") in ANSWER_ITEMS
        if kind == "response.output_text.delta":
            self._text.append(str(data.get("delta") or ""))
        if kind in FINAL and isinstance(data.get("response"), dict):
            self.body(data["response"])
            return False
        if kind == "error":
            self.reply.error = str(data.get("message") or data.get("error") or data)
            return False
        return kind in OUTPUT_DELTAS

    def result(self) -> Reply:
        if not self.reply.complete and not self._assembled and (self._items or self._text):
            self._assembled = True
            c = self.reply.completion
            self._fill(self._items)  # what was complete when the stream ended
            if not any(i.get("type") == "message" for i in self._items):
                c.text += "".join(self._text)  # the text of a message that never finished
        return self.reply
