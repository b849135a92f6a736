import math
import struct
from array import array

import pytest

from polarproxy.store.arrays import int32_array, pack_ids, pack_logprobs, unpack_ids, unpack_logprobs

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def test_ids_round_trip_including_int32_extremes():
    ids = [0, 1, 151645, INT32_MAX, INT32_MIN, -1, 2**24 + 1]
    assert unpack_ids(pack_ids(ids)) == ids


def test_ids_pack_as_little_endian_int32():
    ids = [1, 258, INT32_MIN, INT32_MAX]
    assert pack_ids(ids) == struct.pack("<4i", *ids)


def test_an_int32_array_packs_to_the_bytes_of_its_list():
    ids = [1, 258, INT32_MIN, INT32_MAX, 151645]
    arr = array("i", ids)
    assert pack_ids(arr) == pack_ids(ids) == struct.pack("<5i", *ids)
    assert pack_ids(arr, byteorder="big") == struct.pack(">5i", *ids)
    assert int32_array(arr) is arr and int32_array(ids) == arr


def test_big_endian_host_byteswaps_on_pack_and_unpack():
    # On a big-endian host native order is big-endian; the packer swaps it to little-endian. Here (a
    # little-endian host) claiming "big" makes the swap visible: the bytes come out big-endian.
    ids = [1, 258, INT32_MIN]
    swapped = pack_ids(ids, byteorder="big")
    assert swapped == struct.pack(">3i", *ids)
    assert unpack_ids(swapped, byteorder="big") == ids
    lps = [-0.5, -2.0]
    assert pack_logprobs(lps, byteorder="big") == struct.pack(">2f", *lps)
    assert unpack_logprobs(pack_logprobs(lps, byteorder="big"), byteorder="big") == lps


@pytest.mark.parametrize("bad", [INT32_MAX + 1, INT32_MIN - 1, 2**40])
def test_id_outside_int32_raises_naming_the_value(bad):
    with pytest.raises(ValueError, match=rf"index 2 is {bad}, outside the int32 range"):
        pack_ids([1, 2, bad])


def test_non_integer_id_raises():
    with pytest.raises(ValueError, match=r"index 1 is 2\.5 \(float\)"):
        pack_ids([1, 2.5])


def test_logprobs_are_rounded_to_float32_then_stable():
    values = [0.0, -0.1, -1e-45, -1e-46, -3.4e38, -math.inf, -12.75]
    out = unpack_logprobs(pack_logprobs(values))
    assert out == [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]
    assert out[1] == pytest.approx(-0.1, rel=1e-7) and out[1] != -0.1
    assert out[2] == -1.401298464324817e-45  # the smallest float32 denormal
    assert out[3] == 0.0 and math.copysign(1, out[3]) == -1  # underflows to -0.0
    assert out[5] == -math.inf  # -inf is kept
    assert unpack_logprobs(pack_logprobs(out)) == out  # exact from then on


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1e39, 1e300])
def test_nan_positive_inf_and_float32_overflow_logprobs_raise(bad):
    with pytest.raises(ValueError, match=r"Logprob at index 1 is"):
        pack_logprobs([-0.5, bad])


def test_empty_and_missing_arrays():
    assert pack_ids([]) == b"" and pack_logprobs([]) == b""
    assert unpack_ids(b"") == [] and unpack_ids(None) == []
    assert unpack_logprobs(None) == []


def test_truncated_blob_raises():
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        unpack_ids(b"\x01\x00\x00")
