"""The TASKS file of `polarproxy rollout`: JSON Lines, one task per line (schemas/rollout-task.v2.json).

Each line: `id` (unique), `instruction` (the harness's prompt), `workspace` (a folder, relative to the
file), `verify` (a shell command run in a fresh copy of the workspace with the agent's changes and the
hidden `tests` folder present at `tests_dir`); optional `setup` (shell commands run in the workspace copy
before the harness), `tests` (a folder, relative to the file, hidden from the harness), `tests_dir` (where
the hidden tests go in the grading copy, relative to the workspace: default `tests`, the only place in v1;
a repository with its own `tests/` puts them elsewhere, so they do not replace its own), `grade_from`
(`workspace`: the folder as the agent left it; `patch`: a clean copy of the task's workspace with the
agent's changes applied, rollout/agent_changes.py), `timeout_s` (the
harness's time limit) and `metadata` (strings, stored with each episode). Blank lines and lines starting
with `#` are skipped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from polarproxy.choices import GRADE_FROM
from polarproxy.errors import UsageError

REQUIRED = ("id", "instruction", "workspace", "verify")
OPTIONAL = ("setup", "tests", "tests_dir", "grade_from", "timeout_s", "metadata")
DEFAULT_TESTS_DIR = "tests"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class TaskError(UsageError):
    """A TASKS file that cannot be used; the message names the file, the line and the field."""


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    instruction: str
    workspace: Path  # absolute
    verify: str
    setup: tuple[str, ...] = ()
    tests: Path | None = None  # absolute; copied in at `tests_dir` for `verify` only
    tests_dir: str = DEFAULT_TESTS_DIR  # relative to the workspace copy, no `..`
    grade_from: str = "workspace"  # or "patch": a clean copy with the agent's changes (agent_changes.py)
    timeout_s: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)


def parse_task(data: Any, *, base: Path, where: str) -> Task:
    """One task from a decoded line; paths resolve against `base` (the TASKS file's folder)."""

    def bad(what: str) -> TaskError:
        return TaskError(
            f"{where}: {what}", hint="Fix the line (schemas/rollout-task.v2.json, docs/rollout.md)."
        )

    if not isinstance(data, dict):
        raise bad(f"a task must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)} (allowed: {', '.join(REQUIRED + OPTIONAL)})")
    for name in REQUIRED:
        if name not in data:
            raise bad(f"field '{name}' is missing (required: {', '.join(REQUIRED)})")
        if not isinstance(data[name], str) or not data[name].strip():
            raise bad(f"field '{name}' must be a non-empty string")
    if not _ID.match(data["id"]):
        raise bad(f"id {data['id']!r} must be 1-128 letters, digits, '_', '.', ':' or '-'")
    workspace = (base / data["workspace"]).resolve()
    if not workspace.is_dir():
        raise bad(f"workspace {data['workspace']!r} is not a folder ({workspace})")
    setup = data.get("setup", [])
    if isinstance(setup, str):
        setup = [setup]
    if not isinstance(setup, list) or not all(isinstance(s, str) and s.strip() for s in setup):
        raise bad("field 'setup' must be a command string or a list of them")
    tests: Path | None = None
    if data.get("tests") is not None:
        if not isinstance(data["tests"], str):
            raise bad("field 'tests' must be a folder path (a string)")
        tests = (base / data["tests"]).resolve()
        if not tests.is_dir():
            raise bad(f"tests {data['tests']!r} is not a folder ({tests})")
        if tests == workspace or workspace in tests.parents:
            raise bad(f"tests {data['tests']!r} lies inside the workspace; the harness would see it")
    tests_dir = data.get("tests_dir", DEFAULT_TESTS_DIR)
    parts = PurePosixPath(tests_dir).parts if isinstance(tests_dir, str) else ()
    if not parts or PurePosixPath(tests_dir).is_absolute() or ".." in parts or parts == (".",):
        raise bad(
            f"tests_dir {tests_dir!r} must be a folder path inside the workspace (relative, without '..'), "
            'e.g. "hidden_tests"'
        )
    if "tests_dir" in data and tests is None:
        raise bad("field 'tests_dir' says where the hidden 'tests' go; give 'tests' too, or drop it")
    grade_from = data.get("grade_from", "workspace")
    if grade_from not in GRADE_FROM:
        raise bad(f"grade_from {grade_from!r} must be one of {', '.join(map(repr, GRADE_FROM))}")
    timeout = data.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise bad(f"timeout_s {timeout!r} must be a positive number of seconds")
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in metadata.items()
    ):
        raise bad("field 'metadata' must be an object of string, number or boolean values")
    return Task(
        id=data["id"],
        instruction=data["instruction"],
        workspace=workspace,
        verify=data["verify"],
        setup=tuple(setup),
        tests=tests,
        tests_dir=str(PurePosixPath(tests_dir)),
        grade_from=grade_from,
        timeout_s=float(timeout) if timeout is not None else None,
        metadata={str(k): str(v) for k, v in metadata.items()},
    )


def load_tasks(path: Path) -> list[Task]:
    """Every task of a TASKS file, validated; raises TaskError naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TaskError(
            f"Cannot read the TASKS file {path}: {e.strerror or e}", hint="Pass a JSONL file of tasks."
        ) from e
    base = path.resolve().parent
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{n}"
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise TaskError(f"{where}: not JSON ({e})", hint="One JSON object per line.") from None
        task = parse_task(data, base=base, where=where)
        if task.id in seen:
            raise TaskError(
                f"{where}: task id {task.id!r} is used on line {seen[task.id]} too",
                hint="Give every task its own id.",
            )
        seen[task.id] = n
        tasks.append(task)
    if not tasks:
        raise TaskError(f"The TASKS file {path} holds no task.", hint="Add one JSON object per line.")
    return tasks
