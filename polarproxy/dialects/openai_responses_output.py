"""OpenAI Responses answers: the Response object and its SSE stream.

The Response's output is a `reasoning` item (when the completion has reasoning; its `encrypted_content` is
the completion's signature, which the harness sends back), a `message` item (when there is text) and one
`function_call` item per tool call, in that order. The stream opens the items as the parsed output comes
(see `ResponsesStreamWriter`), streams a call's arguments as they are sampled, and ends with
`response.completed` (or `response.incomplete`) carrying the items exactly as streamed: the same object as
the non-streamed answer unless text followed a tool call (then it is a second message item, which the
request side reads back as the same assistant turn).
"""

from __future__ import annotations

from typing import Any

import orjson

from polarproxy.conversation import (
    Completion,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEvent,
)
from polarproxy.dialects.base import answer_signature
from polarproxy.sse import KEEPALIVE, encode


def split_tool_name(name: str) -> tuple[str | None, str]:
    """A neutral tool name back into (namespace, name): `ns.fn` → ('ns', 'fn'), `fn` → (None, 'fn')."""
    ns, dot, inner = name.partition(".")
    return (ns, inner) if dot and ns and inner else (None, name)


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
