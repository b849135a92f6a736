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


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_TOKENS_LIMIT = 2**31 - 1  # more than any context; beyond it a backend's own integer types overflow


def number(
    body: dict[str, Any],
    key: str,
    kind: type,
    *,
    where: str = "",
    minimum: float | None = None,
    maximum: float | None = None,
) -> Any:
    """An optional numeric field: None when absent, else `kind(value)`. Refused with a DialectError naming
    the field (`where` prefixes its path): a bool, a string, a fractional value for int, a value outside
    [minimum, maximum], and always an integer beyond 64 bits (JSON parsers read those as huge floats)."""
    v = body.get(key)
    if v is None:
        return None
    what = "an integer" if kind is int else "a number"
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or (kind is int and isinstance(v, float) and not v.is_integer())
    ):
        raise DialectError(f"{where}{key} must be {what}, not {_short(v)}.")
    low = INT64_MIN if minimum is None else minimum
    high = INT64_MAX if maximum is None else maximum
    if isinstance(v, float) and kind is int and not -(2**63) < v < 2**63:  # orjson reads these as floats
        raise DialectError(f"{where}{key} must be an integer that fits in 64 bits, not {_short(v)}.")
    if not low <= v <= high:
        raise DialectError(
            f"{where}{key} must be {what} from {_bound(low)} to {_bound(high)}, not {_short(v)}."
        )
    return kind(v)


def _bound(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def max_tokens(body: dict[str, Any], key: str, *, where: str = "") -> int | None:
    """An optional output-token limit: a positive integer up to MAX_TOKENS_LIMIT."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
        raise DialectError(f"{where}{key} must be an integer, not {_short(v)}.")
    if v < 1:
        raise DialectError(f"{where}{key} must be a positive integer, not {_short(v)}.")
    if v > MAX_TOKENS_LIMIT:
        raise DialectError(
            f"{where}{key} must be a positive integer up to {MAX_TOKENS_LIMIT}, not {_short(v)}."
        )
    return int(v)


def sampling_number(body: dict[str, Any], key: str, meaning: str, *, where: str = "") -> Any:
    """An optional sampling setting, by its meaning: temperature (>= 0), top_p (0 to 1), top_k (an integer
    >= -1; -1 and 0 mean no limit to SGLang and vLLM), seed (any 64-bit integer)."""
    if meaning == "temperature":
        return number(body, key, float, where=where, minimum=0.0, maximum=1e6)
    if meaning == "top_p":
        return number(body, key, float, where=where, minimum=0.0, maximum=1.0)
    if meaning == "top_k":
        return number(body, key, int, where=where, minimum=-1, maximum=MAX_TOKENS_LIMIT)
    if meaning == "seed":
        return number(body, key, int, where=where)
    raise ValueError(f"unknown sampling setting {meaning!r}")


def string(body: dict[str, Any], key: str, *, where: str = "", default: str = "") -> str:
    """An optional string field: `default` when absent or null; anything else refused."""
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise DialectError(f"{where}{key} must be a string, not {_short(v)}.")
    return v


def flag(body: dict[str, Any], key: str, *, where: str = "") -> bool:
    """An optional boolean field (false when absent or null)."""
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise DialectError(f"{where}{key} must be true or false, not {_short(v)}.")
    return v


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else f"{text[:57]}..."


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
