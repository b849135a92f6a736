"""Time-ordered IDs: `ep_` + 12 chars for episodes, `call_` + 16 chars for calls.

The first 9 characters encode the creation time in milliseconds (45 bits, good until the year 3084), the rest
are random. The alphabet is Crockford's base32 in lowercase, whose characters sort in ASCII order, so IDs
sort by creation time. Within one process IDs are strictly increasing even inside one millisecond: the
random part of the previous ID is incremented instead of drawn again (as ULIDs do).
"""

from __future__ import annotations

import re
import secrets
import threading
import time

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
_TIME_CHARS = 9
_TIME_BITS = 5 * _TIME_CHARS

EPISODE_PREFIX = "ep_"
CALL_PREFIX = "call_"
EPISODE_ID_CHARS = 12
CALL_ID_CHARS = 16

# The rule every episode ID a harness or a user may name follows (a header, an /e/ID/ path, a control
# route): 1-128 characters of A-Z a-z 0-9 _ . : -. IDs made here (`ep_` + base32) follow it too.
EPISODE_ID = r"[A-Za-z0-9_.:-]{1,128}"
EPISODE_ID_RULE = re.compile(f"^{EPISODE_ID}$")


def invalid_episode_header(named: str) -> str | None:
    """Why an `x-polarproxy-episode` header's value is refused (None: it follows the rule). Checked in every
    mode: an ID is stored, listed and printed, so a harness must not choose one with markup or escapes."""
    if EPISODE_ID_RULE.match(named):
        return None
    shown = named if len(named) <= 40 else named[:40] + "..."
    return (
        f"Invalid episode ID {shown!r} in the x-polarproxy-episode header: use 1-128 characters of "
        "A-Z a-z 0-9 _ . : -."
    )


def _encode(value: int, width: int) -> str:
    chars = []
    for _ in range(width):
        chars.append(ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


class _Generator:
    def __init__(self, prefix: str, chars: int):
        self.prefix = prefix
        self.random_bits = 5 * (chars - _TIME_CHARS)
        self.chars = chars
        self._lock = threading.Lock()
        self._last = -1  # (ms << random_bits) | random of the previous ID

    def __call__(self, now_ms: int | None = None) -> str:
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        if not 0 <= ms < 1 << _TIME_BITS:
            raise ValueError(f"Time {ms} ms is outside what an ID can encode (0 to 2**{_TIME_BITS} - 1).")
        value = (ms << self.random_bits) | secrets.randbits(self.random_bits)
        with self._lock:
            if value <= self._last:
                value = self._last + 1  # same millisecond (or a clock step back): keep IDs increasing
            self._last = value
        return self.prefix + _encode(value, self.chars)


new_episode_id = _Generator(EPISODE_PREFIX, EPISODE_ID_CHARS)
new_call_id = _Generator(CALL_PREFIX, CALL_ID_CHARS)
