"""Server-sent events: an incremental decoder and an encoder.

The decoder follows the WHATWG event-stream rules closely enough for every server we talk to:
lines end in LF, CRLF or CR; `data:` lines accumulate; a blank line dispatches; `:` starts a comment;
a single space after the colon is dropped. Feed it bytes split anywhere, even inside a UTF-8 character
or between CR and LF, and it yields the same events.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Event:
    data: str
    event: str = "message"
    id: str | None = None


class SSEDecoder:
    """`decode(chunk) -> list[Event]`, then `flush()` at end of stream."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
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
        events: list[Event] = []
        buf = self._buf + text
        start = 0
        n = len(buf)
        i = 0
        while i < n:
            c = buf[i]
            if c == "\n" or c == "\r":
                line = buf[start:i]
                if c == "\r":
                    if i + 1 < n:
                        if buf[i + 1] == "\n":
                            i += 1
                    else:
                        self._pending_cr = True
                start = i + 1
                ev = self._line(line)
                if ev is not None:
                    events.append(ev)
            i += 1
        self._buf = buf[start:]
        return events

    def flush(self) -> list[Event]:
        tail = self._text.decode(b"", final=True)
        events = self.decode(tail.encode()) if tail else []
        if self._buf:
            ev = self._line(self._buf)
            self._buf = ""
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
