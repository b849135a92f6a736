"""`polarproxy rm EPISODE...` and `polarproxy prune --before DATE`: delete whole episodes, after asking."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from polarproxy.commands.support import DbOpt, JsonOpt, fail, open_store, parse_time_option, print_json

YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")]


def _confirm(question: str) -> bool:
    if not sys.stdin or sys.stdin.closed:
        return False
    try:
        return typer.confirm(question, default=False)
    except (typer.Abort, EOFError):
        return False


def _delete(
    store: Any,
    ids: list[str],
    calls: int,
    *,
    yes: bool,
    json_out: bool,
    extra: dict[str, Any],
    dry_run: bool = False,
) -> None:
    from polarproxy.store.errors import StoreError
    from polarproxy.store.maintenance import delete_episodes

    if not ids:
        if json_out:
            print_json({"deleted_episodes": [], "deleted_calls": 0, **extra})
        else:
            typer.echo("nothing to delete")
        return
    if dry_run:
        if json_out:
            print_json({"would_delete_episodes": ids, "would_delete_calls": calls, **extra})
        else:
            for eid in ids:
                typer.echo(eid)
            typer.echo(
                f"would delete {len(ids)} episode(s) with {calls} call(s) (--dry-run: nothing deleted)"
            )
        return
    if not json_out:
        for eid in ids:
            typer.echo(f"deleting {eid}", err=True)
    if not yes:
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        if not _confirm(f"Delete {len(ids)} episode(s) ({shown}) with {calls} call(s)?"):
            fail("Nothing deleted.", "Answer y to delete, or pass --yes.")
    try:
        deleted = delete_episodes(store, ids)
    except StoreError as e:
        fail(str(e))
    if json_out:
        print_json({"deleted_episodes": ids, "deleted_calls": deleted, **extra})
    else:
        typer.echo(f"deleted {len(ids)} episode(s) with {deleted} call(s)")


def rm(
    episodes: Annotated[
        list[str], typer.Argument(help="Episode IDs (or unique prefixes, or @N: the N-th latest).")
    ],
    db: DbOpt = None,
    yes: YesOpt = False,
    force: Annotated[
        bool, typer.Option("--force", help="Also delete episodes that are still running.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Delete episodes with all their calls."""
    from polarproxy.store.errors import StoreError
    from polarproxy.store.maintenance import count_calls

    store = open_store(db)
    ids: list[str] = []
    try:
        for key in episodes:
            ep = store.get_episode(key)
            if ep.status == "running" and not force:
                fail(
                    f"Episode {ep.id} is still running.",
                    "Wait for it to end, run `polarproxy db repair` if its proxy died, or pass --force.",
                )
            ids.append(ep.id)
    except StoreError as e:
        fail(str(e), "List episodes with `polarproxy ls`.")
    ids = list(dict.fromkeys(ids))
    _delete(store, ids, count_calls(store, ids), yes=yes, json_out=json_out, extra={})


def prune(
    before: Annotated[
        str,
        typer.Option(
            "--before",
            help="Delete episodes started before this: an ISO date or date-time, or an age (30d, 12h, 90min).",
        ),
    ],
    db: DbOpt = None,
    yes: YesOpt = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be deleted; delete nothing.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Delete the episodes started before a date (running ones are kept)."""
    from polarproxy.store.maintenance import plan_prune

    cutoff = parse_time_option("--before", before)
    store = open_store(db)
    plan = plan_prune(store, cutoff)
    if plan.skipped_running and not json_out:
        typer.echo(f"keeping {len(plan.skipped_running)} running episode(s)", err=True)
    _delete(
        store,
        plan.episodes,
        plan.calls,
        yes=yes,
        json_out=json_out,
        dry_run=dry_run,
        extra={"before": cutoff, "kept_running": plan.skipped_running},
    )
