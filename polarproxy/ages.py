"""The one parser of ages and times given on the command line (`--before`, `--since`, `--stale-after`).

An age is a number and a unit: `90s`, `10min`, `12h`, `30d`, `2w` (whitespace between them is allowed).
A bare `m` is refused, since it reads as minutes or months. A time is an ISO date (`2026-01-31`), an ISO
date-time (`2026-01-31T12:00`, local time unless it ends in `Z` or `+HH:MM`), or an age, meaning that long
ago.
"""

from __future__ import annotations

import datetime
import re
import time

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$")
UNITS: dict[str, float] = {
    "s": 1,
    "sec": 1,
    "min": 60,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
}
_EXAMPLES = "90s, 10min, 12h, 30d, 2w"


def parse_age(text: str) -> float:
    """`90s`, `10min`, `12h`, `30d`, `2w` -> seconds."""
    m = _AGE.match(text)
    if not m:
        raise ValueError(f"Bad age {text!r}. Give a number and a unit: s, min, h, d or w (e.g. {_EXAMPLES}).")
    unit = m.group(2).lower()
    if unit == "m":
        raise ValueError(
            f"Ambiguous age {text!r}: 'm' could mean minutes or months. "
            f"Write {m.group(1)}min for minutes, or a number of days (d) or weeks (w)."
        )
    if unit not in UNITS:
        raise ValueError(
            f"Unknown unit {m.group(2)!r} in {text!r}. Use s, min, h, d or w (e.g. {_EXAMPLES})."
        )
    return float(m.group(1)) * UNITS[unit]


def parse_time(text: str, *, now: float | None = None) -> float:
    """An ISO date or date-time (local time unless it names a zone), or an age: a Unix time."""
    current = time.time() if now is None else now
    if _AGE.match(text):
        return current - parse_age(text)
    raw = text.strip()
    try:
        when = datetime.datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith("Z") else raw)
    except ValueError:
        raise ValueError(
            f"Bad time {text!r}. Give an ISO date (2026-01-31), a date-time (2026-01-31T12:00, local time "
            f"unless it ends in Z or +HH:MM) or an age ({_EXAMPLES})."
        ) from None
    return when.timestamp()
