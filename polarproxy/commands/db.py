"""`polarproxy db path|status|migrate|repair`: where the store is, its state, its schema, repairs."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from polarproxy.commands.support import (
    DbOpt,
    JsonOpt,
    backlog_lines,
    fail,
    open_store,
    parse_age_option,
    print_json,
)

db_app = typer.Typer(no_args_is_help=True, help="Look after the store: path, status, migrate, repair.")

StaleOpt = Annotated[
    str,
    typer.Option(
        "--stale-after",
        help="A proxy on another machine whose heartbeat is older than this is taken for dead (e.g. 10min, 1h).",
    ),
]


@db_app.command("path")
def path(db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """Print the database: the SQLite file, or the URL with its password hidden."""
    from polarproxy.store.maintenance import location

    loc = location(db)
    if json_out:
        print_json(loc.__dict__)
    else:
        typer.echo(loc.path if loc.path and loc.path != ":memory:" else loc.url)


@db_app.command("status")
def status(
    db: DbOpt = None,
    stale_after: StaleOpt = "10min",
    json_out: JsonOpt = False,
) -> None:
    """Schema version, pending migrations, episodes and calls by status, stale running episodes, spools."""
    from polarproxy.store import maintenance
    from polarproxy.store.store import Store

    stale = parse_age_option("--stale-after", stale_after)
    loc = maintenance.location(db)
    try:
        applied, pending = maintenance.migration_state(db)
    except Exception as e:
        fail(
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
        print_json(data)
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
        fail(f"Cannot read the database {loc.url}: {e}", "Check that it is running and reachable.")
    if check:
        if json_out:
            print_json({"db": loc.url, "pending_migrations": pending})
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
        fail(f"Migrating {loc.url} failed, nothing was changed: {e}", "Fix the cause and run it again.")
    finally:
        engine.dispose()
    if json_out:
        print_json({"db": loc.url, "applied": done})
    else:
        typer.echo(f"applied {', '.join(done)}" if done else "the schema is up to date")


@db_app.command("repair")
def repair(
    db: DbOpt = None,
    stale_after: StaleOpt = "10min",
    json_out: JsonOpt = False,
) -> None:
    """Replay spooled writes and end the episodes of dead proxies, marking their in-flight calls interrupted."""
    from polarproxy.store.maintenance import recover

    stale = parse_age_option("--stale-after", stale_after)
    store = open_store(db, recover=False)
    try:
        report = recover(store, stale_after=stale)
    except Exception as e:
        fail(f"Repair failed: {e}", "Check that the database is reachable and writable, then run it again.")
    if json_out:
        print_json(report.to_dict())
    else:
        typer.echo(
            f"replayed {report.replayed_ops} spooled writes ({report.replayed_calls} calls)"
            + (f", {report.rejected_ops} refused (see the .rejected file)" if report.rejected_ops else "")
        )
        for e in report.episodes:
            typer.echo(f"episode {e.episode_id}: interrupted ({e.calls} in-flight calls): {e.reason}")
        typer.echo(f"{report.calls_interrupted} in-flight calls marked interrupted")
    if report.replay_error:
        fail(
            f"The database stopped answering during the replay: {report.replay_error}",
            "The rest stays in the spool; run `polarproxy db repair` again when it answers.",
        )
