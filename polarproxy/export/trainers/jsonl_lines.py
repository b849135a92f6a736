"""Writing a trainer format's JSONL file: one object per line, numpy arrays written by orjson as they are,
logprobs widened to float64 (the values a JSON reader gets are those of `--format jsonl`'s rows).

A line of many lists cut from one array (NeMo RL's per-turn prompts, each a prefix of the next, its
completions and their logprobs) is written without formatting or copying a repeat: the array's text is made
once (`ArrayJson`), each list is a slice of it, and the line goes to the file as its parts (`Spliced`),
orjson's text around buffers of that one text. The bytes are those orjson writes for the lists themselves."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

from polarproxy.export.atomic import atomic_file

OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
Buffer = bytes | memoryview


def floats(values: np.ndarray) -> np.ndarray:
    """float32 logprobs as float64: JSON text that reads back as the recorded float32 value, widened."""
    return values.astype(np.float64)


class ArrayJson:
    """A 1-D numeric array's JSON text, formatted once by orjson, and the text of slices of it cut from
    that (a number's text does not depend on its neighbours, and holds no comma)."""

    __slots__ = ("_bounds", "_n", "_text")

    def __init__(self, values: np.ndarray) -> None:
        if values.ndim != 1 or values.dtype.kind not in "iuf":
            raise TypeError(f"ArrayJson takes a 1-D numeric array, not a {values.ndim}-D {values.dtype} one.")
        self._n = len(values)
        text = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)
        self._text = memoryview(text)
        commas = np.flatnonzero(np.frombuffer(text, np.uint8) == ord(","))
        if self._n and len(commas) != self._n - 1:
            raise ValueError(f"orjson wrote {len(commas)} commas for {self._n} values.")
        # _bounds[k]: where the separator before element k is ('[' or ','); _bounds[n]: the closing ']'
        self._bounds = np.concatenate(([0], commas, [len(text) - 1]))

    def __len__(self) -> int:
        return self._n

    def items(self, starts: np.ndarray, stops: np.ndarray) -> list[memoryview]:
        """The text of `values[a:b]` for each a, b of `starts`, `stops`, without its brackets."""
        bad = (starts < 0) | (starts > stops) | (stops > self._n)
        if bad.any():
            i = int(np.argmax(bad))
            raise IndexError(f"Slice [{starts[i]}:{stops[i]}] is outside an array of {self._n} values.")
        cuts = zip((self._bounds[starts] + 1).tolist(), self._bounds[stops].tolist(), strict=True)
        return [self._text[a:b] for a, b in cuts]


class Spliced:
    """One line whose big arrays are written from buffers that hold their items' text: `arrays(items)` is
    the placeholder to put in the object where a list of arrays goes (one array per buffer of items),
    `parts(obj)` the line as buffers: orjson's text of `obj` with the arrays in their places. orjson
    escapes a NUL inside a string, so a raw one in its output is a placeholder's."""

    __slots__ = ("_holes",)

    def __init__(self) -> None:
        self._holes: list[list[Buffer]] = []

    def arrays(self, items: list[memoryview]) -> orjson.Fragment:
        if not items:
            return orjson.Fragment(b"[]")
        parts: list[Buffer] = [b"[["]
        for item in items:
            parts += (item, b"],[")
        parts[-1] = b"]]"
        self._holes.append(parts)
        return orjson.Fragment(b"\0%d\0" % (len(self._holes) - 1))

    def parts(self, obj: dict[str, Any]) -> list[Buffer]:
        cut = orjson.dumps(obj, option=OPTIONS).split(b"\0")
        if len(cut) != 2 * len(self._holes) + 1:
            raise ValueError(f"{len(self._holes)} lists placed, {len(cut) // 2} found in the line.")
        parts: list[Buffer] = [cut[0]]
        for i in range(1, len(cut), 2):
            parts += self._holes[int(cut[i])]
            parts.append(cut[i + 1])
        return parts


def write_lines(objects: Iterable[dict[str, Any] | list[Buffer]], out: str | os.PathLike[str]) -> None:
    """Each object as one line of `out` (or a line as its parts: Spliced.parts), written atomically (the
    old file stays until all are written)."""
    with atomic_file(out) as f:
        for obj in objects:
            if isinstance(obj, list):  # one write: the kernel's cost is per write more than per byte
                f.write(b"".join(obj))
            else:
                f.write(orjson.dumps(obj, option=OPTIONS))
