"""Request bodies stored as edits of the base call's: linear storage for text that harnesses resend whole.

An agent harness sends the whole history with every call, so the request body (and the parsed
conversation) of call n is call n-1's plus the new messages, usually inserted before a tail that stays
the same (`..."messages": [..., NEW], "tools": [...]}`). A body is stored as: the length of the prefix it
shares with the base call's body, the length of the suffix it shares after that, and the text in between;
the pieces of one call are zlib-compressed together. Decoding gives back the exact text (checked by
`encode`, which falls back to the whole text when an edit would not be smaller).
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson

_LEVEL = 6


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a.startswith(b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    """The longest common suffix of a and b, at most `limit` characters."""
    n = min(len(a), len(b), limit)
    if n == 0 or a.endswith(b[len(b) - n :]):
        return n
    lo, hi = 0, n  # the last lo characters are equal; the last hi are not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.endswith(b[len(b) - mid :]):
            lo = mid
        else:
            hi = mid
    return lo


def edit(base: str | None, new: str | None) -> list[Any]:
    """`new` as `[prefix_len, suffix_len, middle]` against `base`, or `[new]` when that is not smaller."""
    if base is None or new is None:
        return [new]
    p = _common_prefix(base, new)
    s = _common_suffix(base, new, min(len(base), len(new)) - p)
    middle = new[p : len(new) - s]
    return [p, s, middle] if len(middle) + 24 < len(new) else [new]


def apply(base: str | None, piece: list[Any]) -> str | None:
    if len(piece) == 1:
        return piece[0]
    if base is None:
        raise ValueError("a stored text edit has no base text")
    p, s, middle = piece
    return base[:p] + middle + base[len(base) - s :]


def encode(bases: tuple[str | None, ...], texts: tuple[str | None, ...]) -> bytes:
    """The texts as compressed edits of the bases (one zlib stream for all)."""
    pieces = [edit(b, t) for b, t in zip(bases, texts, strict=True)]
    data = _compress(orjson.dumps(pieces))
    if tuple(apply(b, p) for b, p in zip(bases, pieces, strict=True)) != texts:  # never store a wrong edit
        raise AssertionError("text edit does not reproduce the text")
    return data


def _compress(raw: bytes) -> bytes:
    """zlib with a window no larger than the input (the same output size as the default 32 KB window, which
    a short edit cannot use, at about half the time: most of it is setting up the window). `decode`'s
    default window reads any smaller one."""
    wbits = min(15, max(10, (len(raw) - 1).bit_length()))
    c = zlib.compressobj(_LEVEL, zlib.DEFLATED, wbits)
    return c.compress(raw) + c.flush()


def decode(bases: tuple[str | None, ...], data: bytes) -> tuple[str | None, ...]:
    pieces = orjson.loads(zlib.decompress(data))
    if len(pieces) != len(bases):
        raise ValueError(f"a stored text edit has {len(pieces)} pieces, expected {len(bases)}")
    return tuple(apply(b, p) for b, p in zip(bases, pieces, strict=True))
