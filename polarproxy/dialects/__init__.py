"""Wire formats: each turns a provider request into a Conversation and a Completion back into a response."""

from __future__ import annotations

from polarproxy.dialects.base import Dialect, DialectError, StreamWriter
from polarproxy.dialects.openai_chat import OpenAIChat

OPENAI_CHAT = OpenAIChat()

# (method, path suffix) -> dialect. Paths may carry a prefix such as /v1 or /openai/v1.
ROUTES: list[tuple[str, str, Dialect]] = [("POST", "/chat/completions", OPENAI_CHAT)]


def route(method: str, path: str) -> Dialect | None:
    """The dialect that serves `method path` (query string excluded), or None."""
    for m, suffix, dialect in ROUTES:
        if method == m and path.rstrip("/").endswith(suffix):
            return dialect
    return None


def served_routes() -> list[str]:
    return [f"{m} {suffix}" for m, suffix, _ in ROUTES]


__all__ = ["OPENAI_CHAT", "Dialect", "DialectError", "StreamWriter", "route", "served_routes"]
