"""Provider responses back into a neutral `Completion` (intercept mode records what a real provider answered).

The request side of each wire format lives in `polarproxy.dialects.<name>`; these modules read the other
direction: a whole JSON body, or the decoded events of a stream, one at a time. Each parser reuses its
dialect's own message parsing, so an answer reads exactly as the same turn does when the harness sends it
back in its next request (which is what lets the SFT export chain calls into trajectories).
"""

from __future__ import annotations

from polarproxy.dialects.replies.anthropic import AnthropicReply
from polarproxy.dialects.replies.base import Reply, ReplyParser
from polarproxy.dialects.replies.gemini import GeminiReply
from polarproxy.dialects.replies.openai_chat import ChatReply
from polarproxy.dialects.replies.openai_responses import ResponsesReply

PARSERS: dict[str, type[ReplyParser]] = {
    "openai_chat": ChatReply,
    "openai_responses": ResponsesReply,
    "anthropic": AnthropicReply,
    "gemini": GeminiReply,
}


def reply_parser(dialect: str, *, turns: int = 0) -> ReplyParser:
    """A fresh parser for one response in `dialect`. `turns` is how many turns the request held (Gemini
    names tool calls by their turn's position)."""
    try:
        cls = PARSERS[dialect]
    except KeyError:
        raise ValueError(
            f"No response parser for dialect {dialect!r}. Must be one of {', '.join(map(repr, PARSERS))}."
        ) from None
    return cls(turns=turns)


__all__ = ["PARSERS", "Reply", "ReplyParser", "reply_parser"]
