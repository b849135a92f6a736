"""The agent's changes as a unified diff, for people: stored with the reward (`show`, the viewer), never applied.

Grading applies the agent's files themselves (agent_changes.py); this is their record, in git's diff shape
(`diff --git a/P b/P`, `new file`, `deleted file`), made here in Python from the baseline and the safe copy
of the agent's workspace (never by running git there). Binary files, symlinks and files over
`MAX_DIFF_FILE_BYTES` are named, not shown (`Binary files a/P and b/P differ`). The text is bounded: past
`max_chars` the remaining files are counted in a last line. Files left out of grading are not in it.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from polarproxy.rollout.agent_changes import ChangeReport

MAX_PATCH_CHARS = 200_000
MAX_DIFF_FILE_BYTES = 1 << 20


def _text(path: Path) -> list[str] | str | None:
    """The file's lines (a list), a short description when it is not shown as text (a str), or None (absent)."""
    if not path.is_symlink() and not path.exists():
        return None
    if path.is_symlink():
        return f"symbolic link to {os.readlink(path)}"
    size = path.stat().st_size
    if size > MAX_DIFF_FILE_BYTES:
        return f"{size} bytes"
    data = path.read_bytes()
    if b"\0" in data:
        return "binary"
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return "binary"


def _file_diff(rel: str, baseline: Path, agent: Path) -> str:
    old, new = _text(baseline / rel), _text(agent / rel)
    head = f"diff --git a/{rel} b/{rel}\n"
    if old is None:
        head += "new file\n"
    elif new is None:
        head += "deleted file\n"
    a = f"a/{rel}" if old is not None else "/dev/null"
    b = f"b/{rel}" if new is not None else "/dev/null"
    if isinstance(old, str) or isinstance(new, str):
        why = "; ".join(f"{side}: {what}" for side, what in (("a", old), ("b", new)) if isinstance(what, str))
        return head + f"Binary files {a} and {b} differ ({why})\n"
    lines = difflib.unified_diff(
        old or [],
        new or [],
        fromfile=a,
        tofile=b,
    )
    body = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
    return head + body


def agent_patch(
    baseline: Path, agent: Path, report: ChangeReport, *, max_chars: int = MAX_PATCH_CHARS
) -> str:
    """The changes `report` applied (changed and deleted files), as one diff of at most `max_chars`."""
    paths = sorted([*report.changed, *report.deleted])
    parts: list[str] = []
    used = 0
    for i, rel in enumerate(paths):
        diff = _file_diff(rel, baseline, agent)
        if used + len(diff) > max_chars:
            parts.append(
                f"[patch cut at {max_chars} characters: {len(paths) - i} of {len(paths)} files not shown]\n"
            )
            break
        parts.append(diff)
        used += len(diff)
    return "".join(parts)
