"""Compact token arrays: IDs as little-endian int32, logprobs as little-endian float32.

Packing is lossless for IDs in the int32 range (-2**31 to 2**31 - 1); anything else raises ValueError.
Logprobs are rounded to the nearest float32 (e.g. -0.1 reads back as -0.10000000149011612, -1e-45 as
-1.401298464324817e-45, -1e-46 as -0.0): the stored value is what every reader sees, so round trips
through the store are exact from then on. -inf is kept (a backend may report it); NaN, +inf and finite
values too large for float32 (which would silently become infinite) raise ValueError.
Empty arrays pack to b"" and None unpacks to [].
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from typing import TypeGuard

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1

if array("i").itemsize != 4 or array("f").itemsize != 4:  # pragma: no cover - no such CPython platform today
    raise ImportError("polarproxy needs a platform where C int and float are 4 bytes.")


def _to_little_endian(arr: array, byteorder: str = sys.byteorder) -> bytes:
    if byteorder == "big":
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def _from_little_endian(
    typecode: str, data: bytes | bytearray | memoryview | None, what: str, byteorder: str = sys.byteorder
) -> array:
    arr = array(typecode)
    if not data:
        return arr
    if len(data) % 4:
        raise ValueError(f"Packed {what} must be a multiple of 4 bytes long, got {len(data)} bytes.")
    arr.frombytes(data)
    if byteorder == "big":
        arr.byteswap()
    return arr


def _is_int32_array(ids: Sequence[int]) -> TypeGuard[array]:
    return isinstance(ids, array) and ids.typecode == "i"


def int32_array(ids: Sequence[int]) -> array:
    """`ids` as an int32 `array('i')`: the array itself when it is one already (no copy), else a new one."""
    return ids if _is_int32_array(ids) else array("i", ids)


def pack_ids(ids: Sequence[int], *, byteorder: str = sys.byteorder) -> bytes:
    """Token IDs as little-endian int32 bytes. `byteorder` is the host's; it is a parameter only for tests.
    An int32 `array('i')` (the proxy's prompts, render/prefix.py) is packed at memory-copy speed."""
    if _is_int32_array(ids):
        return _to_little_endian(ids, byteorder)
    try:
        arr = array("i", ids)
    except (OverflowError, TypeError):
        for i, value in enumerate(ids):
            if not isinstance(value, int):
                raise ValueError(
                    f"Token ID at index {i} is {value!r} ({type(value).__name__}); token IDs must be integers."
                ) from None
            if not _INT32_MIN <= value <= _INT32_MAX:
                raise ValueError(
                    f"Token ID at index {i} is {value}, outside the int32 range {_INT32_MIN}..{_INT32_MAX}."
                ) from None
        raise
    return _to_little_endian(arr, byteorder)


def unpack_ids_array(data: bytes | bytearray | memoryview | None, *, byteorder: str = sys.byteorder) -> array:
    """Packed IDs as an `array('i')` (4 bytes per ID in memory)."""
    return _from_little_endian("i", data, "token IDs", byteorder)


def unpack_ids(data: bytes | bytearray | memoryview | None, *, byteorder: str = sys.byteorder) -> list[int]:
    return unpack_ids_array(data, byteorder=byteorder).tolist()


def pack_logprobs(values: Sequence[float], *, byteorder: str = sys.byteorder) -> bytes:
    """Logprobs as little-endian float32 bytes, rounded to the nearest float32."""
    try:
        arr = array("f", values)
    except TypeError:
        for i, value in enumerate(values):
            if not isinstance(value, (int, float)):
                raise ValueError(
                    f"Logprob at index {i} is {value!r} ({type(value).__name__}); logprobs must be numbers."
                ) from None
        raise
    if any(map(math.isnan, arr)) or any(map(math.isinf, arr)):
        for i, (value, stored) in enumerate(zip(values, arr, strict=True)):
            if math.isnan(stored) or stored == math.inf:
                raise ValueError(
                    f"Logprob at index {i} is {value!r}; logprobs must be finite or -inf, not NaN or +inf."
                )
            if math.isinf(stored) and not math.isinf(value):
                raise ValueError(
                    f"Logprob at index {i} is {value!r}, too large in magnitude for float32 (max 3.4e38)."
                )
    return _to_little_endian(arr, byteorder)


def unpack_logprobs(
    data: bytes | bytearray | memoryview | None, *, byteorder: str = sys.byteorder
) -> list[float]:
    return _from_little_endian("f", data, "logprobs", byteorder).tolist()
