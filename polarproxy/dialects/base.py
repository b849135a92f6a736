"""The small interface every wire format implements (DESIGN.md §3)."""

from __future__ import annotations

from typing import Any, Protocol

from polarproxy.conversation import Completion, Conversation, StreamEvent


def answer_signature(response_id: str) -> str:
    """The opaque signature polarproxy gives an answer (Completion.signature): stream writers, which see
    the completion only at the end, derive the same value from the response ID they were built with."""
    return f"polarproxy:{response_id}"


class DialectError(Exception):
    """A request the dialect cannot turn into a conversation. Sent to the harness as a provider error."""

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


def number(body: dict[str, Any], key: str, kind: type, *, where: str = "") -> Any:
    """An optional numeric field: None when absent, else `kind(value)`; a bool, a string or (for int) a
    fractional value is refused with a DialectError naming the field (`where` prefixes its path)."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or (kind is int and not float(v).is_integer()):
        raise DialectError(f"{where}{key} must be {'an integer' if kind is int else 'a number'}, not {v!r}.")
    return kind(v)


class StreamWriter(Protocol):
    """Builds one streamed response, chunk by chunk, in the dialect's own event format."""

    content_type: str
    """The response's content type (`text/event-stream` for SSE)."""

    def start(self) -> bytes: ...

    def events(self, events: list[StreamEvent]) -> bytes: ...

    def finish(self, completion: Completion) -> bytes:
        """Everything after the last delta: finish reason, usage, terminator."""
        ...

    def error(self, message: str, code: str) -> bytes:
        """An error event that ends the stream."""
        ...

    def keepalive(self) -> bytes: ...


class Dialect(Protocol):
    name: str
    """Short name recorded with each call, e.g. 'openai_chat'."""

    routes: tuple[str, ...]
    """What it serves, for error messages, e.g. ('POST /v1/chat/completions',)."""

    def matches(self, method: str, path: str) -> bool:
        """Whether this dialect serves `method path` (path without the query string)."""
        ...

    def parse(self, body: Any, *, path: str, query: dict[str, str]) -> Conversation:
        """A decoded JSON request body into a conversation; raises DialectError."""
        ...

    def response(self, completion: Completion, *, response_id: str, model: str, created: int) -> bytes: ...

    def stream_writer(
        self, conv: Conversation, *, response_id: str, model: str, created: int
    ) -> StreamWriter: ...

    def error(self, status: int, message: str, code: str) -> bytes: ...
