"""`polarproxy tasks check SOURCE`: validate a rollout's task source and say what each task will run,
without running anything."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from polarproxy.commands.support import JsonOpt, fail, print_json

tasks_app = typer.Typer(no_args_is_help=True, help="Rollout task sources: check one before a run.")


def task_plan(task: Any) -> dict[str, Any]:
    """What `rollout` will do with one task, as `tasks check --json` prints it."""
    return {
        "id": task.id,
        "workspace": str(task.workspace),
        "setup": list(task.setup),
        "tests": str(task.tests) if task.tests is not None else None,
        "tests_dir": task.tests_dir if task.tests is not None else None,
        "grade_from": task.grade_from,
        "verify": task.verify,
        "timeout_s": task.timeout_s,
        "instruction": task.instruction,
        "metadata": task.metadata,
    }


@tasks_app.command("check")
def check(
    source: Annotated[
        Path,
        typer.Argument(help="A TASKS file (JSONL), or SWE-bench instances (JSONL or Parquet) with --repos."),
    ],
    repos: Annotated[
        Path | None,
        typer.Option("--repos", help="A SWE-bench source's repositories: clones named owner__name."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate a task source and print what each task will run (nothing is run)."""
    from polarproxy.errors import PolarproxyError
    from polarproxy.rollout.sources import load_source

    try:
        tasks = load_source(source, repos=repos)
    except PolarproxyError as e:
        fail(e.message, e.hint)
    plans = [task_plan(t) for t in tasks]
    if json_out:
        print_json({"source": str(source), "tasks": plans})
        return
    for p in plans:
        typer.echo(f"{p['id']}: workspace {p['workspace']}")
        for command in p["setup"]:
            typer.echo(f"  setup:  {command}")
        where = f" (hidden tests {p['tests']} at {p['tests_dir']}/)" if p["tests"] else ""
        graded = (
            "a clean copy with the agent's changes" if p["grade_from"] == "patch" else "the agent's workspace"
        )
        typer.echo(f"  verify: {p['verify']}  in {graded}{where}")
    typer.echo(f"{len(plans)} task(s) in {source}: ok", err=True)
