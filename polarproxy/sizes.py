"""The one parser of sizes given on the command line (`--max-workspace-bytes 1G`, and every size flag after
it): a whole number of bytes, or a number and a binary unit: `512K`, `256M`, `4G`, `1T` (`KiB`, `MiB`,
`GiB`, `TiB` and a trailing `B` are read the same: 1K = 1024 bytes)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes in `text`; ValueError naming the value and the accepted forms."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(
            f"Bad size {text!r}: give bytes (1048576) or a number and a unit: 512K, 256M, 4G, 1T "
            "(binary units: 1K = 1024 bytes)."
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])
