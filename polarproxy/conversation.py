"""Neutral conversation and completion types shared by every dialect, the renderer and the store.

A dialect parses a provider request into a `Conversation` and builds the provider response from a
`Completion`; nothing downstream of the dialects knows which wire format a call came in.
These types hold plain data only (no I/O, no third-party imports) and serialise with `to_dict`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls", "abort"]


@dataclass(slots=True)
class ToolCall:
    """One function call the model made. `arguments` is the JSON text, exactly as sampled or sent."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class Message:
    """One turn. `content` is the turn's text; `reasoning` the model's thinking, when it has any."""

    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    signature: str | None = None  # opaque reasoning signature a provider format carries back (see Completion)

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [{"id": t.id, "name": t.name, "arguments": t.arguments} for t in self.tool_calls],
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "signature": self.signature,
        }


@dataclass(slots=True)
class Tool:
    """A function the model may call, with its JSON-Schema parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Sampling:
    """Sampling settings the harness asked for; None means the backend's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass(slots=True)
class Conversation:
    """A provider request in neutral form: what the model is asked to continue."""

    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    sampling: Sampling = field(default_factory=Sampling)
    model: str = ""
    stream: bool = False
    include_usage: bool = False
    tool_choice: str | dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (nested objects are shared, not copied: this runs on every call)."""
        return {
            "messages": [m.to_dict() for m in self.messages],
            "tools": [
                {"name": t.name, "description": t.description, "parameters": t.parameters} for t in self.tools
            ],
            "sampling": asdict(self.sampling),
            "model": self.model,
            "stream": self.stream,
            "include_usage": self.include_usage,
            "tool_choice": self.tool_choice,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Conversation:
        messages = [
            Message(**{**m, "tool_calls": [ToolCall(**t) for t in m.get("tool_calls", [])]})
            for m in data["messages"]
        ]
        return Conversation(
            messages=messages,
            tools=[Tool(**t) for t in data.get("tools", [])],
            sampling=Sampling(**data.get("sampling", {})),
            model=data.get("model", ""),
            stream=data.get("stream", False),
            include_usage=data.get("include_usage", False),
            tool_choice=data.get("tool_choice"),
        )


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class Completion:
    """What the model answered, parsed out of its sampled tokens."""

    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)
    # An opaque token the dialect sends with the answer where its format has one (Anthropic thinking
    # `signature`, Responses `encrypted_content`, Gemini `thoughtSignature`); the harness sends it back with
    # the assistant turn, which lets polarproxy recognise the turn it produced.
    signature: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def as_message(self) -> Message:
        return Message(
            role="assistant",
            content=self.text,
            reasoning=self.reasoning,
            tool_calls=list(self.tool_calls),
            signature=self.signature,
        )


# Streaming: a completion is delivered as a sequence of these events, then a final `Completion`.


@dataclass(slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class ReasoningDelta:
    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of tool call `index` while it is being sampled. The first piece opens the call (its `id` and
    `name`, with `arguments` usually empty); the `arguments` of all its pieces add up exactly to the
    arguments of the `ToolCallEvent` that closes it. Only calls whose arguments are JSON-object text are
    streamed this way; a call parsed whole arrives as a `ToolCallEvent` alone."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class ToolCallEvent:
    """A complete tool call, emitted once its end has been sampled (after its `ToolCallDelta`s, if any)."""

    index: int
    call: ToolCall


StreamEvent = TextDelta | ReasoningDelta | ToolCallDelta | ToolCallEvent
