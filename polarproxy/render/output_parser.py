"""Parse sampled text into reasoning, text and tool calls, incrementally, as tokens arrive.

Reasoning (`--reasoning-format think`) is `<think>...</think>` at the start of the answer, or everything up
to `</think>` when the prompt already opened `<think>` (Qwen3.5-style generation prompts; see
`opens_reasoning`). The rest goes to the model family's tool-call parser (`polarproxy.render.parsers`:
hermes, qwen-xml, llama-json, deepseek, mistral, harmony). A tool call that does not parse is returned as
text, never raised. Whitespace around reasoning and text is trimmed, and the streamed deltas add up to
exactly the final `Completion` fields: the completion is built from the events that were streamed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from polarproxy.choices import REASONING_FORMATS
from polarproxy.conversation import Completion, FinishReason, StreamEvent, Tool, Usage
from polarproxy.render.parsers import OWN_REASONING, PARSERS
from polarproxy.render.parsers.base import Output, partial_suffix

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def opens_reasoning(prompt_tail: str) -> bool:
    """Whether a prompt ending in `prompt_tail` leaves a `<think>` open, so the answer starts inside it."""
    return prompt_tail.rstrip().endswith(THINK_OPEN)


class OutputParser:
    """`feed(text) -> events`; `finish(finish_reason, usage) -> (events, Completion)`."""

    def __init__(
        self,
        *,
        new_call_id: Callable[[], str],
        reasoning_open: bool = False,
        tool_format: str = "hermes",
        reasoning_format: str = "think",
        tools: Sequence[Tool] = (),
    ) -> None:
        if tool_format not in PARSERS:
            raise ValueError(
                f"Unknown tool format {tool_format!r}. Must be one of {', '.join(map(repr, PARSERS))}."
            )
        if reasoning_format not in REASONING_FORMATS:
            raise ValueError(
                f"Unknown reasoning format {reasoning_format!r}. Must be one of "
                f"{', '.join(map(repr, REASONING_FORMATS))}."
            )
        self._out = Output(new_call_id)
        self._tools = PARSERS[tool_format](self._out, list(tools))
        thinks = reasoning_format == "think" and tool_format not in OWN_REASONING
        self._mode = ("think" if reasoning_open else "start") if thinks else "body"
        self._buf = ""
        if thinks and reasoning_open:
            self._out.saw_reasoning = True

    def feed(self, text: str) -> list[StreamEvent]:
        if self._mode == "body":
            self._tools.feed(text)
        else:
            self._buf += text
            while self._buf and self._mode != "body" and self._step():
                pass
            if self._mode == "body" and self._buf:
                rest, self._buf = self._buf, ""
                self._tools.feed(rest)
        return self._out.take()

    def _step(self) -> bool:
        buf = self._buf
        if self._mode == "start":
            stripped = buf.lstrip()
            if not stripped:
                return False
            if stripped.startswith(THINK_OPEN):
                self._buf = stripped[len(THINK_OPEN) :]
                self._mode = "think"
                self._out.saw_reasoning = True
                return True
            if THINK_OPEN.startswith(stripped):
                return False  # could still become <think>
            self._mode = "body"
            return True
        idx = buf.find(THINK_CLOSE)  # think
        if idx >= 0:
            self._out.reasoning(buf[:idx])
            self._buf = buf[idx + len(THINK_CLOSE) :]
            self._mode = "body"
            return True
        keep = partial_suffix(buf, (THINK_CLOSE,))
        self._out.reasoning(buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep :]
        return False

    def finish(
        self, finish_reason: FinishReason, usage: Usage | None = None
    ) -> tuple[list[StreamEvent], Completion]:
        """Flush what is held back. An unclosed `<think>` stays reasoning; an unfinished call that was
        committed is closed as it stands, other unfinished markup is text."""
        rest, self._buf = self._buf, ""
        if self._mode == "think":
            self._out.reasoning(rest)
        else:
            self._tools.feed(rest)
        self._tools.finish()
        out = self._out
        if finish_reason == "stop" and out.calls:
            finish_reason = "tool_calls"
        completion = Completion(
            text=out.text_value,
            reasoning=out.reasoning_value,
            tool_calls=list(out.calls),
            finish_reason=finish_reason,
            usage=usage or Usage(),
        )
        return out.take(), completion


def parse_output(
    text: str,
    *,
    new_call_id: Callable[[], str],
    finish_reason: FinishReason = "stop",
    tool_format: str = "hermes",
    reasoning_format: str = "think",
    tools: Sequence[Tool] = (),
    reasoning_open: bool = False,
) -> Completion:
    """Parse a whole sampled text at once (same result as feeding it in pieces)."""
    parser = OutputParser(
        new_call_id=new_call_id,
        tool_format=tool_format,
        reasoning_format=reasoning_format,
        tools=tools,
        reasoning_open=reasoning_open,
    )
    parser.feed(text)
    return parser.finish(finish_reason)[1]
