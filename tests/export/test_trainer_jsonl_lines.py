"""The JSONL line pieces of the trainer formats (export/trainers/jsonl_lines.py): a slice cut from an
array's text is the text orjson writes for the slice itself, and a spliced line is the line orjson writes
for the object with those lists in it."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from polarproxy.export.trainers.jsonl_lines import OPTIONS, ArrayJson, Spliced

NUMPY = orjson.OPT_SERIALIZE_NUMPY
SLICES = [(0, 0), (0, 1), (0, 5), (2, 2), (2, 6), (5, 7), (0, 7), (7, 7)]


@pytest.mark.parametrize(
    "values",
    [
        np.array([0, 7, 150_000, -3, 2**31 - 1, -(2**31), 42], dtype=np.int32),
        np.array([0, 1, 2**63 - 1, -(2**63), 10, 99, 100], dtype=np.int64),
        np.array([-0.25, -1e-05, float("nan"), -0.0, -123.456, 3.4e38, -7.0], dtype=np.float64),
        np.array([-0.7064362, -1e-30, 0.0, -2.5, -1.0, -0.1, -9.75], dtype=np.float32).astype(np.float64),
    ],
)
def test_a_slice_cut_from_an_arrays_text_is_the_slices_own_text(values: np.ndarray) -> None:
    text = ArrayJson(values)
    starts = np.array([a for a, _ in SLICES])
    stops = np.array([b for _, b in SLICES])
    for (a, b), items in zip(SLICES, text.items(starts, stops), strict=True):
        assert b"[" + bytes(items) + b"]" == orjson.dumps(values[a:b], option=NUMPY), (a, b)


def test_an_empty_array_has_only_empty_slices() -> None:
    text = ArrayJson(np.zeros(0, np.int32))
    assert len(text) == 0 and [bytes(x) for x in text.items(np.array([0]), np.array([0]))] == [b""]


def test_a_slice_outside_the_array_or_a_non_numeric_array_is_refused_naming_it() -> None:
    text = ArrayJson(np.arange(4, dtype=np.int32))
    with pytest.raises(IndexError, match=r"\[3:5\] is outside an array of 4"):
        text.items(np.array([0, 3]), np.array([2, 5]))
    with pytest.raises(IndexError, match=r"\[3:2\]"):
        text.items(np.array([3]), np.array([2]))
    with pytest.raises(TypeError, match="2-D int32"):
        ArrayJson(np.zeros((2, 2), np.int32))
    with pytest.raises(TypeError, match="bool"):
        ArrayJson(np.zeros(2, np.bool_))


def test_a_spliced_line_is_the_line_orjson_writes_for_the_lists_themselves() -> None:
    ids = np.array([5, 17, 300, 4, 9, 1000, 2], dtype=np.int32)
    text = ArrayJson(ids)
    cuts = [(0, 2), (0, 5), (5, 5)]
    starts, stops = np.array([a for a, _ in cuts]), np.array([b for _, b in cuts])
    line = Spliced()
    spliced = {
        "a": "a NUL \0 in a string is escaped",
        "lists": line.arrays(text.items(starts, stops)),
        "none": line.arrays([]),
        "nested": [{"again": line.arrays(text.items(stops[:1], stops[1:2]))}, 1.5, None],
    }
    plain = {
        "a": "a NUL \0 in a string is escaped",
        "lists": [ids[a:b] for a, b in cuts],
        "none": [],
        "nested": [{"again": [ids[2:5]]}, 1.5, None],
    }
    assert b"".join(line.parts(spliced)) == orjson.dumps(plain, option=OPTIONS)
