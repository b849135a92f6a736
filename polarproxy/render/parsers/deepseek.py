# ruff: noqa: RUF001, RUF002  (DeepSeek spells its special tokens with U+FF5C FULLWIDTH VERTICAL LINE)
"""DeepSeek-V3 tool calls, written with special tokens:
`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>`
(more calls separated by `\\n`), then `<｜tool▁calls▁end｜>`. The V3.1 form
`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` is read too.

Arguments that start with `{` stream as sampled; others (the vLLM template writes them as a JSON string)
are parsed whole at `<｜tool▁call▁end｜>`. A call whose header does not parse is text.
"""

from __future__ import annotations

import json
import re

from polarproxy.render.parsers.base import Machine, could_start

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
_BEFORE_SEP = re.compile(r"\s*([^<\n]*?)" + re.escape(SEP))
_NAME_FENCE = re.compile(r"([^\n<]+)\n```[A-Za-z]*\n")
MAX_HEADER = 512  # characters of a call header before it is given up as text


class DeepSeekParser(Machine):
    def on_text(self) -> bool:
        tag = self.text_until((CALLS_BEGIN, CALL_BEGIN))
        if tag is None:
            return False
        self.mode = "calls" if tag == CALLS_BEGIN else "head"
        return True

    def on_calls(self) -> bool:
        """Between calls: another call, or the end of the calls."""
        head = self.buf.lstrip()
        ws = len(self.buf) - len(head)
        if head.startswith(CALL_BEGIN):
            self.take(ws + len(CALL_BEGIN))
            self.mode = "head"
            return True
        if head.startswith(CALLS_END):
            self.drop(ws + len(CALLS_END))
            self.raw = ""
            self.mode = "text"
            return True
        if could_start(head, (CALL_BEGIN, CALLS_END)):
            return False
        return self.as_text()

    def on_head(self) -> bool:
        m = _BEFORE_SEP.match(self.buf)
        if m is None:
            if CALL_END in self.buf or "\n" in self.buf or len(self.buf) > MAX_HEADER:
                return self.as_text()
            return False
        after = self.buf[m.end() :]
        body = after.lstrip()
        if not body:
            return False
        if body.startswith("{"):  # V3.1: NAME<sep>{...}
            if not m.group(1).strip():
                return self.as_text()
            self.commit(m.group(1).strip(), len(self.buf) - len(body), after="tail")
            return True
        n = _NAME_FENCE.match(after)
        if n is None:
            if CALL_END in after or len(after) > MAX_HEADER:
                return self.as_text()
            return False
        args = after[n.end() :]
        body = args.lstrip()
        if not body:
            return False
        self._name = n.group(1).strip()
        if body.startswith("{"):
            self.commit(self._name, len(self.buf) - len(body), after="tail")
            return True
        self.take(len(self.buf) - len(args))
        self._scan_from = 0
        self.mode = "whole"
        return True

    def on_whole(self) -> bool:
        """Arguments that are not an object as sampled (a JSON string holding one): parsed at the end."""
        end = self.buf.find(CALL_END, self._scan_from)
        if end < 0:
            self._scan_from = max(0, len(self.buf) - len(CALL_END) + 1)
            return False
        body = self.buf[:end].strip().removesuffix("```").strip()
        try:
            value = json.loads(body)
        except ValueError:
            value = None
        if not isinstance(value, str | dict):
            return self.as_text()
        self.out.whole_call(self._name, value if isinstance(value, str) else body)
        self.raw = ""
        self.drop(end + len(CALL_END))
        self.mode = "calls"
        return True

    def on_tail(self) -> bool:
        """After the arguments: the closing fence and `<｜tool▁call▁end｜>` (anything before it is dropped)."""
        end = self.buf.find(CALL_END)
        if end >= 0:
            self.drop(end + len(CALL_END))
            self.mode = "calls"
            return True
        stop = self.buf.find(CALLS_END)
        if stop >= 0:
            self.drop(stop + len(CALLS_END))
            self.mode = "text"
            return True
        return False

    def finish_markup(self) -> None:
        if self.mode in ("tail", "calls") and not self.raw:
            self.buf = ""
            self.mode = "text"
        else:
            super().finish_markup()
