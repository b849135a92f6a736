"""Server-sent events: an incremental decoder and an encoder.

The decoder follows the WHATWG event-stream rules closely enough for every server we talk to:
lines end in LF, CRLF or CR; `data:` lines accumulate; a blank line dispatches; `:` starts a comment;
a single space after the colon is dropped. Feed it bytes split anywhere, even inside a UTF-8 character
or between CR and LF, and it yields the same events.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

_EOL = re.compile(r"\r\n|\r|\n")


@dataclass(slots=True, frozen=True)
class Event:
    data: str
    event: str = "message"
    id: str | None = None


class SSEDecoder:
    """`decode(chunk) -> list[Event]`, then `flush()` at end of stream.

    Lines are found with `str.split` (LF only) or a compiled regex (any CR), and a partial line is kept as a
    list of pieces, so the cost is linear in the bytes fed however the stream is split (SGLang's cumulative
    events grow with the answer)."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []  # the current partial line, in pieces
        self._pending_cr = False
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None

    def decode(self, chunk: bytes) -> list[Event]:
        text = self._text.decode(chunk)
        if not text:
            return []
        if self._pending_cr:
            self._pending_cr = False
            if text.startswith("\n"):
                text = text[1:]
                if not text:
                    return []
        if "\n" not in text and "\r" not in text:
            self._parts.append(text)
            return []
        buf = "".join(self._parts) + text if self._parts else text
        self._parts = []
        lines, rest = self._split(buf)
        events: list[Event] = []
        for line in lines:
            ev = self._line(line)
            if ev is not None:
                events.append(ev)
        if rest:
            self._parts.append(rest)
        return events

    def _split(self, buf: str) -> tuple[list[str], str]:
        """`buf`'s whole lines and what follows the last line end."""
        if "\r" not in buf:  # LF-only lines, as every server we talk to sends: str.split, at C speed
            *lines, rest = buf.split("\n")
            return lines, rest
        lines: list[str] = []
        start = 0
        for m in _EOL.finditer(buf):
            end = m.end()
            if end == len(buf) and m.group() == "\r":
                self._pending_cr = True  # a CR at the end: an LF may follow in the next chunk
            lines.append(buf[start : m.start()])
            start = end
        return lines, buf[start:]

    def flush(self) -> list[Event]:
        tail = self._text.decode(b"", final=True)
        events = self.decode(tail.encode()) if tail else []
        if self._parts:
            ev = self._line("".join(self._parts))
            self._parts = []
            if ev is not None:
                events.append(ev)
        # A stream that ends without a final blank line does not dispatch its last event (WHATWG).
        self._data, self._event = [], ""
        return events

    def _line(self, line: str) -> Event | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            ev = Event(data="\n".join(self._data), event=self._event or "message", id=self._id)
            self._data, self._event = [], ""
            return ev
        if line.startswith(":"):
            return None
        if line.startswith("data: "):  # the common line, copied once
            self._data.append(line[6:])
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


def encode(data: str | bytes, event: str | None = None) -> bytes:
    """One event as bytes. `data` must not contain newlines (JSON from orjson never does)."""
    body = data if isinstance(data, bytes) else data.encode()
    if event is None:
        return b"data: " + body + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + body + b"\n\n"


KEEPALIVE = b": keep-alive\n\n"
