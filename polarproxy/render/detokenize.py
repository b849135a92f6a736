"""Turn a growing list of sampled token IDs into text deltas without ever splitting a character.

Byte-level BPE tokens can end inside a UTF-8 character; decoding such a prefix yields U+FFFD. We decode a
short window of recent tokens and hold back text until it no longer ends in U+FFFD, so the deltas add up
to `decode(all_ids)` exactly, in time linear in the number of tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # window start: tokens before it are fully emitted
        self._read = 0  # tokens up to here are emitted

    def push(self, new_ids: Sequence[int]) -> str:
        self._ids.extend(new_ids)
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if full_text.endswith(REPLACEMENT) or len(full_text) < len(prefix_text):
            return ""  # inside a multi-byte character: wait for more tokens
        delta = full_text[len(prefix_text) :]
        self._prefix = self._read
        self._read = len(self._ids)
        return delta

    def flush(self) -> str:
        """Whatever is still held (a stream that ended inside a character yields U+FFFD, as decode does)."""
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :]
