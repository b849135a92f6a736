"""Stop strings: the text a harness sees ends before a matched stop string, as OpenAI's API does.

The record keeps every sampled ID (T1); only the text shown is cut. While streaming, text that could be
the start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations


class StopTrimmer:
    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self._done = False

    def push(self, text: str) -> str:
        if self._done:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._done = True
            self._held = ""
            return buf[:cut]
        keep = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    keep = max(keep, k)
                    break
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def finish(self, matched: int | str | None = None) -> str:
        """Release what is held, unless the backend says a stop string matched (then it is cut)."""
        held, self._held = self._held, ""
        if self._done or isinstance(matched, str):
            return ""
        return held
