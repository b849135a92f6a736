"""Where a rollout's tasks come from: a TASKS file (tasks.py) or SWE-bench instances (swebench.py), told
apart by their rows."""

from __future__ import annotations

from pathlib import Path

from polarproxy.rollout.swebench import default_cache, is_swebench, load_swebench
from polarproxy.rollout.tasks import Task, TaskError, load_tasks


def load_source(path: Path, *, repos: Path | None = None, cache: Path | None = None) -> list[Task]:
    """The tasks of `path`; TaskError naming what is wrong (nothing is run)."""
    if not path.is_file():
        raise TaskError(
            f"Cannot read the task source {path}: no such file.",
            hint="Pass a TASKS file or SWE-bench instances.",
        )
    if is_swebench(path):
        return load_swebench(path, repos, cache or default_cache())
    if repos is not None:
        raise TaskError(
            f"--repos goes with a source of SWE-bench instances; {path} is a TASKS file.",
            hint="Drop --repos, or pass a JSONL or Parquet file of SWE-bench instances.",
        )
    return load_tasks(path)
