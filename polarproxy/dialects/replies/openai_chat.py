"""OpenAI Chat Completions responses: a `chat.completion` object, or `chat.completion.chunk` events."""

from __future__ import annotations

from typing import Any

from polarproxy.conversation import Completion, FinishReason, ToolCall, Usage
from polarproxy.dialects.base import DialectError
from polarproxy.dialects.openai_chat import _message
from polarproxy.dialects.replies.base import Reply, ReplyError, count, obj

FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
}


def _usage(raw: Any) -> Usage:
    u = raw if isinstance(raw, dict) else {}
    return Usage(
        prompt_tokens=count(u.get("prompt_tokens")), completion_tokens=count(u.get("completion_tokens"))
    )


class ChatReply:
    def __init__(self, *, turns: int = 0) -> None:
        self.reply = Reply()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]

    def _meta(self, data: dict[str, Any]) -> None:
        self.reply.model = self.reply.model or str(data.get("model") or "")
        self.reply.response_id = self.reply.response_id or str(data.get("id") or "")
        if isinstance(data.get("error"), dict):
            self.reply.error = str(data["error"].get("message") or data["error"])
        if isinstance(data.get("usage"), dict):
            self.reply.completion.usage = _usage(data["usage"])
            self.reply.usage_reported = True

    def body(self, data: Any) -> None:
        data = obj(data, "The response")
        self._meta(data)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            if self.reply.error:
                return
            raise ReplyError("The response has no choices.")
        choice = obj(choices[0], "choices[0]")
        try:
            msg = _message({**obj(choice.get("message"), "choices[0].message"), "role": "assistant"}, 0)
        except DialectError as e:
            raise ReplyError(e.message) from e
        c = self.reply.completion
        c.text, c.reasoning, c.tool_calls = msg.content, msg.reasoning, msg.tool_calls
        c.finish_reason = FINISH.get(str(choice.get("finish_reason")), "stop")
        self.reply.complete = True

    def event(self, data: Any, name: str = "message") -> bool:
        data = obj(data, "A stream event")
        self._meta(data)
        out = False
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                self._text.append(text)
                out = True
            thought = delta.get("reasoning_content", delta.get("reasoning"))
            if isinstance(thought, str) and thought:
                self._reasoning.append(thought)
                out = True
            for tc in delta.get("tool_calls") or []:
                slot = self._calls.setdefault(int(tc.get("index", len(self._calls))), ["", "", ""])
                fn = tc.get("function") or {}
                slot[0] = slot[0] or str(tc.get("id") or "")
                slot[1] += str(fn.get("name") or "")
                slot[2] += str(fn.get("arguments") or "")
                out = True
            if choice.get("finish_reason"):
                self.reply.completion.finish_reason = FINISH.get(str(choice["finish_reason"]), "stop")
                self.reply.complete = True
        return out

    def result(self) -> Reply:
        c: Completion = self.reply.completion
        if self._text or self._reasoning or self._calls:
            c.text = "".join(self._text)
            c.reasoning = "".join(self._reasoning) or None
            c.tool_calls = [
                ToolCall(id=i, name=n, arguments=a) for _, (i, n, a) in sorted(self._calls.items())
            ]
        return self.reply
