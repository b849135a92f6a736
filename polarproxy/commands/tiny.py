"""`polarproxy tiny-model DIR`: a tiny Qwen3-architecture model, tokenizer and chat template, offline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from polarproxy.commands.support import fail, need


def _check_target(out: Path, force: bool) -> None:
    """Refuse a folder that holds files (unless --force) and a path that cannot be created."""
    if out.exists() and not out.is_dir():
        fail(f"'{out}' is a file, not a folder.", "Pass a new or empty folder for the model.")
    if out.is_dir() and any(out.iterdir()) and not force:
        fail(
            f"The folder '{out}' is not empty.",
            "Pass a new or empty folder, or --force to overwrite the model files in it.",
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"Cannot create the folder '{out}': {e.strerror}.", "Pass a folder you can write to.")


def tiny_model(
    out: Annotated[Path, typer.Argument(help="Folder to write the model into (new or empty).")],
    train_steps: Annotated[int | None, typer.Option(help="Training steps (0: random weights).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    chat_template: Annotated[
        Path | None,
        typer.Option(
            "--chat-template",
            help="Use this chat template (a .jinja file): its special tokens join the tokenizer and its "
            "end-of-turn token becomes the stop token; random weights (answer with `backend --script`).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite the model files in a non-empty folder.")
    ] = False,
) -> None:
    """Build a tiny Qwen3-architecture model, tokenizer and chat template, offline."""
    need("torch", "tiny-model", "torch")
    from rich.progress import Progress

    from polarproxy.tiny import DEFAULT_TRAIN_STEPS, build_tiny_model

    steps = (0 if chat_template is not None else DEFAULT_TRAIN_STEPS) if train_steps is None else train_steps
    if steps < 0:
        fail(f"--train-steps {steps} is negative.", "Pass 0 for random weights or a positive step count.")
    if chat_template is not None:
        if not chat_template.is_file():
            fail(f"--chat-template '{chat_template}' is not a file.", "Pass a .jinja chat template file.")
        if steps:
            fail(
                f"--train-steps {steps} with --chat-template: training knows only the built-in template.",
                "Leave --train-steps off (random weights) and script the answers with `backend --script`.",
            )
    _check_target(out, force)
    t0 = time.perf_counter()
    with Progress(transient=True) as progress:
        task = progress.add_task("training", total=max(steps, 1))

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=max(total, 1))

        try:
            path = build_tiny_model(
                out, train_steps=steps, seed=seed, progress=report, chat_template=chat_template
            )
        except ValueError as e:
            fail(str(e), "Check the chat template: polarproxy renders a sample conversation with it.")
    typer.echo(f"tiny model in {path} ({time.perf_counter() - t0:.1f} s, {steps} training steps)", err=True)
