"""Text values as the database can hold them.

PostgreSQL's text columns refuse NUL (0x00), and a write holding one fails whole. A harness can still send
one (a malformed body, a model name with `\\u0000`), and a verifier's output can hold one; such a call or
reward must be recorded, not lost. So on PostgreSQL each NUL of a stored text value is written as U+FFFD.
SQLite keeps text exactly. JSON columns need nothing: orjson escapes NUL.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


def storable(value: Any, dialect: str) -> Any:
    """`value` as `dialect`'s text columns hold it (anything but a str with a NUL on PostgreSQL: as it is)."""
    if dialect == "postgresql" and isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", REPLACEMENT)
    return value
