"""The output text the local backend reports, as SGLang does: streamed as it grows (never a tail that
could still become a stop string), and whole at the end (trimmed at the matched stop)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from polarproxy.backends.local.model_runner import ModelRunner, SamplingParams


class IncrementalText:
    """Cumulative output text for streaming: only complete characters, and never a tail that could
    still become a stop string, so every emitted text is a prefix of the next and of the final text."""

    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]) -> None:
        self._decode = decode
        self._stop = stop
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def update(self, ids: list[int]) -> str:
        prefix = self._decode(ids[self._prefix_offset : self._read_offset])
        new = self._decode(ids[self._prefix_offset :])
        if len(new) > len(prefix) and not new.endswith("\ufffd"):
            self.text += new[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(ids)
        hold = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return self.text[: len(self.text) - hold]


def final_text(
    runner: ModelRunner, output_ids: list[int], finish: dict[str, Any] | None, params: SamplingParams
) -> str:
    """The response text: decoded with `skip_special_tokens`, trimmed at the matched stop as SGLang does."""
    ids = output_ids
    matched = (finish or {}).get("matched")
    trim = not params.no_stop_trim and matched is not None
    if trim and isinstance(matched, int) and not isinstance(matched, bool) and ids:
        ids = ids[:-1]
    text = runner.decode(ids, skip_special_tokens=params.skip_special_tokens)
    if trim and isinstance(matched, str):
        pos = text.find(matched)
        if pos != -1:
            text = text[:pos]
    return text
