"""Grading from the agent's changes (`"grade_from": "patch"`): the files the agent added, changed or
deleted, against the task's workspace as it was given (the baseline, on the host, never in a sandbox),
applied to a clean copy of that baseline, so the grader never runs in the folder the agent edited.

The agent's workspace is first copied safely (copying.py: no FIFO, device or link out of it is read). The
comparison is done here in Python, file by file and byte for byte (binary files, deletions and renames
included), never by running git in a folder the agent controlled (a `.git/config` of its making could run
commands). Left out, and counted by reason:

- `cache`: caches and byte code (`__pycache__`, `.pytest_cache`, `.mypy_cache`, `.ruff_cache`, `*.pyc`)
  and `.git`;
- `harness`: the harnesses' own folders and files in the workspace (`.codex`, `.claude`, `.qwen`,
  `.gemini`, `.opencode`, `.pi`, `.aider*`);
- `steers-tests`: files that steer a test run rather than fix the code: `conftest.py`, `pytest.ini`,
  `tox.ini`, `sitecustomize.py`, `usercustomize.py`, `*.pth`, and a `setup.cfg` or `pyproject.toml` whose
  pytest section changed (`[tool:pytest]`, `[tool.pytest.ini_options]`).
"""

from __future__ import annotations

import configparser
import filecmp
import os
import shutil
import stat
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from polarproxy.rollout.copying import under_link

CACHE_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
HARNESS_DIRS = {".codex", ".claude", ".qwen", ".gemini", ".opencode", ".pi"}
STEERING_FILES = {"conftest.py", "pytest.ini", "tox.ini", "sitecustomize.py", "usercustomize.py"}


@dataclass
class ChangeReport:
    changed: list[str] = field(default_factory=list)  # added or modified, relative paths
    deleted: list[str] = field(default_factory=list)
    left_out: Counter[str] = field(default_factory=Counter)  # reason -> files
    left_out_paths: list[str] = field(default_factory=list)

    def leave_out(self, rel: str, reason: str) -> None:
        self.left_out[reason] += 1
        self.left_out_paths.append(rel)

    def note(self) -> str:
        """One line for the reward's note."""
        text = f"graded from the agent's changes: {len(self.changed)} file(s) changed, {len(self.deleted)} deleted"
        if self.left_out:
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.left_out.items()))
            shown = ", ".join(self.left_out_paths[:5])
            text += f"; left out {reasons} ({shown}{', ...' if len(self.left_out_paths) > 5 else ''})"
        return text


def _ignored(rel: Path) -> str | None:
    """Why a path is never part of the agent's changes (cache, harness), or None."""
    parts = rel.parts
    if any(p in CACHE_DIRS for p in parts) or rel.suffix == ".pyc":
        return "cache"
    if any(p in HARNESS_DIRS for p in parts) or any(p.startswith(".aider") for p in parts):
        return "harness"
    return None


def _pytest_section(path: Path) -> object:
    """The pytest configuration a setup.cfg or pyproject.toml holds (None: none; a marker when unreadable)."""
    try:
        if path.name == "pyproject.toml":
            return tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {}).get("pytest")
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(path.read_text(encoding="utf-8"))
        return {s: dict(parser[s]) for s in ("tool:pytest", "pytest") if parser.has_section(s)} or None
    except (OSError, ValueError, UnicodeDecodeError, configparser.Error, tomllib.TOMLDecodeError):
        return "<unreadable>"


def _steers(rel: Path, baseline: Path, agent: Path) -> bool:
    if rel.name in STEERING_FILES or rel.suffix == ".pth":
        return True
    if rel.name in ("setup.cfg", "pyproject.toml"):
        before = baseline / rel
        old = _pytest_section(before) if before.is_file() and not before.is_symlink() else None
        return _pytest_section(agent / rel) != old
    return False


def _files(root: Path) -> dict[Path, os.stat_result]:
    """Regular files and symlinks under `root` (relative path -> lstat), not following links."""
    found: dict[Path, os.stat_result] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for name in [*filenames, *(d for d in dirnames if (here / d).is_symlink())]:
            st = os.lstat(here / name)
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                found[(here / name).relative_to(root)] = st
    return found


def _same(a: Path, sa: os.stat_result, b: Path, sb: os.stat_result) -> bool:
    if stat.S_ISLNK(sa.st_mode) or stat.S_ISLNK(sb.st_mode):
        return stat.S_ISLNK(sa.st_mode) and stat.S_ISLNK(sb.st_mode) and os.readlink(a) == os.readlink(b)
    if stat.S_IMODE(sa.st_mode) & 0o111 != stat.S_IMODE(sb.st_mode) & 0o111:
        return False
    return filecmp.cmp(a, b, shallow=False)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def apply_agent_changes(baseline: Path, agent: Path, into: Path) -> ChangeReport:
    """Apply to `into` (a copy of `baseline`) the changes `agent` (a safe copy of the agent's workspace)
    holds against `baseline`, as the module docstring says; return what was applied and left out."""
    report = ChangeReport()
    before, after = _files(baseline), _files(agent)
    for rel in sorted(after):
        reason = _ignored(rel)
        if reason is None and rel in before and _same(baseline / rel, before[rel], agent / rel, after[rel]):
            continue
        if reason is None and _steers(rel, baseline, agent):
            reason = "steers-tests"
        if reason is not None:
            if rel not in before or not _same(baseline / rel, before[rel], agent / rel, after[rel]):
                report.leave_out(str(rel), reason)
            continue
        target = into / rel
        for parent in reversed(rel.parents[:-1]):  # a file the agent put where a folder was, or the reverse
            folder = into / parent
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                folder.unlink()
            folder.mkdir(exist_ok=True)
        _remove(target)
        if stat.S_ISLNK(after[rel].st_mode):
            os.symlink(os.readlink(agent / rel), target)
        else:
            shutil.copy2(agent / rel, target, follow_symlinks=False)
        report.changed.append(str(rel))
    for rel in sorted(set(before) - set(after)):
        steering = rel.name in STEERING_FILES or rel.suffix == ".pth"
        if rel.name in ("setup.cfg", "pyproject.toml"):  # deleting it drops its pytest section too
            steering = _pytest_section(baseline / rel) is not None
        reason = _ignored(rel) or ("steers-tests" if steering else None)
        if reason is not None:
            report.leave_out(str(rel), reason)
            continue
        if not under_link(into, rel):  # else a link the agent put in a folder's place holds it: gone already
            _remove(into / rel)
        report.deleted.append(str(rel))
    return report
