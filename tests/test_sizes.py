"""Sizes on the command line: one convention for every size flag (polarproxy/sizes.py)."""

from __future__ import annotations

import pytest

from polarproxy.sizes import parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", 1 << 20), ("512K", 512 << 10), ("256M", 256 << 20), ("4G", 4 << 30), ("1T", 1 << 40),
     ("1.5G", 3 << 29), ("64MiB", 64 << 20), ("2gb", 2 << 30)],
)  # fmt: skip
def test_sizes_are_bytes_or_a_number_and_a_binary_unit(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1G", "1 G G", "12X", "lots"])
def test_a_bad_size_names_itself_and_the_accepted_forms(text):
    with pytest.raises(ValueError, match=r"Bad size .*512K, 256M, 4G"):
        parse_size(text)
