"""The `polarproxy` command line: only the wiring. Each command lives in `polarproxy/commands/`, and
shares its options and helpers through `polarproxy/commands/support.py`."""

from __future__ import annotations

import gc
import importlib
import logging
import os
import sys
from typing import Annotated

import typer

from polarproxy import __version__
from polarproxy.commands.support import FAST_EXIT

# (command name, module, attribute): a command, or a sub-app ("ca", "db"), in `--help` order. A run of one
# command imports and builds only that one (`main`), not every command's module and options (~0.1 s).
COMMANDS = (
    ("tiny-model", "polarproxy.commands.tiny", "tiny_model"),
    ("backend", "polarproxy.commands.backend", "backend"),
    ("record", "polarproxy.commands.record", "record"),
    ("serve", "polarproxy.commands.serve", "serve"),
    ("ca", "polarproxy.commands.ca", "ca_app"),
    ("ls", "polarproxy.commands.ls", "list_episodes"),
    ("show", "polarproxy.commands.show", "show"),
    ("export", "polarproxy.commands.export", "export"),
    ("reward", "polarproxy.commands.reward", "reward"),
    ("audit", "polarproxy.commands.audit", "audit"),
    ("train", "polarproxy.commands.train", "train_command"),
    ("sync", "polarproxy.commands.sync", "sync_command"),
    ("rollout", "polarproxy.commands.rollout", "rollout"),
    ("tasks", "polarproxy.commands.tasks", "tasks_app"),
    ("compare", "polarproxy.commands.compare", "compare_command"),
    ("db", "polarproxy.commands.db", "db_app"),
    ("rm", "polarproxy.commands.delete", "rm"),
    ("prune", "polarproxy.commands.delete", "prune"),
    ("view", "polarproxy.commands.view", "view"),
)


def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        typer.echo(__version__)
        raise typer.Exit(0)


def make_app(only: str | None = None) -> typer.Typer:
    """The `polarproxy` app with every command, or with command `only` alone (the same options, help and
    errors for that command)."""
    new = typer.Typer(
        pretty_exceptions_show_locals=False,
        no_args_is_help=True,
        add_completion=False,
        help="Record the exact tokens a model saw and sampled inside unmodified agent harnesses.",
    )
    new.callback(invoke_without_command=True)(_root)
    for name, module_name, attr in COMMANDS:
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        target = getattr(module, attr)
        if isinstance(target, typer.Typer):
            new.add_typer(target, name=name)
        elif name == "reward":
            new.command(name, context_settings=module.CONTEXT_SETTINGS)(target)
        else:
            new.command(name)(target)
    return new


def __getattr__(name: str) -> typer.Typer:
    """`app`, the app with every command, built when first asked for (tests, `--help`)."""
    if name == "app":
        full = globals()["app"] = make_app()
        return full
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    name = sys.argv[1] if len(sys.argv) > 1 else None
    single = name if any(name == c[0] for c in COMMANDS) else None
    if single == "record":
        # Its start-up is mostly imports (many objects, none of them garbage): the cyclic collector's passes
        # over them are work for nothing, a few per cent of `record -- true` (docs/benchmarks-history.md).
        # Paused until the proxy serves or is given up (`EarlyProxy.until_needed` resumes it).
        gc.disable()
    try:
        make_app(single)()
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
