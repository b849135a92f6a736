"""Wire formats: each turns a provider request into a Conversation and a Completion back into a response."""

from __future__ import annotations

from polarproxy.dialects.anthropic import AnthropicMessages
from polarproxy.dialects.base import Dialect, DialectError, StreamWriter
from polarproxy.dialects.gemini import Gemini
from polarproxy.dialects.openai_chat import OpenAIChat
from polarproxy.dialects.openai_responses import OpenAIResponses

OPENAI_CHAT = OpenAIChat()

# Every dialect the proxy serves, asked in order. Paths may carry a prefix such as /v1 or /openai/v1.
DIALECTS: list[Dialect] = [OPENAI_CHAT, OpenAIResponses(), AnthropicMessages(), Gemini()]


def route(method: str, path: str) -> Dialect | None:
    """The dialect that serves `method path` (query string excluded), or None."""
    for dialect in DIALECTS:
        if dialect.matches(method, path):
            return dialect
    return None


def served_routes() -> list[str]:
    return [r for d in DIALECTS for r in d.routes]


__all__ = ["DIALECTS", "OPENAI_CHAT", "Dialect", "DialectError", "StreamWriter", "route", "served_routes"]
