"""OpenAI Responses: `POST /v1/responses`, streamed (SSE with named `response.*` events) and not.

Request → `Conversation`:
- `instructions` (when present) becomes the first system message; `developer` and `system` input items are
  system messages too (Codex sends its system prompt as the first `developer` item, and a second one for
  skills: they stay separate messages, in order).
- An assistant turn is built from consecutive `reasoning`, assistant `message` and `function_call` items:
  a `reasoning` item attaches to the assistant turn that follows it (its summary or reasoning text becomes
  `Message.reasoning`, its `encrypted_content` `Message.signature`), and function calls join the turn of
  the assistant message or reasoning before them. `function_call_output` items become tool messages.
- Tools: flat `function` tools keep their names. The function tools inside a `namespace` tool are
  flattened to `NAMESPACE.NAME` (OpenAI function names cannot contain a dot, so the name is unambiguous),
  and a call of such a tool goes back out as a `function_call` with `name` and `namespace` split again;
  a `function_call` item sent back with a `namespace` reads as `NAMESPACE.NAME` too. Built-in tools
  (`web_search`, `local_shell`, `custom`, ...) have no function schema and are left out of the prompt.
- `previous_response_id` is refused: polarproxy keeps no server-side state, the harness must send the
  whole conversation in `input` (as Codex and pi do with `store: false`).

Response: a Response object whose output is a `reasoning` item (when the completion has reasoning; its
`encrypted_content` is the completion's signature, which the harness sends back), a `message` item (when
there is text) and one `function_call` item per tool call, in that order. The stream opens and closes the
items in the same order, holding tool calls back until the end (text may follow a tool call in the sampled
output), and ends with `response.completed` (or `response.incomplete`) carrying that same object.
"""

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
from polarproxy.dialects.base import DialectError, answer_signature, flag, max_tokens, sampling_number, string
from polarproxy.dialects.openai_chat import error_object
from polarproxy.sse import KEEPALIVE, encode

SYSTEM_ROLES = ("developer", "system")
ITEM_TYPES = (
    "message",
    "reasoning",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
)


# -- request ------------------------------------------------------------------------------------------


def _parts_text(content: Any, where: str) -> str:
    """Content as a string: a string, null, or an array of text parts (concatenated)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(
            f"{where} must be a string or an array of content parts, not {type(content).__name__}."
        )
    out = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            out.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            out.append(string(part, "text", where=f"{where}[{i}]."))
        elif kind == "refusal":
            out.append(string(part, "refusal", where=f"{where}[{i}]."))
        else:
            raise DialectError(
                f"Unsupported content part type {kind!r} at {where}[{i}]. "
                "Supported: 'input_text', 'output_text', 'refusal'. This model takes text only for now."
            )
    return "".join(out)


def _tool_name(name: Any, namespace: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise DialectError(f"{where}.name must be a non-empty string.")
    return f"{namespace}.{name}" if isinstance(namespace, str) and namespace else name


def split_tool_name(name: str) -> tuple[str | None, str]:
    """A neutral tool name back into (namespace, name): `ns.fn` → ('ns', 'fn'), `fn` → (None, 'fn')."""
    ns, dot, inner = name.partition(".")
    return (ns, inner) if dot and ns and inner else (None, name)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """Full reasoning text when the item has it, else its summary (parts joined by blank lines)."""
    content = item.get("content")
    if isinstance(content, list) and content:
        return "\n\n".join(_parts_text([p], f"{where}.content") for p in content)
    summary = item.get("summary")
    if isinstance(summary, list) and summary:
        return "\n\n".join(_parts_text([p], f"{where}.summary") for p in summary)
    return ""


class _Turns:
    """Builds the message list from input items, merging what makes up one assistant turn."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.open: Message | None = None  # the assistant turn that later items may still join

    def add(self, m: Message) -> None:
        self.open = None
        self.messages.append(m)

    def assistant(self) -> Message:
        if self.open is None:
            self.open = Message(role="assistant")
            self.messages.append(self.open)
        return self.open

    def reasoning(self, text: str, signature: str | None) -> None:
        turn = self.open
        if turn is None or turn.content or turn.tool_calls:
            self.open = None
            turn = self.assistant()
        turn.reasoning = text if turn.reasoning is None else turn.reasoning + "\n\n" + text
        if signature is not None:
            turn.signature = signature

    def assistant_text(self, text: str) -> None:
        turn = self.open
        if turn is not None and turn.tool_calls:
            # text the model wrote after a call of the same turn (no call output came between): the
            # stream sent it as a second message item; it is the same answer
            turn.content = (turn.content or "") + text
            return
        if turn is None or turn.content:
            self.open = None
            turn = self.assistant()
        turn.content = text

    def tool_call(self, call: ToolCall) -> None:
        self.assistant().tool_calls.append(call)


def _input(raw: Any, turns: _Turns) -> None:
    if isinstance(raw, str):
        turns.add(Message(role="user", content=raw))
        return
    if not isinstance(raw, list):
        raise DialectError("input must be a string or an array of input items.")
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise DialectError(f"{where} must be an object.")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            content = _parts_text(item.get("content"), f"{where}.content")
            if role in SYSTEM_ROLES:
                turns.add(Message(role="system", content=content))
            elif role == "user":
                turns.add(Message(role="user", content=content))
            elif role == "assistant":
                turns.assistant_text(content)
            else:
                raise DialectError(
                    f"Unknown role {role!r} at {where}. Must be one of 'developer', 'system', 'user', "
                    "'assistant'."
                )
        elif kind == "reasoning":
            sig = item.get("encrypted_content")
            turns.reasoning(_reasoning_text(item, where), sig if isinstance(sig, str) else None)
        elif kind in ("function_call", "custom_tool_call"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise DialectError(f"{where}.call_id must be a non-empty string.")
            args = item.get("arguments" if kind == "function_call" else "input", "")
            if not isinstance(args, str):
                try:
                    args = orjson.dumps(args).decode()
                except orjson.JSONEncodeError as e:
                    raise DialectError(f"{where}.arguments cannot be encoded: {e}.") from e
            name = _tool_name(item.get("name"), item.get("namespace"), where)
            turns.tool_call(ToolCall(id=call_id, name=name, arguments=args))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise DialectError(f"{where}.call_id must be a non-empty string.")
            output = _parts_text(item.get("output"), f"{where}.output")
            turns.add(Message(role="tool", content=output, tool_call_id=call_id))
        elif kind == "item_reference":
            raise DialectError(
                f"{where} is an item_reference: polarproxy keeps no server-side state, so send the item itself."
            )
        else:
            raise DialectError(
                f"Unsupported input item type {kind!r} at {where}. "
                f"Supported: {', '.join(repr(t) for t in ITEM_TYPES)}."
            )


def _function_tool(t: dict[str, Any], where: str, namespace: str | None = None) -> Tool:
    parameters = t.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise DialectError(f"{where}.parameters must be an object (a JSON Schema).")
    return Tool(
        name=_tool_name(t.get("name"), namespace, where),
        description=string(t, "description", where=f"{where}."),
        parameters=parameters,
    )


def _tools(raw: Any) -> list[Tool]:
    if not raw:
        return []
    if not isinstance(raw, list):
        raise DialectError("tools must be an array.")
    tools = []
    for i, t in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise DialectError(f"{where} must be an object.")
        kind = t.get("type")
        if kind == "function":
            tools.append(_function_tool(t, where))
        elif kind == "namespace":
            ns = t.get("name")
            if not isinstance(ns, str) or not ns:
                raise DialectError(f"{where}.name must be a non-empty string.")
            inner = t.get("tools") or []
            if not isinstance(inner, list):
                raise DialectError(f"{where}.tools must be an array.")
            for j, u in enumerate(inner):
                if isinstance(u, dict) and u.get("type", "function") == "function":
                    tools.append(_function_tool(u, f"{where}.tools[{j}]", ns))
        # built-in tools (web_search, local_shell, custom, ...) have no function schema to render
    return tools


# -- response -----------------------------------------------------------------------------------------


def _reasoning_item(response_id: str, text: str, signature: str | None) -> dict[str, Any]:
    return {
        "id": "rs_" + response_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}] if text else [],
        "encrypted_content": signature,
    }


def _message_item(response_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": "msg_" + response_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": []}]
        if status != "in_progress"
        else [],
    }


def _call_item(response_id: str, index: int, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    namespace, name = split_tool_name(call.name)
    item: dict[str, Any] = {
        "id": f"fc_{response_id}_{index}",
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": name,
        "arguments": call.arguments if status == "completed" else "",
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def _usage(c: Completion) -> dict[str, Any]:
    return {
        "input_tokens": c.usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": c.usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": c.usage.total_tokens,
    }


def _envelope(response_id: str, model: str, created: int, status: str) -> dict[str, Any]:
    return {
        "id": "resp_" + response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": None,
    }


def response_object(
    completion: Completion, *, response_id: str, model: str, created: int, with_reasoning: bool | None = None
) -> dict[str, Any]:
    """The finished Response. `with_reasoning` overrides whether the reasoning item is included (a stream
    that never opened one for an empty reasoning keeps its final object equal to what it sent)."""
    incomplete = completion.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    out = _envelope(response_id, model, created, status)
    if with_reasoning is None:
        with_reasoning = completion.reasoning is not None
    if with_reasoning:
        out["output"].append(_reasoning_item(response_id, completion.reasoning or "", completion.signature))
    if completion.text:
        out["output"].append(_message_item(response_id, completion.text, status))
    for i, call in enumerate(completion.tool_calls):
        out["output"].append(_call_item(response_id, i, call))
    if incomplete:
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    out["usage"] = _usage(completion)
    return out


class OpenAIResponses:
    name = "openai_responses"
    routes = ("POST /v1/responses",)

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.rstrip("/").endswith("/responses")

    def parse(self, body: Any, *, path: str = "", query: dict[str, str] | None = None) -> Conversation:
        if not isinstance(body, dict):
            raise DialectError("The request body must be a JSON object.")
        if body.get("previous_response_id") is not None:
            raise DialectError(
                "previous_response_id is not supported: polarproxy keeps no server-side state. "
                "Send the whole conversation in input (store: false)."
            )
        if body.get("conversation") is not None:
            raise DialectError(
                "conversation is not supported: polarproxy keeps no server-side state. "
                "Send the whole conversation in input."
            )
        turns = _Turns()
        instructions = body.get("instructions")
        if instructions is not None:
            turns.add(Message(role="system", content=_parts_text(instructions, "instructions")))
        if "input" not in body or body["input"] is None:
            raise DialectError("input is required: a string or an array of input items.")
        _input(body["input"], turns)
        if not any(m.role != "system" for m in turns.messages):
            raise DialectError("input must hold at least one user, assistant or tool item.")
        reasoning = body.get("reasoning")
        if reasoning is not None and not isinstance(reasoning, dict):
            raise DialectError("reasoning must be an object.")
        tool_choice = body.get("tool_choice")
        if tool_choice is not None and not isinstance(tool_choice, str | dict):
            raise DialectError(f"tool_choice must be a string or an object, not {tool_choice!r}.")
        return Conversation(
            messages=turns.messages,
            tools=_tools(body.get("tools")),
            sampling=Sampling(
                max_tokens=max_tokens(body, "max_output_tokens"),
                temperature=sampling_number(body, "temperature", "temperature"),
                top_p=sampling_number(body, "top_p", "top_p"),
            ),
            model=string(body, "model"),
            stream=flag(body, "stream"),
            include_usage=True,  # the final event always carries usage
            tool_choice=tool_choice,
        )

    def response(self, completion: Completion, *, response_id: str, model: str, created: int) -> bytes:
        return orjson.dumps(
            response_object(completion, response_id=response_id, model=model, created=created)
        )

    def stream_writer(
        self, conv: Conversation, *, response_id: str, model: str, created: int, prompt_tokens: int = 0
    ) -> ResponsesStreamWriter:
        return ResponsesStreamWriter(response_id=response_id, model=model, created=created)

    def error(self, status: int, message: str, code: str) -> bytes:
        return orjson.dumps({"error": error_object(status, message, code)})


class ResponsesStreamWriter:
    """Output items open in the order the parsed output comes: reasoning (on the first reasoning delta),
    a message (on the first text delta, closing the reasoning), a function call (on its first argument
    piece, closing the message: its `response.function_call_arguments.delta` events follow as the call is
    sampled). Text after a call opens a new message item. A call parsed whole goes out whole. The final
    response lists the items exactly as they were streamed."""

    content_type = "text/event-stream"

    def __init__(self, *, response_id: str, model: str, created: int) -> None:
        self.rid = response_id
        self.model = model
        self.created = created
        self._seq = 0
        self._index = 0  # next output_index
        self._reasoning: str | None = None  # text so far, while the reasoning item is open or was
        self._reasoning_index: int | None = None
        self._reasoning_closed = False
        self._text: str | None = None  # the open message item's text
        self._message_index: int | None = None
        self._message_id = ""
        self._messages = 0  # message items opened so far
        self._calls: dict[int, tuple[int, ToolCall]] = {}  # call index -> (output_index, call) once sent
        self._open_call: tuple[int, int, str, str, str] | None = None  # (call, output_index, item, id, name)
        self._done: dict[int, dict[str, Any]] = {}  # output_index -> the finished item, as sent
        self._error: bytes | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return encode(orjson.dumps(data), event=kind)

    def start(self) -> bytes:
        head = _envelope(self.rid, self.model, self.created, "in_progress")
        return self._event("response.created", response=head) + self._event(
            "response.in_progress", response=head
        )

    # -- items ------------------------------------------------------------------------------------

    def _open_reasoning(self) -> bytes:
        self._reasoning = ""
        self._reasoning_index = self._index
        self._index += 1
        item = {"id": "rs_" + self.rid, "type": "reasoning", "summary": []}
        return self._event(
            "response.output_item.added", output_index=self._reasoning_index, item=item
        ) + self._event(
            "response.reasoning_summary_part.added",
            item_id="rs_" + self.rid,
            output_index=self._reasoning_index,
            summary_index=0,
            part={"type": "summary_text", "text": ""},
        )

    def _close_reasoning(self) -> bytes:
        if self._reasoning is None or self._reasoning_closed:
            return b""
        self._reasoning_closed = True
        text = self._reasoning
        common = {"item_id": "rs_" + self.rid, "output_index": self._reasoning_index, "summary_index": 0}
        item = _reasoning_item(self.rid, text, answer_signature(self.rid))
        assert self._reasoning_index is not None
        self._done[self._reasoning_index] = item
        return (
            self._event("response.reasoning_summary_text.done", text=text, **common)
            + self._event(
                "response.reasoning_summary_part.done", part={"type": "summary_text", "text": text}, **common
            )
            + self._event("response.output_item.done", output_index=self._reasoning_index, item=item)
        )

    def _open_message(self) -> bytes:
        out = self._close_reasoning()
        self._text = ""
        self._message_index = self._index
        self._message_id = "msg_" + self.rid + (f"_{self._messages}" if self._messages else "")
        self._messages += 1
        self._index += 1
        item = _message_item(self.rid, "", "in_progress") | {"id": self._message_id}
        return (
            out
            + self._event("response.output_item.added", output_index=self._message_index, item=item)
            + self._event(
                "response.content_part.added",
                item_id=self._message_id,
                output_index=self._message_index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        )

    def _close_message(self, status: str) -> bytes:
        if self._text is None:
            return b""
        text, index = self._text, self._message_index
        assert index is not None
        self._text = None
        common = {"item_id": self._message_id, "output_index": index, "content_index": 0}
        item = _message_item(self.rid, text, status) | {"id": self._message_id}
        self._done[index] = item
        return (
            self._event("response.output_text.done", text=text, logprobs=[], **common)
            + self._event(
                "response.content_part.done",
                part={"type": "output_text", "text": text, "annotations": []},
                **common,
            )
            + self._event("response.output_item.done", output_index=index, item=item)
        )

    def _close_open_items(self) -> bytes:
        """Before a new call item: the reasoning and the message before it are done."""
        return self._close_reasoning() + self._close_message("completed")

    def _begin_call(self, ev: ToolCallDelta) -> bytes:
        out = self._close_open_items()
        index = self._index
        self._index += 1
        item_id = f"fc_{self.rid}_{ev.index}"
        self._open_call = (ev.index, index, item_id, ev.id, ev.name)
        stub = _call_item(self.rid, ev.index, ToolCall(ev.id, ev.name, ""), "in_progress")
        return out + self._event("response.output_item.added", output_index=index, item=stub)

    def _end_call(self, call_index: int, call: ToolCall) -> bytes:
        assert self._open_call is not None and self._open_call[0] == call_index
        _, index, item_id, _, _ = self._open_call
        self._open_call = None
        self._calls[call_index] = (index, call)
        item = _call_item(self.rid, call_index, call)
        self._done[index] = item
        return self._event(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=index,
            arguments=call.arguments,
        ) + self._event("response.output_item.done", output_index=index, item=item)

    def _call(self, i: int, call: ToolCall) -> bytes:
        """A call parsed whole: its item, all its arguments in one delta, done."""
        out = self._close_open_items()
        index = self._index
        self._index += 1
        item_id = f"fc_{self.rid}_{i}"
        self._calls[i] = (index, call)
        item = _call_item(self.rid, i, call)
        self._done[index] = item
        return (
            out
            + self._event(
                "response.output_item.added",
                output_index=index,
                item=_call_item(self.rid, i, call, "in_progress"),
            )
            + self._event(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=call.arguments,
            )
            + self._event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                arguments=call.arguments,
            )
            + self._event("response.output_item.done", output_index=index, item=item)
        )

    # -- the protocol -----------------------------------------------------------------------------

    def events(self, events: list[StreamEvent]) -> bytes:
        out = []
        for ev in events:
            if isinstance(ev, ReasoningDelta):
                if self._reasoning_closed or self._text is not None:
                    continue  # the parser sends reasoning first only; an item cannot reopen
                if self._reasoning is None:
                    out.append(self._open_reasoning())
                assert self._reasoning is not None
                self._reasoning += ev.text
                out.append(
                    self._event(
                        "response.reasoning_summary_text.delta",
                        item_id="rs_" + self.rid,
                        output_index=self._reasoning_index,
                        summary_index=0,
                        delta=ev.text,
                    )
                )
            elif isinstance(ev, TextDelta):
                if not ev.text or self._open_call is not None:
                    continue  # the parser sends no text inside a call
                if self._text is None:
                    out.append(self._open_message())
                assert self._text is not None
                self._text += ev.text
                out.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self._message_id,
                        output_index=self._message_index,
                        content_index=0,
                        delta=ev.text,
                        logprobs=[],
                    )
                )
            elif isinstance(ev, ToolCallDelta):
                if self._open_call is None or self._open_call[0] != ev.index:
                    out.append(self._begin_call(ev))
                assert self._open_call is not None
                if ev.arguments:
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=self._open_call[2],
                            output_index=self._open_call[1],
                            delta=ev.arguments,
                        )
                    )
            elif isinstance(ev, ToolCallEvent):
                if self._open_call is not None and self._open_call[0] == ev.index:
                    out.append(self._end_call(ev.index, ev.call))
                elif ev.index not in self._calls:
                    out.append(self._call(ev.index, ev.call))
        return b"".join(out)

    def finish(self, completion: Completion) -> bytes:
        status = "incomplete" if completion.finish_reason == "length" else "completed"
        out = []
        if self._reasoning is None and self._text is None and completion.reasoning is not None:
            out.append(self._open_reasoning())  # reasoning that sent no delta (empty) still gets its item
        out.append(self._close_reasoning())
        out.append(self._close_message(status))
        for i, call in enumerate(completion.tool_calls):
            if self._open_call is not None and self._open_call[0] == i:
                out.append(self._end_call(i, call))  # a call cut before its end was parsed
            elif i not in self._calls:
                out.append(self._call(i, call))
        final = response_object(
            completion,
            response_id=self.rid,
            model=self.model,
            created=self.created,
            with_reasoning=self._reasoning is not None,
        )
        final["output"] = [self._done[i] for i in sorted(self._done)]  # as streamed, in order
        out.append(self._event(f"response.{status}", response=final))
        return b"".join(out)

    def error(self, message: str, code: str) -> bytes:
        """`error`, then `response.failed` (what Codex reads). The stream ends here, so the same bytes come
        back if asked again (the gateway builds the recorded body and the sent one separately)."""
        if self._error is None:
            failed = _envelope(self.rid, self.model, self.created, "failed")
            failed["error"] = {"code": "server_error", "message": f"{code}: {message}"}
            self._error = self._event("error", code=code, message=message, param=None) + self._event(
                "response.failed", response=failed
            )
        return self._error

    def keepalive(self) -> bytes:
        return KEEPALIVE
