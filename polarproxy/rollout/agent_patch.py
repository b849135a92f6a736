"""The agent's changes as a unified diff, for people: stored with the reward (`show`, the viewer), never applied.

Grading applies the agent's files themselves (agent_changes.py); this is their record, in git's diff shape
(`diff --git a/P b/P`, `new file`, `deleted file`), made here in Python from the baseline and the safe copy
of the agent's workspace (never by running git there). Binary files, symlinks and files over
`MAX_DIFF_FILE_BYTES` are named, not shown (`Binary files a/P and b/P differ`), as is anything behind a
link, a FIFO or a device (nothing is read through a link; the agent's copy is its own, never the host's).
The text is bounded: past `max_chars`, or `DEADLINE_S`, the remaining files are counted in a last line;
a file too big to diff in time is named. Files left out of grading are not in it.
"""

from __future__ import annotations

import difflib
import os
import stat
import time
from pathlib import Path

from polarproxy.rollout.agent_changes import ChangeReport
from polarproxy.rollout.copying import no_follow, under_link

MAX_PATCH_CHARS = 200_000
MAX_DIFF_FILE_BYTES = 1 << 20
# difflib's matching is quadratic in the worst case (30,000 lines, every other one changed: 43 s here):
# past this many line pairs a file's change is named, not shown; and the whole diff stops after DEADLINE_S
MAX_LINE_PAIRS = 4_000_000
DEADLINE_S = 10.0


def _lines(data: bytes) -> list[str] | None:
    """The text's lines, each with its "\n" (only "\n" ends a line, as in git), or None for binary data."""
    if b"\0" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _text(root: Path, rel: str) -> list[str] | str | None:
    """`root/rel`'s lines, a short description when it is not shown as text (a str), or None (absent). Never
    read through a link (neither `rel` nor a folder on its way), never a FIFO or device, at most
    MAX_DIFF_FILE_BYTES."""
    if under_link(root, Path(rel)):
        return "behind a link" if os.path.lexists(root / rel) else None
    path = root / rel
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"symbolic link to {os.readlink(path)}"
    if not stat.S_ISREG(st.st_mode):
        return "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
    if st.st_size > MAX_DIFF_FILE_BYTES:
        return f"{st.st_size} bytes"
    with open(path, "rb", opener=no_follow) as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return "not a regular file"
        data = f.read(MAX_DIFF_FILE_BYTES + 1)
    lines = _lines(data[:MAX_DIFF_FILE_BYTES])
    return "binary" if lines is None else lines


def _file_diff(rel: str, baseline: Path, agent: Path) -> str:
    old, new = _text(baseline, rel), _text(agent, rel)
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
    if len(old or []) * len(new or []) > MAX_LINE_PAIRS:
        return (
            head
            + f"Text files {a} and {b} differ ({len(old or [])} and {len(new or [])} lines: not diffed)\n"
        )
    lines = difflib.unified_diff(old or [], new or [], fromfile=a, tofile=b)
    body = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
    return head + body


def agent_patch(
    baseline: Path, agent: Path, report: ChangeReport, *, max_chars: int = MAX_PATCH_CHARS
) -> str:
    """The changes `report` applied (changed and deleted files), as one diff of at most `max_chars`, made
    within DEADLINE_S."""
    paths = sorted([*report.changed, *report.deleted])
    parts: list[str] = []
    used = 0
    deadline = time.monotonic() + DEADLINE_S
    for i, rel in enumerate(paths):
        if time.monotonic() > deadline:
            parts.append(
                f"[patch cut after {DEADLINE_S:g} s: {len(paths) - i} of {len(paths)} files not shown]\n"
            )
            break
        diff = _file_diff(rel, baseline, agent)
        if used + len(diff) > max_chars:
            parts.append(
                f"[patch cut at {max_chars} characters: {len(paths) - i} of {len(paths)} files not shown]\n"
            )
            break
        parts.append(diff)
        used += len(diff)
    return "".join(parts)
