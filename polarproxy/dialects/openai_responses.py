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

The answer (the Response object and its stream) is written by `openai_responses_output`.
"""

from __future__ import annotations

from typing import Any

import orjson

from polarproxy.conversation import (
    Completion,
    Conversation,
    Message,
    Sampling,
    Tool,
    ToolCall,
)
from polarproxy.dialects.base import DialectError, flag, max_tokens, sampling_number, string
from polarproxy.dialects.openai_chat import error_object
from polarproxy.dialects.openai_responses_output import (
    ResponsesStreamWriter,
    response_object,
)

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
