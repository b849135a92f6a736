"""What every command shares: `fail`, the `--db`/`--json`/`--model` options, `open_store`, JSON output.

`cli.py` only wires commands; each command lives in a module of `polarproxy/commands/` and imports its
helpers from here (never from `cli.py`). `open_store` is the one way a command opens a store, and it never
prints a database password (T5): every message shows the URL through `display_url`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", envvar="POLARPROXY_DB", help="SQLite path or database URL (default: the user data dir)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
# How a command names an episode (store/episodes.py `get_episode` resolves it).
EPISODE_REF = "Episode ID (or a unique prefix, or @1 for the latest, @2 the one before)"
EpisodeArg = Annotated[str, typer.Argument(help=EPISODE_REF + ".")]
ModelOpt = Annotated[
    Path | None,
    typer.Option("--model", envvar="POLARPROXY_MODEL", help="Model folder (tokenizer + chat template)."),
]


# Set by a command whose work is all closed and flushed when it returns (`record`): `polarproxy.cli.main`
# then ends the process without the interpreter's teardown, which takes ~0.9 s here once mitmproxy,
# transformers and SQLAlchemy are loaded (bench/record_startup.py). Tests that call `app` in process are
# not affected: only `main` looks at it.
FAST_EXIT = {"on": False}


def fail(message: str, hint: str | None = None) -> NoReturn:
    """`Error: <what>` then a hint, exit 1 (DESIGN.md §9)."""
    _error(message, hint, code=1)


def need(module: str, command: str, extra: str) -> None:
    """`Error:` naming what is missing and the `pip install` line that brings it, when `module` (an optional
    dependency: torch, ray) is not installed; no traceback."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        fail(
            f"polarproxy {command} needs {module}, which is not installed.",
            f"pip install 'polarproxy[{extra}]' (from a checkout: pip install '.[{extra}]').",
        )


def typed(*names: str) -> bool:
    """Whether any of the current command's parameters `names` was given on its command line (not by its
    environment variable or default): options that exclude each other do so as typed, so that an exported
    `POLARPROXY_DB` does not make `rollout --serve` a usage error."""
    try:  # typer 0.26-0.28 carry their own click (setup.cfg's range); older ones use click's
        from typer._click.core import ParameterSource
        from typer._click.globals import get_current_context
    except ImportError:
        from click.core import ParameterSource  # type: ignore[no-redef]
        from click.globals import get_current_context  # type: ignore[no-redef]

    ctx = get_current_context(silent=True)
    if ctx is None:  # called outside a command (a library caller): every value counts as given
        return True
    typed_in = (ParameterSource.COMMANDLINE, ParameterSource.PROMPT)
    return any(ctx.get_parameter_source(name) in typed_in for name in names)


def usage_fail(message: str, hint: str | None = None) -> NoReturn:
    """A usage error: `Error: <what>` then a hint, exit 2."""
    _error(message, hint, code=2)


def _error(message: str, hint: str | None, *, code: int) -> NoReturn:
    from rich.console import Console

    err = Console(stderr=True, highlight=False, emoji=False)
    err.print(f"[bold red]Error:[/] {safe_text(message)}", markup=True, soft_wrap=True)
    if hint:  # printed without markup: hidden passwords, no escapes (a `[torch]` stays as written)
        from polarproxy.store.urls import hide_passwords

        err.print(hide_passwords(hint), style="dim", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def plain_text(text: str) -> str:
    """A message as it may be printed: any database password hidden (messages quote URLs and errors) and
    control characters shown as \\xNN (a message may quote what an agent named: a file, a task)."""
    from polarproxy.printable import printable
    from polarproxy.store.urls import hide_passwords

    return printable(hide_passwords(text), lines=True)


def safe_text(text: str) -> str:
    """`plain_text` with rich markup escaped, for a rich console."""
    from rich.markup import escape

    return escape(plain_text(text))


def print_json(data: Any) -> None:
    import orjson

    from polarproxy.printable import json_printable

    encoded = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
    sys.stdout.write(json_printable(encoded) + "\n")


def shown_db(db: str | None) -> str:
    """The store as it may be printed: a path, or a URL with its password hidden."""
    from polarproxy.store.store import default_db_url
    from polarproxy.store.urls import display_url

    return display_url(db if db else default_db_url())


def backlog_lines(url: str) -> list[str]:
    """'N calls pending in spool FILE ...' for each spool of this database (url: a path or URL)."""
    from polarproxy.store import spool

    try:
        return spool.describe(spool.pending(url))
    except Exception:  # a listing must not fail because a spool folder is unreadable
        return []


def default_backlog() -> list[str]:
    from polarproxy.store.store import default_db_url

    return backlog_lines(default_db_url())


def recover_on_open(store: Any) -> None:
    """What every command does on opening a store: replay orphaned spools, end dead proxies' episodes."""
    from polarproxy.store.maintenance import recover

    try:
        recover(store)
    except Exception as e:  # read-only or busy: reading goes on; `polarproxy db repair` says more
        import logging

        logging.getLogger("polarproxy").debug("recovery on open skipped: %s", e)


class NothingRecorded(Exception):
    """The default SQLite store does not exist yet: nothing has been recorded."""


def _missing_sqlite(db: str | None) -> Path | None:
    """The SQLite file `db` names when it does not exist (None: it exists, or `db` is a URL/memory)."""
    from polarproxy.store.store import default_db_url
    from polarproxy.store.urls import is_url

    target = db if db else default_db_url()
    if target == ":memory:" or is_url(target):
        return None
    path = Path(target).expanduser()
    return None if path.exists() else path


def open_store(db: str | None, *, create: bool = True, recover: bool = True) -> Any:
    """The store at `db` (None: `$POLARPROXY_DB` or the default file), or `Error:` and exit 1.

    Commands that only read pass `create=False`: a `--db` path that does not exist is an error (a typo must
    not create an empty database and report 0 episodes), and the default path that does not exist yet
    raises `NothingRecorded`, which the command turns into "no episode has been recorded yet"."""
    from polarproxy.store.store import Store

    if not create:
        missing = _missing_sqlite(db)
        if missing is not None:
            if db:
                fail(
                    f"No database at '{missing}'.",
                    "Check the --db path (or $POLARPROXY_DB); `polarproxy db path` prints the default one.",
                )
            raise NothingRecorded(str(missing))
    try:
        store = Store.open(db)
    except Exception as e:
        fail(
            f"Cannot open the store '{shown_db(db)}': {e}",
            "\n".join(
                [
                    *(backlog_lines(db) if db else default_backlog()),
                    "Pass --db PATH to a writable file, or set POLARPROXY_DB.",
                ]
            ),
        )
    if recover:
        recover_on_open(store)
    return store


def open_or_explain(db: str | None) -> Any:
    """The store after `record`, or None (having said why, and what waits in spools) when it cannot be
    opened: the harness's exit code matters more than the summary."""
    from polarproxy.store.store import Store

    try:
        store = Store.open(db)
    except Exception as e:
        typer.echo(plain_text(f"polarproxy: cannot read the store for the summary: {e}"), err=True)
        for line in backlog_lines(db) if db else default_backlog():
            typer.echo(f"polarproxy: {line}", err=True)
        return None
    recover_on_open(store)
    return store


def nothing_recorded(json_out: bool, empty: Any) -> None:
    """What a read command prints when the default store does not exist yet (exit 0)."""
    if json_out:
        print_json(empty)
    else:
        typer.echo("No episode has been recorded yet (`polarproxy record -- CMD` records one).", err=True)


def parse_age_option(flag: str, text: str) -> float:
    """An age option (`--stale-after 10min`) in seconds, or a usage error naming the flag."""
    from polarproxy.ages import parse_age

    try:
        return parse_age(text)
    except ValueError as e:
        usage_fail(f"{flag}: {e}")


def parse_time_option(flag: str, text: str) -> float:
    """A time option (`--before 2026-01-31`, `--since 24h`) as a Unix time, or a usage error."""
    from polarproxy.ages import parse_time

    try:
        return parse_time(text)
    except ValueError as e:
        usage_fail(f"{flag}: {e}")
