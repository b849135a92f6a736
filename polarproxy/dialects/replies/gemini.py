"""Gemini generateContent: a GenerateContentResponse, or a stream of them (SSE or a JSON array's elements)."""

from __future__ import annotations

from typing import Any

from polarproxy.conversation import FinishReason
from polarproxy.dialects.base import DialectError
from polarproxy.dialects.gemini import _model_message
from polarproxy.dialects.replies.base import Reply, ReplyError, count, obj

FINISH: dict[str, FinishReason] = {"STOP": "stop", "MAX_TOKENS": "length"}


class GeminiReply:
    """`turns` is the request's number of `contents`: the answer is the turn at that position, and its tool
    calls are named as the request parser names them when the harness sends the turn back."""

    def __init__(self, *, turns: int = 0) -> None:
        self.reply = Reply()
        self.turns = turns
        self._parts: list[dict[str, Any]] = []
        self._assembled = False

    def _chunk(self, data: Any) -> bool:
        data = obj(data, "A response chunk")
        if isinstance(data.get("error"), dict):
            self.reply.error = str(data["error"].get("message") or data["error"])
            return False
        self.reply.model = str(data.get("modelVersion") or self.reply.model)
        self.reply.response_id = str(data.get("responseId") or self.reply.response_id)
        u = data.get("usageMetadata")
        if isinstance(u, dict):
            self.reply.usage_reported = True
            usage = self.reply.completion.usage
            usage.prompt_tokens = count(u.get("promptTokenCount"))
            usage.completion_tokens = count(u.get("candidatesTokenCount")) + count(
                u.get("thoughtsTokenCount")
            )
        out = False
        for cand in data.get("candidates") or []:
            if not isinstance(cand, dict) or cand.get("index", 0) != 0:
                continue
            parts = (cand.get("content") or {}).get("parts") or []
            for part in parts:
                if isinstance(part, dict):
                    self._parts.append(part)
                    out = out or bool(part.get("text")) or "functionCall" in part
            if cand.get("finishReason"):
                reason = FINISH.get(str(cand["finishReason"]), "stop")
                self.reply.completion.finish_reason = reason
                self.reply.complete = True
        return out

    def body(self, data: Any) -> None:
        if isinstance(data, list):  # a streamGenerateContent answer without ?alt=sse
            for chunk in data:
                self._chunk(chunk)
        else:
            self._chunk(data)
        if not self._parts and not self.reply.error:
            raise ReplyError("The response has no candidate content.")
        self.reply.complete = self.reply.complete or not self.reply.error

    def event(self, data: Any, name: str = "message") -> bool:
        return self._chunk(data)

    def result(self) -> Reply:
        if self._parts and not self._assembled:
            self._assembled = True
            try:
                msg, _ = _model_message(self._parts, self.turns)
            except DialectError as e:
                raise ReplyError(e.message) from e
            c = self.reply.completion
            c.text, c.reasoning, c.tool_calls, c.signature = (
                msg.content,
                msg.reasoning,
                msg.tool_calls,
                msg.signature,
            )
            if c.tool_calls and c.finish_reason == "stop":
                c.finish_reason = "tool_calls"
        return self.reply
