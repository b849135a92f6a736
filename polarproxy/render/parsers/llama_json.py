"""Llama 3.1 JSON tool calls: the answer is `{"name": "NAME", "parameters": {...}}` (optionally after
`<|python_tag|>`; several calls separated by `;`), ended by `<|eot_id|>` or `<|eom_id|>`.

An answer that starts with `{` is held until it is known to be a call: it streams from the moment its
header (`"name"`, then `"parameters"` or `"arguments"`) is parsed, and is parsed whole when its keys come
in another order. An object that is not a call, and everything after it, is text. `<|python_tag|>` code
that is not JSON (Llama's built-in tools) is text too.
"""

from __future__ import annotations

import re

from polarproxy.render.parsers.base import (
    JSON_CALL_HEADER,
    Machine,
    could_start,
    header_name,
)

PYTHON_TAG = "<|python_tag|>"
END_TAGS = ("<|eot_id|>", "<|eom_id|>")
_TAIL = re.compile(r"\s*\}?")


class LlamaJsonParser(Machine):
    mode = "start"

    def on_start(self) -> bool:
        head = self.buf.lstrip()
        if head.startswith(PYTHON_TAG):
            self.take(len(self.buf) - len(head) + len(PYTHON_TAG))
            self.mode = "call"
            return True
        if head.startswith("{"):
            self.mode = "call"
            return True
        if could_start(head, (PYTHON_TAG,)):
            return False
        self.mode = "text"
        return True

    def on_text(self) -> bool:
        if self.text_until((PYTHON_TAG,)) is None:
            return False
        self.mode = "call"
        return True

    def on_call(self) -> bool:
        """Where a call object may start (after `<|python_tag|>` or `;`)."""
        head = self.buf.lstrip()
        if not head:
            return False
        if not head.startswith("{"):
            return self.as_text()
        self.take(len(self.buf) - len(head))
        self.start_object()
        self.mode = "head"
        return True

    def on_head(self) -> bool:
        m = JSON_CALL_HEADER.match(self.buf)
        if m and (name := header_name(m.group(1))):
            self.commit(name, m.end(), after="tail")
            return True
        return self.whole_call(after="between")

    def on_tail(self) -> bool:
        """After the arguments: the object's closing `}`."""
        m = _TAIL.match(self.buf)
        assert m is not None
        if m.end() == len(self.buf) and not m.group().endswith("}"):
            return False
        self.drop(m.end())
        self.mode = "between"
        return True

    def on_between(self) -> bool:
        """After a call: `;` and another call, the end of turn, or text."""
        head = self.buf.lstrip()
        if not head:
            return False
        if head.startswith(";"):
            self.take(len(self.buf) - len(head) + 1)
            self.mode = "call"
            return True
        for tag in END_TAGS:
            if head.startswith(tag):
                self.drop(len(self.buf) - len(head) + len(tag))
                self.mode = "text"
                return True
        if could_start(head, END_TAGS):
            return False
        self.mode = "text"
        return True

    def finish_markup(self) -> None:
        if self.mode == "tail":
            self.buf = ""
        if self.mode in ("tail", "between"):
            self.mode = "text"
        else:
            self.as_text()
