"""Anthropic Messages: `POST /v1/messages` (queries such as `?beta=true` allowed), streamed (SSE) and not.

Choices where the wire format has no neutral counterpart:

- The top-level `system` (a string or text blocks) becomes one leading system message, its blocks' text
  joined with "\\n". A `role: "system"` message inside `messages` (Claude Code sends one) stays a system
  message where it is. User and assistant text blocks are concatenated as they are (Claude Code's blocks
  carry their own separators).
- A `tool_result` becomes a neutral `tool` message; with `is_error: true` its text is prefixed
  with "Error: " so the model can tell. A user turn holding tool results and text becomes the tool messages
  followed by one user message with the text.
- `thinking` blocks become `Message.reasoning` (several are joined with "\\n\\n") and their first
  `signature` `Message.signature`; a `redacted_thinking` block's `data` is kept as the signature.
- Tool input is sent as a JSON object. Arguments the model sampled that are not a JSON object (possible
  when it wrote `"arguments": "..."`) go out as `{"_polarproxy_raw_arguments": "<the text>"}` and come back
  as that text, so the turn renders the same when the harness returns it.
- A thinking block is sent when the answer has non-empty reasoning (the stream cannot know about empty
  reasoning in time, and empty reasoning renders like none).
- `cache_control`, `metadata`, `thinking` settings and server tools (a `type` other than "custom") are
  accepted and not used.
"""

from __future__ import annotations

import json
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
from polarproxy.dialects.base import DialectError, answer_signature, max_tokens, sampling_number, string
from polarproxy.sse import encode

RAW_ARGUMENTS_KEY = "_polarproxy_raw_arguments"
ROLES = ("user", "assistant", "system")
USER_BLOCKS = ("text", "tool_result")
ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")
TOOL_CHOICES = ("auto", "any", "tool", "none")
TEXT_ONLY = ("image", "document")
PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def _allowed(values: tuple[str, ...]) -> str:
    return ", ".join(repr(v) for v in values)


def _block_type(block: Any, where: str, allowed: tuple[str, ...]) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in TEXT_ONLY:
        raise DialectError(
            f"Content block type {kind!r} at {where} is not supported: this model takes text only. "
            f"Supported block types: {_allowed(allowed)}."
        )
    if kind not in allowed:
        raise DialectError(
            f"Unsupported content block type {kind!r} at {where}. Supported: {_allowed(allowed)}."
        )
    return kind  # type: ignore[return-value]


def _text_block(block: dict[str, Any], where: str) -> str:
    text = block.get("text", "")
    if not isinstance(text, str):
        raise DialectError(f"{where}.text must be a string, not {type(text).__name__}.")
    return text


def _texts(content: Any, where: str, sep: str) -> str:
    """A string, or an array of text blocks joined with `sep`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(
            f"{where} must be a string or an array of text blocks, not {type(content).__name__}."
        )
    out = []
    for i, block in enumerate(content):
        _block_type(block, f"{where}[{i}]", ("text",))
        out.append(_text_block(block, f"{where}[{i}]"))
    return sep.join(out)


def _blocks(content: Any, where: str) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise DialectError(
            f"{where}.content must be a string or an array of content blocks, not {type(content).__name__}."
        )
    return content


def _user(raw: dict[str, Any], where: str) -> list[Message]:
    """One user turn: its tool results as tool messages, then its text (if any) as a user message."""
    tools: list[Message] = []
    texts: list[str] = []
    for j, block in enumerate(_blocks(raw.get("content"), where)):
        at = f"{where}.content[{j}]"
        if _block_type(block, at, USER_BLOCKS) == "text":
            texts.append(_text_block(block, at))
            continue
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str):
            raise DialectError(f"{at} (tool_result) needs a string tool_use_id, not {call_id!r}.")
        text = _texts(block.get("content"), f"{at}.content", "")
        if block.get("is_error") is True:
            text = "Error: " + text
        tools.append(Message(role="tool", content=text, tool_call_id=call_id))
    if texts or not tools:
        tools.append(Message(role="user", content="".join(texts)))
    return tools


def _tool_input(block: dict[str, Any], at: str) -> str:
    value = block.get("input", {})
    if not isinstance(value, dict):
        raise DialectError(f"{at}.input must be an object, not {type(value).__name__}.")
    if set(value) == {RAW_ARGUMENTS_KEY} and isinstance(value[RAW_ARGUMENTS_KEY], str):
        return value[RAW_ARGUMENTS_KEY]
    return json.dumps(value, ensure_ascii=False)


def _assistant(raw: dict[str, Any], where: str) -> Message:
    texts: list[str] = []
    thoughts: list[str] = []
    signature: str | None = None
    calls: list[ToolCall] = []
    for j, block in enumerate(_blocks(raw.get("content"), where)):
        at = f"{where}.content[{j}]"
        kind = _block_type(block, at, ASSISTANT_BLOCKS)
        if kind == "text":
            texts.append(_text_block(block, at))
        elif kind == "thinking":
            thinking = block.get("thinking", "")
            if not isinstance(thinking, str):
                raise DialectError(f"{at}.thinking must be a string, not {type(thinking).__name__}.")
            thoughts.append(thinking)
            if signature is None and isinstance(block.get("signature"), str):
                signature = block["signature"]
        elif kind == "redacted_thinking":
            if signature is None and isinstance(block.get("data"), str):
                signature = block["data"]
        else:
            name = block.get("name")
            if not isinstance(name, str) or not isinstance(block.get("id"), str):
                raise DialectError(f"{at} (tool_use) needs a string id and name.")
            calls.append(ToolCall(id=block["id"], name=name, arguments=_tool_input(block, at)))
    return Message(
        role="assistant",
        content="".join(texts),
        reasoning="\n\n".join(thoughts) if thoughts else None,
        tool_calls=calls,
        signature=signature,
    )


def _messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise DialectError("messages must be a non-empty array.")
    out: list[Message] = []
    for i, m in enumerate(raw):
        out += _element(m, i)
    return out


def _element(m: Any, i: int) -> list[Message]:
    """`messages[i]`: a user turn's tool results and text, an assistant turn, or a system message."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise DialectError(f"{where} must be an object.")
    role = m.get("role")
    if role == "user":
        return _user(m, where)
    if role == "assistant":
        return [_assistant(m, where)]
    if role == "system":
        return [Message(role="system", content=_texts(m.get("content"), f"{where}.content", "\n"))]
    raise DialectError(f"Unknown role {role!r} at {where}. Must be one of {_allowed(ROLES)}.")


def _tools(raw: Any) -> list[Tool]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise DialectError(f"tools must be an array, not {type(raw).__name__}.")
    tools = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise DialectError(f"tools[{i}] must be an object.")
        if t.get("type", "custom") not in ("custom", None):
            continue  # a server tool (web_search_..., bash_..., ...): nothing for this model to call
        if not isinstance(t.get("name"), str):
            raise DialectError(f"tools[{i}] needs a string name.")
        schema = t.get("input_schema") or {}
        if not isinstance(schema, dict):
            raise DialectError(f"tools[{i}].input_schema must be an object.")
        description = string(t, "description", where=f"tools[{i}].")
        tools.append(Tool(name=t["name"], description=description, parameters=schema))
    return tools


def _tool_choice(raw: Any) -> str | dict[str, Any] | None:
    """Anthropic's tool_choice in the neutral (OpenAI-style) form."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in TOOL_CHOICES:
        raise DialectError(
            f"tool_choice.type {kind!r} is not supported. Must be one of {_allowed(TOOL_CHOICES)}."
        )
    if kind == "tool":
        if not isinstance(raw.get("name"), str):
            raise DialectError("tool_choice of type 'tool' needs a string name.")
        return {"type": "function", "function": {"name": raw["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def _stops(raw: Any) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise DialectError(f"stop_sequences must be an array of strings, not {raw!r}.")
    return list(raw)


def _wire_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {RAW_ARGUMENTS_KEY: arguments}


def _wire_input_json(arguments: str) -> str:
    """The tool input as JSON text: the arguments verbatim when they are a JSON object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return arguments
    return json.dumps({RAW_ARGUMENTS_KEY: arguments}, ensure_ascii=False)


def _stop_reason(c: Completion) -> str:
    if c.finish_reason == "length":
        return "max_tokens"
    if c.tool_calls:
        return "tool_use"
    return "end_turn"


def error_type(status: int, code: str = "") -> str:
    if code in ("backend_unreachable", "store_unavailable") or status in (503, 529):
        return "overloaded_error"
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
    }.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


class AnthropicMessages:
    name = "anthropic"
    routes = ("POST /v1/messages",)

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.rstrip("/").endswith("/messages")

    messages_key = "messages"  # resendable (dialects/resend.py): each element is read alone

    def parse(self, body: Any, *, path: str = "", query: dict[str, str] | None = None) -> Conversation:
        if not isinstance(body, dict):
            raise DialectError("The request body must be a JSON object.")
        return self._conversation(body, None)

    def parse_element(self, raw: Any, i: int) -> list[Message]:
        return _element(raw, i)

    def conversation(self, body: dict[str, Any], messages: list[Message]) -> Conversation:
        """The system prompt (when the body has one), then `messages`."""
        return self._conversation(body, messages)

    def _conversation(self, body: dict[str, Any], messages: list[Message] | None) -> Conversation:
        """`messages`: what the body's messages gave, or None to read them here (in the same order of checks
        as always, so that a body with several faults is refused for the same one)."""
        if body.get("max_tokens") is None:
            raise DialectError("max_tokens is required (a positive integer), as in the Anthropic API.")
        limit = max_tokens(body, "max_tokens")
        model = body.get("model", "")
        if not isinstance(model, str):
            raise DialectError(f"model must be a string, not {model!r}.")
        stream = body.get("stream", False)
        if not isinstance(stream, bool | None):
            raise DialectError(f"stream must be true or false, not {stream!r}.")
        thinking = body.get("thinking")
        if thinking is not None and not isinstance(thinking, dict):
            raise DialectError(f"thinking must be an object such as {{'type': 'enabled'}}, not {thinking!r}.")
        system = _texts(body.get("system"), "system", "\n")
        if messages is None:
            messages = _messages(body.get("messages"))
        elif not messages:
            raise DialectError("messages must be a non-empty array.")
        if system:
            messages = [Message(role="system", content=system), *messages]
        return Conversation(
            messages=messages,
            tools=_tools(body.get("tools")),
            sampling=Sampling(
                max_tokens=limit,
                temperature=sampling_number(body, "temperature", "temperature"),
                top_p=sampling_number(body, "top_p", "top_p"),
                top_k=sampling_number(body, "top_k", "top_k"),
                stop=_stops(body.get("stop_sequences")),
            ),
            model=model,
            stream=bool(stream),
            include_usage=True,  # Anthropic streams always carry usage
            tool_choice=_tool_choice(body.get("tool_choice")),
        )

    def response(self, completion: Completion, *, response_id: str, model: str, created: int) -> bytes:
        content: list[dict[str, Any]] = []
        if completion.reasoning:
            signature = completion.signature or answer_signature(response_id)
            content.append({"type": "thinking", "thinking": completion.reasoning, "signature": signature})
        if completion.text:
            content.append({"type": "text", "text": completion.text})
        for t in completion.tool_calls:
            content.append(
                {"type": "tool_use", "id": t.id, "name": t.name, "input": _wire_input(t.arguments)}
            )
        return orjson.dumps(
            {
                "id": "msg_" + response_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": _stop_reason(completion),
                "stop_sequence": None,
                "usage": {
                    "input_tokens": completion.usage.prompt_tokens,
                    "output_tokens": completion.usage.completion_tokens,
                },
            }
        )

    def stream_writer(
        self, conv: Conversation, *, response_id: str, model: str, created: int, prompt_tokens: int = 0
    ) -> MessagesStreamWriter:
        return MessagesStreamWriter(response_id=response_id, model=model, prompt_tokens=prompt_tokens)

    def error(self, status: int, message: str, code: str) -> bytes:
        return orjson.dumps(_error_body(error_type(status, code), message))


def _error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _event(name: str, data: dict[str, Any]) -> bytes:
    return encode(orjson.dumps({"type": name, **data}), event=name)


class MessagesStreamWriter:
    """Content blocks open and close in order: thinking, text and tool_use blocks as the events come."""

    content_type = "text/event-stream"

    def __init__(self, *, response_id: str, model: str, prompt_tokens: int) -> None:
        self.response_id = response_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self._index = -1
        self._open: str | None = None  # the kind of the open block: "thinking" | "text" | "tool_use"
        self._streamed: set[int] = set()  # tool calls whose input went out as input_json_delta pieces

    def start(self) -> bytes:
        message = {
            "id": "msg_" + self.response_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return _event("message_start", {"message": message})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            delta = {"type": "signature_delta", "signature": answer_signature(self.response_id)}
            out = _event("content_block_delta", {"index": self._index, "delta": delta})
        self._open = None
        return out + _event("content_block_stop", {"index": self._index})

    def _begin(self, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._index += 1
        return out + _event("content_block_start", {"index": self._index, "content_block": block})

    def events(self, events: list[StreamEvent]) -> bytes:
        out = []
        for ev in events:
            if isinstance(ev, ReasoningDelta | TextDelta):
                if not ev.text:
                    continue
                kind = "thinking" if isinstance(ev, ReasoningDelta) else "text"
                if self._open != kind:
                    block = {"type": "thinking", "thinking": "", "signature": ""}
                    out.append(self._begin(block if kind == "thinking" else {"type": "text", "text": ""}))
                    self._open = kind
                delta = (
                    {"type": "thinking_delta", "thinking": ev.text}
                    if kind == "thinking"
                    else {"type": "text_delta", "text": ev.text}
                )
                out.append(_event("content_block_delta", {"index": self._index, "delta": delta}))
            elif isinstance(ev, ToolCallDelta):  # a streamed call: its arguments are JSON-object text
                if ev.index not in self._streamed:
                    self._streamed.add(ev.index)
                    out.append(self._begin({"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}}))
                    self._open = "tool_use"
                if ev.arguments:
                    delta = {"type": "input_json_delta", "partial_json": ev.arguments}
                    out.append(_event("content_block_delta", {"index": self._index, "delta": delta}))
            elif isinstance(ev, ToolCallEvent) and ev.index in self._streamed:
                if self._open == "tool_use":
                    out.append(self._close())
            elif isinstance(ev, ToolCallEvent):
                call = ev.call
                out.append(self._begin({"type": "tool_use", "id": call.id, "name": call.name, "input": {}}))
                delta = {"type": "input_json_delta", "partial_json": _wire_input_json(call.arguments)}
                out.append(_event("content_block_delta", {"index": self._index, "delta": delta}))
                out.append(_event("content_block_stop", {"index": self._index}))
        return b"".join(out)

    def finish(self, completion: Completion) -> bytes:
        delta = {"stop_reason": _stop_reason(completion), "stop_sequence": None}
        usage = {"output_tokens": completion.usage.completion_tokens}
        return (
            self._close()
            + _event("message_delta", {"delta": delta, "usage": usage})
            + _event("message_stop", {})
        )

    def error(self, message: str, code: str) -> bytes:
        return encode(orjson.dumps(_error_body(error_type(500, code), message)), event="error")

    def keepalive(self) -> bytes:
        return PING
