"""What every response parser produces, and the small interface they share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from polarproxy.conversation import Completion


class ReplyError(ValueError):
    """A response body that is not in the provider's format (the reason is recorded with the call)."""


@dataclass(slots=True)
class Reply:
    """A provider's answer in neutral form, plus what the record needs besides the completion."""

    completion: Completion = field(default_factory=Completion)
    model: str = ""
    response_id: str = ""
    error: str | None = None  # an error the provider reported inside a 2xx stream or body
    complete: bool = False  # the body parsed, or the stream's final event arrived
    usage_reported: bool = False  # the provider sent usage figures (else prompt/completion tokens are 0)


class ReplyParser(Protocol):
    reply: Reply  # filled in as the body or events arrive; `result()` completes it

    def __init__(self, *, turns: int = 0) -> None: ...

    def body(self, data: Any) -> None:
        """A whole (non-streamed) JSON response body; raises ReplyError when it is not one."""
        ...

    def event(self, data: Any, name: str = "message") -> bool:
        """One decoded stream event (SSE `data:` as JSON, `name` its `event:`); True when it carried model
        output (text, reasoning or a tool call), which marks the time to first token."""
        ...

    def result(self) -> Reply: ...


def obj(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ReplyError(f"{what} is not a JSON object but {type(data).__name__}.")
    return data


def count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
