"""The `polarproxy` command line: only the wiring. Each command lives in `polarproxy/commands/`, and
shares its options and helpers through `polarproxy/commands/support.py`."""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer

from polarproxy import __version__
from polarproxy.commands.audit import audit
from polarproxy.commands.backend import backend
from polarproxy.commands.ca import ca_app
from polarproxy.commands.db import db_app
from polarproxy.commands.delete import prune, rm
from polarproxy.commands.export import export
from polarproxy.commands.ls import list_episodes
from polarproxy.commands.record import record
from polarproxy.commands.reward import CONTEXT_SETTINGS as REWARD_CONTEXT
from polarproxy.commands.reward import reward
from polarproxy.commands.rollout import rollout
from polarproxy.commands.serve import serve
from polarproxy.commands.show import show
from polarproxy.commands.support import FAST_EXIT
from polarproxy.commands.tiny import tiny_model
from polarproxy.commands.train import train_command
from polarproxy.commands.view import view

app = typer.Typer(
    pretty_exceptions_show_locals=False,
    no_args_is_help=True,
    add_completion=False,
    help="Record the exact tokens a model saw and sampled inside unmodified agent harnesses.",
)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        typer.echo(__version__)
        raise typer.Exit(0)


app.command("tiny-model")(tiny_model)
app.command()(backend)
app.command()(record)
app.command()(serve)
app.add_typer(ca_app, name="ca")
app.command("ls")(list_episodes)
app.command()(show)
app.command()(export)
app.command("reward", context_settings=REWARD_CONTEXT)(reward)
app.command()(audit)
app.command("train")(train_command)
app.command()(rollout)
app.add_typer(db_app, name="db")
app.command("rm")(rm)
app.command("prune")(prune)
app.command()(view)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app()
    except SystemExit as e:
        if not FAST_EXIT["on"]:
            raise
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
