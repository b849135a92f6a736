"""Mistral tool calls: `[TOOL_CALLS] [{"name": "NAME", "arguments": {...}}, ...]` (a JSON array, several calls
in parallel; the template adds an `"id"`), or the newer `[TOOL_CALLS]NAME[ARGS]{...}` (with an optional
`[CALL_ID]ID` before `[ARGS]`).

An object that starts `{"name": "...", "arguments": {` streams its arguments as sampled; one in another
shape is parsed whole when it closes. Whatever does not parse, from there on, is text.
"""

from __future__ import annotations

import re

from polarproxy.render.parsers.base import (
    JSON_CALL_HEADER,
    JsonValue,
    Machine,
    header_name,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)(?:\[CALL_ID\][A-Za-z0-9_\-]*)?\[ARGS\]\s*(?=\{)")
_MAYBE_NAMED = re.compile(r"\s*[A-Za-z0-9_.\-]*(?:\[[A-Z_]*\]?[A-Za-z0-9_\-]*)*\s*")
MAX_NAME = 256


class MistralParser(Machine):
    def on_text(self) -> bool:
        if self.text_until((TOOL_CALLS,)) is None:
            return False
        self.mode = "start"
        return True

    def on_start(self) -> bool:
        """After `[TOOL_CALLS]`: an array, or NAME[ARGS]."""
        head = self.buf.lstrip()
        if not head:
            return False
        if head.startswith("["):
            self.take(len(self.buf) - len(head) + 1)
            self.mode = "items"
            return True
        m = _NAMED.match(self.buf)
        if m:
            self.commit(m.group(1), m.end(), after="text")
            return True
        maybe = _MAYBE_NAMED.match(self.buf)
        if maybe and maybe.end() == len(self.buf) and len(self.buf) <= MAX_NAME:
            return False
        return self.as_text()

    def on_items(self) -> bool:
        """Inside the array: an object, a comma, or the closing `]`."""
        head = self.buf.lstrip()
        ws = len(self.buf) - len(head)
        if not head:
            return False
        if head.startswith(","):
            self.take(ws + 1)
            return True
        if head.startswith("]"):
            self.drop(ws + 1)
            self.raw = ""
            self.mode = "text"
            return True
        if not head.startswith("{"):
            return self.as_text()
        self.take(ws)
        self.start_object()
        self.mode = "head"
        return True

    def on_head(self) -> bool:
        m = JSON_CALL_HEADER.match(self.buf)
        if m and (name := header_name(m.group(1))):
            self.commit(name, m.end(), after="rest")
            self._object = JsonValue(depth=1)  # the rest of the object, after its arguments
            return True
        return self.whole_call(after="items")

    def on_rest(self) -> bool:
        """The object's other keys (the template's `"id"`), up to its closing brace: not part of the call."""
        end, done = self._object.scan(self.buf)
        self.drop(end)
        if done:
            self.mode = "items"
        return done

    def finish_markup(self) -> None:
        if self.mode in ("rest", "items") and not self.raw.strip(", \t\r\n"):
            self.buf = ""
            self.mode = "text"
        else:
            super().finish_markup()
