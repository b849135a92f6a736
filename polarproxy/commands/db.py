"""`polarproxy db path|status|migrate|repair`: where the store is, its state, its schema, repairs.

Also the helpers the other commands use when they open a store: `recover_on_open` (end the episodes of
crashed proxies, replay their spools) and `backlog_lines` (what waits in spools)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

db_app = typer.Typer(no_args_is_help=True, help="Look after the store: path, status, migrate, repair.")

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", envvar="POLARPROXY_DB", help="SQLite path or database URL (default: the user data dir)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
StaleOpt = Annotated[
    str,
    typer.Option(
        "--stale-after",
        help="A proxy on another machine whose heartbeat is older than this is taken for dead (e.g. 10m, 1h).",
    ),
]


def _fail(message: str, hint: str | None = None) -> Any:
    from polarproxy.cli import fail

    fail(message, hint)


def _print_json(data: Any) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def _stale_seconds(text: str) -> float:
    from polarproxy.store.maintenance import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        _fail(f"--stale-after: {e}", "Pass e.g. --stale-after 10m.")
        raise AssertionError from e


def backlog_lines(url: str) -> list[str]:
    """'N calls pending in spool FILE ...' for each spool of this database (url: a path or URL)."""
    from polarproxy.store import spool

    try:
        return spool.describe(spool.pending(url))
    except Exception:  # a listing must not fail because a spool folder is unreadable
        return []


def recover_on_open(store: Any) -> None:
    """What every command does on opening a store: replay orphaned spools, end dead proxies' episodes."""
    from polarproxy.store.maintenance import recover

    try:
        recover(store)
    except Exception as e:  # read-only or busy: reading goes on; `polarproxy db repair` says more
        import logging

        logging.getLogger("polarproxy").debug("recovery on open skipped: %s", e)


def _open(db: str | None, *, recover: bool = True) -> Any:
    from polarproxy.store.store import Store

    try:
        store = Store.open(db)
    except Exception as e:
        backlog = backlog_lines(db) if db else default_backlog()
        _fail(
            f"Cannot open the store '{db or 'default'}': {e}",
            "\n".join([*backlog, "Pass --db PATH to a writable file, or set POLARPROXY_DB."]),
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
        typer.echo(f"polarproxy: cannot read the store for the summary: {e}", err=True)
        for line in backlog_lines(db) if db else default_backlog():
            typer.echo(f"polarproxy: {line}", err=True)
        return None
    recover_on_open(store)
    return store


def default_backlog() -> list[str]:
    from polarproxy.store.store import default_db_url

    return backlog_lines(default_db_url())


@db_app.command("path")
def path(db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """Print the database: the SQLite file, or the URL with its password hidden."""
    from polarproxy.store.maintenance import location

    loc = location(db)
    if json_out:
        _print_json(loc.__dict__)
    else:
        typer.echo(loc.path if loc.path and loc.path != ":memory:" else loc.url)


@db_app.command("status")
def status(
    db: DbOpt = None,
    stale_after: StaleOpt = "10m",
    json_out: JsonOpt = False,
) -> None:
    """Schema version, pending migrations, episodes and calls by status, stale running episodes, spools."""
    from polarproxy.store import maintenance
    from polarproxy.store.store import Store

    stale = _stale_seconds(stale_after)
    loc = maintenance.location(db)
    try:
        applied, pending = maintenance.migration_state(db)
    except Exception as e:
        _fail(
            f"Cannot read the database {loc.url}: {e}",
            "\n".join([*backlog_lines(db or loc.url), "Check that it is running and reachable."]),
        )
    data: dict[str, Any] = {
        "db": loc.url,
        "schema": applied[-1] if applied else None,
        "applied_migrations": applied,
        "pending_migrations": pending,
    }
    if applied and not pending:
        store = Store.open(db)
        try:
            data.update(maintenance.status(store, stale_after=stale))
        finally:
            store.close()
    else:
        from polarproxy.store import spool

        data["spool"] = [b.__dict__ for b in spool.pending(maintenance.sa_url(db))]
    if json_out:
        _print_json(data)
        return
    typer.echo(f"database: {data['db']}")
    typer.echo(f"schema:   {data['schema'] or 'none (blank database)'}")
    typer.echo(
        "pending migrations: "
        + (", ".join(pending) + " (run `polarproxy db migrate`)" if pending else "none")
    )
    for what in ("episodes", "calls"):
        if what in data:
            counts = ", ".join(f"{n} {s}" for s, n in data[what].items()) or "none"
            typer.echo(f"{what}: {counts}")
    for s in data.get("stale_running_episodes", []):
        typer.echo(f"stale: episode {s['id']} is running but {s['reason']} (run `polarproxy db repair`)")
    from polarproxy.store.spool import Backlog, describe

    for line in describe([Backlog(**b) for b in data["spool"]]):
        typer.echo(line)


@db_app.command("migrate")
def migrate(
    db: DbOpt = None,
    check: Annotated[
        bool, typer.Option("--check", help="Only report pending migrations; exit 1 if there are any.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Apply the schema migrations the database lacks (`--check`: only list them)."""
    from polarproxy.store import maintenance
    from polarproxy.store.engine import make_engine
    from polarproxy.store.migrations import migrate as run_migrations

    loc = maintenance.location(db)
    try:
        _, pending = maintenance.migration_state(db)
    except Exception as e:
        _fail(f"Cannot read the database {loc.url}: {e}", "Check that it is running and reachable.")
    if check:
        if json_out:
            _print_json({"db": loc.url, "pending_migrations": pending})
        else:
            typer.echo(
                f"{len(pending)} pending migration(s): {', '.join(pending)}"
                if pending
                else "the schema is up to date"
            )
        raise typer.Exit(1 if pending else 0)
    engine = make_engine(maintenance.sa_url(db))
    try:
        done = run_migrations(engine)
    except Exception as e:
        _fail(f"Migrating {loc.url} failed, nothing was changed: {e}", "Fix the cause and run it again.")
    finally:
        engine.dispose()
    if json_out:
        _print_json({"db": loc.url, "applied": done})
    else:
        typer.echo(f"applied {', '.join(done)}" if done else "the schema is up to date")


@db_app.command("repair")
def repair(
    db: DbOpt = None,
    stale_after: StaleOpt = "10m",
    json_out: JsonOpt = False,
) -> None:
    """Replay spooled writes and end the episodes of dead proxies, marking their in-flight calls interrupted."""
    from polarproxy.store.maintenance import recover

    stale = _stale_seconds(stale_after)
    store = _open(db, recover=False)
    try:
        report = recover(store, stale_after=stale)
    except Exception as e:
        _fail(f"Repair failed: {e}", "Check that the database is reachable and writable, then run it again.")
    if json_out:
        _print_json(report.to_dict())
    else:
        typer.echo(
            f"replayed {report.replayed_ops} spooled writes ({report.replayed_calls} calls)"
            + (f", {report.rejected_ops} refused (see the .rejected file)" if report.rejected_ops else "")
        )
        for e in report.episodes:
            typer.echo(f"episode {e.episode_id}: interrupted ({e.calls} in-flight calls): {e.reason}")
        typer.echo(f"{report.calls_interrupted} in-flight calls marked interrupted")
    if report.replay_error:
        _fail(
            f"The database stopped answering during the replay: {report.replay_error}",
            "The rest stays in the spool; run `polarproxy db repair` again when it answers.",
        )
