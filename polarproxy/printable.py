"""Recorded text made safe to print on a terminal.

What polarproxy records was written by agents and models (commands, messages, tool arguments, sampled
tokens, file names in a diff) and RL rewards an agent for anything that works, including escape sequences
that retitle a window, clear a screen or drive the terminal of whoever reads `show`. Every command that
prints recorded text passes it through here: control characters are shown as \\xNN, in JSON as \\uNNNN.
"""

from __future__ import annotations

import re

# C0 and C1 control characters (ESC, and 0x9b: CSI on terminals that take 8-bit controls) but the tab, and
# the Unicode line and paragraph separators (a line break to readers that split on them)
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)] if c != 0x09}
_CONTROL |= {c: f"\\u{c:04x}" for c in (0x2028, 0x2029)}
_CONTROL_LINES = {c: shown for c, shown in _CONTROL.items() if c != 0x0A}
# what a JSON encoder may leave raw in a string (orjson escapes C0, not DEL nor C1)
_JSON_RAW = re.compile("[\x7f-\x9f]")


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with its control characters shown as \\xNN, so that nothing recorded can move the cursor,
    retitle the window or clear the screen of whoever reads it. `lines`: newlines kept (multi-line text)."""
    return text.translate(_CONTROL_LINES if lines else _CONTROL)


def json_printable(encoded: str) -> str:
    """Encoded JSON with DEL and C1 characters as \\u escapes: the same JSON, safe on a terminal (they can
    only occur inside strings)."""
    return (
        _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", encoded) if _JSON_RAW.search(encoded) else encoded
    )
