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
    ToolCallDelta,
    ToolCallEvent,
)
from polarproxy.dialects.base import DialectError, flag, max_tokens, sampling_number, string
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
                out.append(string(part, "text", where=f"{where}.content[{i}]."))
            elif kind == "refusal":
                out.append(string(part, "refusal", where=f"{where}.content[{i}]."))
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
            try:
                args = orjson.dumps(args).decode()
            except orjson.JSONEncodeError as e:
                raise DialectError(
                    f"{where}.tool_calls[{i}].function.arguments cannot be encoded: {e}."
                ) from e
        call_id = tc.get("id")
        if not isinstance(call_id, str):
            call_id = string(tc, "id", where=f"{where}.tool_calls[{i}].")
        calls.append(ToolCall(id=call_id, name=fn["name"], arguments=args))
    return calls


def _optional_string(raw: dict[str, Any], key: str, i: int) -> str | None:
    """`messages[i].key`: a string, or None when absent or null. The error's place is only formatted for
    an error: this runs for every field of every message of every call (a long history: thousands)."""
    v = raw.get(key)
    if v is None or isinstance(v, str):
        return v
    return string(raw, key, where=f"messages[{i}].")  # raises, naming the place


def _message(raw: Any, i: int) -> Message:
    if not isinstance(raw, dict):
        raise DialectError(f"messages[{i}] must be an object.")
    r = raw.get("role")
    role = ROLES.get(r) if isinstance(r, str) else None
    if role is None:
        raise DialectError(
            f"Unknown role {r!r} at messages[{i}]. Must be one of {', '.join(repr(r) for r in ROLES)}."
        )
    if role != "assistant" and "content" not in raw:
        # Only an assistant turn may omit its content (it may hold tool calls only), as in OpenAI's API.
        raise DialectError(f"messages[{i}].content is required for a {r!r} message.")
    get = raw.get
    reasoning = get("reasoning_content")
    if reasoning is None:
        reasoning = get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        _optional_string(raw, "reasoning_content", i)  # raises, naming the field
        _optional_string(raw, "reasoning", i)
    tool_call_id = None
    if role == "tool":
        tool_call_id = _optional_string(raw, "tool_call_id", i)
        if not tool_call_id:
            raise DialectError(f"messages[{i}].tool_call_id is required for a 'tool' message (a string).")
    content = get("content")
    name = get("name")
    return Message(
        role,  # type: ignore[arg-type]
        content if isinstance(content, str) else _text(content, f"messages[{i}]"),
        reasoning or None,
        _tool_calls(get("tool_calls"), f"messages[{i}]") if role == "assistant" else [],
        tool_call_id,
        (name if isinstance(name, str) else _optional_string(raw, "name", i)) or None,
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
        parameters = fn.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise DialectError(f"tools[{i}].function.parameters must be an object (a JSON Schema).")
        tools.append(
            Tool(
                name=fn["name"],
                description=string(fn, "description", where=f"tools[{i}].function."),
                parameters=parameters,
            )
        )
    return tools


def _stops(raw: Any) -> list[str]:
    """`stop`: a string or an array of strings."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise DialectError(f"stop must be a string or an array of strings, not {raw!r}.")
    return list(raw)


class OpenAIChat:
    name = "openai_chat"
    routes = ("POST /v1/chat/completions",)

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.rstrip("/").endswith("/chat/completions")

    messages_key = "messages"  # resendable (dialects/resend.py): each element is read alone

    def parse(self, body: Any, *, path: str = "", query: dict[str, str] | None = None) -> Conversation:
        if not isinstance(body, dict):
            raise DialectError("The request body must be a JSON object.")
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list) or not raw_messages:
            raise DialectError("messages must be a non-empty array.")
        return self.conversation(body, [_message(m, i) for i, m in enumerate(raw_messages)])

    def parse_element(self, raw: Any, i: int) -> list[Message]:
        """`messages[i]` of a request: one message."""
        return [_message(raw, i)]

    def conversation(self, body: dict[str, Any], messages: list[Message]) -> Conversation:
        """The conversation of a request whose `messages` parsed to `messages` (the body's other fields read
        here; its own `messages` is not)."""
        if not messages:
            raise DialectError("messages must be a non-empty array.")
        n = body.get("n")
        if n not in (None, 1) or isinstance(n, bool):
            raise DialectError(f"n={n!r} is not supported. Must be 1; send one request per sample.")
        limit = max_tokens(body, "max_completion_tokens")
        if limit is None:
            limit = max_tokens(body, "max_tokens")
        stream_options = body.get("stream_options")
        if stream_options is not None and not isinstance(stream_options, dict):
            raise DialectError(f"stream_options must be an object, not {stream_options!r}.")
        tool_choice = body.get("tool_choice")
        if tool_choice is not None and not isinstance(tool_choice, str | dict):
            raise DialectError(f"tool_choice must be a string or an object, not {tool_choice!r}.")
        return Conversation(
            messages=messages,
            tools=_tools(body.get("tools")),
            sampling=Sampling(
                max_tokens=limit,
                temperature=sampling_number(body, "temperature", "temperature"),
                top_p=sampling_number(body, "top_p", "top_p"),
                top_k=sampling_number(body, "top_k", "top_k"),
                stop=_stops(body.get("stop")),
                seed=sampling_number(body, "seed", "seed"),
            ),
            model=string(body, "model"),
            stream=flag(body, "stream"),
            include_usage=flag(stream_options or {}, "include_usage", where="stream_options."),
            tool_choice=tool_choice,
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
        self._streamed: set[int] = set()  # tool calls whose arguments went out as deltas

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
            elif isinstance(ev, ToolCallDelta):  # id and name first, then argument pieces
                if ev.index not in self._streamed:
                    self._streamed.add(ev.index)
                    head = ToolCall(id=ev.id, name=ev.name, arguments=ev.arguments)
                    out.append(self._chunk({"tool_calls": [{"index": ev.index, **_tool_call_json(head)}]}))
                elif ev.arguments:
                    piece = {"index": ev.index, "function": {"arguments": ev.arguments}}
                    out.append(self._chunk({"tool_calls": [piece]}))
            elif isinstance(ev, ToolCallEvent) and ev.index not in self._streamed:
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
