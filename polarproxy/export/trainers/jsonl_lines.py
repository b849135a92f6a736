"""Writing a trainer format's JSONL file: one object per line, numpy arrays written by orjson as they are,
logprobs widened to float64 (the values a JSON reader gets are those of `--format jsonl`'s rows)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

from polarproxy.export.atomic import atomic_file

OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def floats(values: np.ndarray) -> np.ndarray:
    """float32 logprobs as float64: JSON text that reads back as the recorded float32 value, widened."""
    return values.astype(np.float64)


def write_lines(objects: Iterable[dict[str, Any]], out: str | os.PathLike[str]) -> None:
    """Each object as one line of `out`, written atomically (the old file stays until all are written)."""
    with atomic_file(out) as f:
        for obj in objects:
            f.write(orjson.dumps(obj, option=OPTIONS))
