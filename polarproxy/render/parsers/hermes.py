"""Hermes JSON tool calls (Qwen2.5, Qwen3, Hermes 2 Pro, the tiny model):
`<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>`.

A call whose body starts `{"name": "...", "arguments": {` streams its arguments as sampled; any other body
(keys in another order, arguments as a string) is parsed whole at `</tool_call>`, and is text when it is
not a `{"name", "arguments"}` object.
"""

from __future__ import annotations

import json
import re

from polarproxy.render.parsers.base import JSON_CALL_HEADER, Machine, call_from_object, header_name

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_TAIL = re.compile(r"\s*\}?\s*")


class HermesParser(Machine):
    def on_text(self) -> bool:
        if self.text_until((CALL_OPEN,)) is None:
            return False
        self.mode = "head"
        self._scan_from = 0
        return True

    def on_head(self) -> bool:
        m = JSON_CALL_HEADER.match(self.buf)
        close = self.buf.find(CALL_CLOSE, self._scan_from)
        if m and (close < 0 or close > m.end()) and (name := header_name(m.group(1))):
            self.commit(name, m.end(), after="tail")
            return True
        if close < 0:
            self._scan_from = max(0, len(self.buf) - len(CALL_CLOSE) + 1)
            return False
        body = self.buf[:close]
        try:
            parsed = call_from_object(json.loads(body))
        except ValueError:
            parsed = None
        end = close + len(CALL_CLOSE)
        if parsed is None:
            self.out.text(self.raw + self.buf[:end])
        else:
            self.out.whole_call(*parsed)
        self.raw = ""
        self.drop(end)
        self.mode = "text"
        return True

    def on_tail(self) -> bool:
        """After the arguments: the object's `}` and `</tool_call>`; anything else is text."""
        skip = _TAIL.match(self.buf)
        rest = self.buf[skip.end() if skip else 0 :]
        if rest.startswith(CALL_CLOSE):
            self.drop(len(self.buf) - len(rest) + len(CALL_CLOSE))
            self.mode = "text"
            return True
        if CALL_CLOSE.startswith(rest):
            return False  # whitespace, `}` or part of the closing tag so far
        self.drop(len(self.buf) - len(rest))
        self.mode = "text"
        return True

    def finish_markup(self) -> None:
        if self.mode == "tail":
            self.buf = ""
            self.mode = "text"
        else:
            super().finish_markup()
