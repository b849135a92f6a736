"""Reads a provider's response as it streams past, without holding it back.

`ResponseTap.feed` is mitmproxy's `flow.response.stream` callable: it returns every chunk unchanged (the
harness gets the provider's bytes as they arrive) and keeps a copy. The copy is decompressed
incrementally when the provider compressed it, split into SSE events when it is an event stream, and
each event is handed to the dialect's reply parser; the first event that carries model output marks the
time to first token. Anything else (a JSON body, Gemini's streamed JSON array) is parsed whole at the end.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import Any

import orjson

from polarproxy.dialects.replies import Reply, ReplyParser
from polarproxy.dialects.replies.base import ReplyError
from polarproxy.sse import SSEDecoder


def _decompressor(encoding: str) -> Callable[[bytes], bytes] | None:
    """An incremental decoder for a Content-Encoding, None for identity; raises ValueError if unknown."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc in ("gzip", "x-gzip", "deflate"):
        d = zlib.decompressobj(wbits=47 if enc != "deflate" else zlib.MAX_WBITS)
        return d.decompress
    if enc == "br":
        import brotli

        return brotli.Decompressor().process
    if enc == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


class ResponseTap:
    def __init__(self, parser: ReplyParser, *, content_type: str, content_encoding: str, started: float):
        self.parser = parser
        self.started = started
        self.raw = bytearray()  # the body as the provider sent it (compressed if it was)
        self.body = bytearray()  # decompressed
        self.first_byte_at: float | None = None
        self.first_output_at: float | None = None
        self.problem: str | None = None  # why the body could not be read (recorded with the call)
        self.sse = "text/event-stream" in content_type.lower()
        self._events = SSEDecoder() if self.sse else None
        try:
            self._inflate = _decompressor(content_encoding)
        except ValueError as e:
            self._inflate = None
            self.problem = str(e)
            self._events = None

    def feed(self, chunk: bytes) -> bytes:
        """mitmproxy's stream callable: the chunk goes on unchanged; b'' marks the end."""
        if chunk:
            if self.first_byte_at is None:
                self.first_byte_at = time.time()
            self.raw += chunk
            if self.problem is None:
                try:
                    data = self._inflate(chunk) if self._inflate else chunk
                    self.body += data
                    if self._events is not None:
                        self._dispatch(self._events.decode(data))
                except Exception as e:  # a corrupt body is the provider's to send; we only record why
                    self.problem = f"the response body could not be read: {e}"
                    self._events = None
        return chunk

    def _dispatch(self, events: list[Any]) -> None:
        for ev in events:
            if ev.data == "[DONE]":
                self.parser.reply.complete = True
                continue
            try:
                data = orjson.loads(ev.data)
            except orjson.JSONDecodeError as e:
                raise ReplyError(f"a stream event is not JSON ({e}): {ev.data[:200]!r}") from e
            if self.parser.event(data, ev.event) and self.first_output_at is None:
                self.first_output_at = time.time()

    def close(self) -> Reply:
        """Parse what is left; problems go to `self.problem`, never raise."""
        if self.problem is None:
            try:
                if self._events is not None:
                    self._dispatch(self._events.flush())
                elif self.body.strip():
                    try:
                        data = orjson.loads(bytes(self.body))
                    except orjson.JSONDecodeError as e:
                        raise ReplyError(
                            f"the response body is not JSON ({e}): {bytes(self.body[:200])!r}"
                        ) from e
                    self.parser.body(data)
                    self.first_output_at = self.first_output_at or self.first_byte_at or time.time()
            except ReplyError as e:
                self.problem = str(e)
        try:
            return self.parser.result()
        except ReplyError as e:
            self.problem = self.problem or str(e)
            return self.parser.reply

    def text(self) -> str:
        """The body as recorded: decompressed, decoded as UTF-8 (invalid bytes replaced)."""
        return bytes(self.body if self.body or not self.raw else self.raw).decode("utf-8", "replace")
