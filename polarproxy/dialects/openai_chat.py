"""OpenAI Chat Completions: `POST /v1/chat/completions`, streamed (SSE `chat.completion.chunk`) and not."""

from __future__ import annotations

from typing import Any

import orjson

from polarproxy.conversation import (
    Completion,
    Conversation,
    Message,
    ReasoningDelta,
    Sampling,
    StreamEvent,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallEvent,
)
from polarproxy.dialects.base import DialectError, number
from polarproxy.sse import KEEPALIVE, encode

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _text(content: Any, where: str) -> str:
    """Content as a string: a string, null, or an array of text parts (concatenated)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
                continue
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("text", "input_text", "output_text"):
                out.append(str(part.get("text", "")))
            elif kind == "refusal":
                out.append(str(part.get("refusal", "")))
            else:
                raise DialectError(
                    f"Unsupported content part type {kind!r} at {where}.content[{i}]. "
                    "Supported: 'text'. This model takes text only."
                )
        return "".join(out)
    raise DialectError(
        f"{where}.content must be a string, null or an array of parts, not {type(content).__name__}."
    )


def _tool_calls(raw: Any, where: str) -> list[ToolCall]:
    if not raw:
        return []
    if not isinstance(raw, list):
        raise DialectError(f"{where}.tool_calls must be an array.")
    calls = []
    for i, tc in enumerate(raw):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise DialectError(f"{where}.tool_calls[{i}] needs function.name.")
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = orjson.dumps(args).decode()
        calls.append(ToolCall(id=str(tc.get("id", "")), name=fn["name"], arguments=args))
    return calls


def _message(raw: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise DialectError(f"{where} must be an object.")
    role = ROLES.get(raw.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise DialectError(
            f"Unknown role {raw.get('role')!r} at {where}. Must be one of {', '.join(repr(r) for r in ROLES)}."
        )
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    return Message(
        role=role,  # type: ignore[arg-type]
        content=_text(raw.get("content"), where),
        reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
        tool_calls=_tool_calls(raw.get("tool_calls"), where) if role == "assistant" else [],
        tool_call_id=raw.get("tool_call_id") if role == "tool" else None,
        name=raw.get("name") if isinstance(raw.get("name"), str) else None,
    )


def _tools(raw: Any) -> list[Tool]:
    if not raw:
        return []
    if not isinstance(raw, list):
        raise DialectError("tools must be an array.")
    tools = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            continue  # built-in tools have no function schema to render
        fn = t.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise DialectError(f"tools[{i}] needs function.name.")
        tools.append(
            Tool(
                name=fn["name"],
                description=fn.get("description") or "",
                parameters=fn.get("parameters") or {},
            )
        )
    return tools


class OpenAIChat:
    name = "openai_chat"
    routes = ("POST /v1/chat/completions",)

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.rstrip("/").endswith("/chat/completions")

    def parse(self, body: Any, *, path: str = "", query: dict[str, str] | None = None) -> Conversation:
        if not isinstance(body, dict):
            raise DialectError("The request body must be a JSON object.")
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list) or not raw_messages:
            raise DialectError("messages must be a non-empty array.")
        n = body.get("n")
        if n not in (None, 1):
            raise DialectError(f"n={n!r} is not supported. Must be 1; send one request per sample.")
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str)]
        max_tokens = number(body, "max_completion_tokens", int)
        if max_tokens is None:
            max_tokens = number(body, "max_tokens", int)
        stream_options = body.get("stream_options") or {}
        return Conversation(
            messages=[_message(m, i) for i, m in enumerate(raw_messages)],
            tools=_tools(body.get("tools")),
            sampling=Sampling(
                max_tokens=max_tokens,
                temperature=number(body, "temperature", float),
                top_p=number(body, "top_p", float),
                top_k=number(body, "top_k", int),
                stop=stops,
                seed=number(body, "seed", int),
            ),
            model=str(body.get("model") or ""),
            stream=bool(body.get("stream")),
            include_usage=bool(isinstance(stream_options, dict) and stream_options.get("include_usage")),
            tool_choice=body.get("tool_choice"),
        )

    def response(self, completion: Completion, *, response_id: str, model: str, created: int) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": completion.text or None}
        if completion.reasoning is not None:
            message["reasoning_content"] = completion.reasoning
        if completion.tool_calls:
            message["tool_calls"] = [_tool_call_json(t) for t in completion.tool_calls]
        return orjson.dumps(
            {
                "id": "chatcmpl-" + response_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(completion)}
                ],
                "usage": _usage(completion),
            }
        )

    def stream_writer(
        self, conv: Conversation, *, response_id: str, model: str, created: int, prompt_tokens: int = 0
    ) -> ChatStreamWriter:
        return ChatStreamWriter(
            response_id=response_id, model=model, created=created, include_usage=conv.include_usage
        )

    def error(self, status: int, message: str, code: str) -> bytes:
        return orjson.dumps({"error": error_object(status, message, code)})


def error_object(status: int, message: str, code: str) -> dict[str, Any]:
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return {"message": message, "type": kind, "param": None, "code": code}


def _tool_call_json(t: ToolCall) -> dict[str, Any]:
    return {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}


def _finish(c: Completion) -> str:
    return "stop" if c.finish_reason == "abort" else c.finish_reason


def _usage(c: Completion) -> dict[str, int]:
    return {
        "prompt_tokens": c.usage.prompt_tokens,
        "completion_tokens": c.usage.completion_tokens,
        "total_tokens": c.usage.total_tokens,
    }


class ChatStreamWriter:
    content_type = "text/event-stream"

    def __init__(self, *, response_id: str, model: str, created: int, include_usage: bool) -> None:
        self._head = {
            "id": "chatcmpl-" + response_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return encode(orjson.dumps({**self._head, "choices": [choice]}))

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def events(self, events: list[StreamEvent]) -> bytes:
        out = []
        for ev in events:
            if isinstance(ev, TextDelta):
                out.append(self._chunk({"content": ev.text}))
            elif isinstance(ev, ReasoningDelta):
                out.append(self._chunk({"reasoning_content": ev.text}))
            elif isinstance(ev, ToolCallEvent):
                out.append(self._chunk({"tool_calls": [{"index": ev.index, **_tool_call_json(ev.call)}]}))
        return b"".join(out)

    def finish(self, completion: Completion) -> bytes:
        out = self._chunk({}, _finish(completion))
        if self._include_usage:
            out += encode(orjson.dumps({**self._head, "choices": [], "usage": _usage(completion)}))
        return out + encode(b"[DONE]")

    def error(self, message: str, code: str) -> bytes:
        return encode(orjson.dumps({"error": error_object(500, message, code)}))

    def keepalive(self) -> bytes:
        return KEEPALIVE
