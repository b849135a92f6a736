"""One call's output, from sampled token IDs to stream events and the final `Completion` (DESIGN.md §4).

`OutputDecoder` composes the three incremental steps that turn backend chunks into what the harness sees:
the detokenizer (never splits a character), stop-string trimming (text ends before a matched stop string)
and the model family's parser (reasoning, text, tool calls). The gateway hands it each chunk's new IDs
(`push(ids) -> events`) and ends with `flush(...) -> (events, completion)`; every event goes out as is,
and the events' deltas add up to the completion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from polarproxy.conversation import Completion, FinishReason, StreamEvent, Tool, Usage
from polarproxy.render.detokenize import IncrementalDetokenizer
from polarproxy.render.family import OutputFormat
from polarproxy.render.output_parser import OutputParser, opens_reasoning
from polarproxy.render.stops import StopTrimmer


class OutputDecoder:
    def __init__(
        self, decode: Callable[[Sequence[int]], str], *, stops: Sequence[str], parser: OutputParser
    ) -> None:
        self._detok = IncrementalDetokenizer(decode)
        self._trimmer = StopTrimmer(list(stops))
        self._parser = parser

    def push(self, ids: Sequence[int]) -> list[StreamEvent]:
        """The new sampled IDs that become text (a matched stop token is left out by the caller)."""
        text = self._trimmer.push(self._detok.push(ids))
        return self._parser.feed(text) if text else []

    def flush(
        self, finish_reason: FinishReason, usage: Usage | None = None, matched_stop: int | str | None = None
    ) -> tuple[list[StreamEvent], Completion]:
        """The output ended: what each step still holds, then the completion. `matched_stop` is the
        backend's report of the stop string or token that ended it (a string is cut from the text)."""
        text = self._trimmer.push(self._detok.flush()) + self._trimmer.finish(matched_stop)
        events = self._parser.feed(text) if text else []
        tail, completion = self._parser.finish(finish_reason, usage)
        return events + tail, completion


def output_decoder(
    decode: Callable[[Sequence[int]], str],
    fmt: OutputFormat,
    *,
    stops: Sequence[str],
    tools: Sequence[Tool],
    new_call_id: Callable[[], str],
    prompt_tail: str = "",
) -> OutputDecoder:
    """The decoder for one call in format `fmt`; `prompt_tail` is the end of the prompt's text (a prompt
    that opens `<think>` makes the answer start inside reasoning)."""
    parser = OutputParser(
        new_call_id=new_call_id,
        tool_format=fmt.tool,
        reasoning_format=fmt.reasoning,
        tools=tools,
        reasoning_open=fmt.reasoning == "think" and opens_reasoning(prompt_tail),
    )
    return OutputDecoder(decode, stops=stops, parser=parser)
