"""A request body read within a bound: at most `max_bytes` after decompression, decompression stopped at the
bound (a 200 KB gzip bomb of 200 MB never inflates), and tool schemas no deeper than the store can write.
What breaks a bound is answered in the dialect's shape before anything is parsed: 413 (too large), 415 (an
encoding other than gzip or deflate), 400 (a body that does not decompress, a schema nested too deep)."""

from __future__ import annotations

import zlib
from typing import Any

MAX_BODY_BYTES = 32 << 20  # `--max-body-bytes` default: a 256k-token prompt is ~1 MB; a body is rarely more
MAX_SCHEMA_DEPTH = 64  # JSON-schema nesting of a tool's parameters (the store's JSON writer stops at 254)
_DECODERS = {"gzip": 47, "x-gzip": 47, "deflate": 15 + 32}  # zlib's wbits: +32 reads a gzip or zlib header


class BodyError(Exception):
    """A body refused before parsing: the status and code of its dialect's error shape."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def too_large(size: int | str, max_bytes: int) -> BodyError:
    return BodyError(
        413,
        f"The request body is {size} bytes, over this proxy's limit of {max_bytes} (--max-body-bytes).",
        "request_too_large",
    )


def read_body(raw: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """`raw` decoded as its Content-Encoding says, within `max_bytes`; BodyError otherwise."""
    if len(raw) > max_bytes:
        raise too_large(len(raw), max_bytes)
    name = (encoding or "").strip().lower()
    if name in ("", "identity"):
        return raw
    wbits = _DECODERS.get(name)
    if wbits is None:
        raise BodyError(
            415,
            f"Content-Encoding {encoding!r} is not supported: send gzip, deflate or none.",
            "bad_encoding",
        )
    inflater = zlib.decompressobj(wbits=wbits)
    try:
        body = inflater.decompress(raw, max_bytes + 1)
    except zlib.error as e:
        raise BodyError(400, f"The {name} request body does not decompress: {e}.", "bad_encoding") from None
    if len(body) > max_bytes or inflater.unconsumed_tail:
        raise too_large(f"more than {max_bytes} once decompressed", max_bytes)
    if not inflater.eof:
        raise BodyError(400, f"The {name} request body is cut short.", "bad_encoding")
    return body


def check_depth(value: Any, limit: int = MAX_SCHEMA_DEPTH, what: str = "A tool's parameters") -> None:
    """BodyError (400) when `value` nests dicts and lists deeper than `limit`; iterative, so a hostile
    schema cannot exhaust the stack."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise BodyError(400, f"{what} nest deeper than {limit} levels.", "invalid_request_error")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
