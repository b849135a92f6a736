"""`polarproxy compare`: the harnesses of a store side by side (resolved rate, pass@k, tokens, failures)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polarproxy.commands.support import (
    DbOpt,
    JsonOpt,
    NothingRecorded,
    nothing_recorded,
    open_store,
    parse_time_option,
    print_json,
)


def compare_command(
    db: DbOpt = None,
    rollout: Annotated[
        str | None, typer.Option("--rollout", help="Only the episodes of this rollout ID.")
    ] = None,
    task: Annotated[str | None, typer.Option(help="Only episodes of this task.")] = None,
    harness: Annotated[
        list[str] | None, typer.Option(help="Only these harnesses (repeatable; default: every one).")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only episodes started since (ISO time, or an age: 24h, 7d).")
    ] = None,
    md: Annotated[
        Path | None, typer.Option("--md", help="Also write the report as Markdown to this file.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Compare harnesses: resolved rate (Wilson 95 %), pass@k, reward, calls, tokens, T2 extension, failures."""
    from polarproxy.compare import compare, markdown
    from polarproxy.store.query import EpisodeQuery

    started = parse_time_option("--since", since) if since is not None else None
    try:
        store = open_store(db, create=False)
    except NothingRecorded:
        nothing_recorded(json_out, {"harnesses": {}, "tasks": {}})
        return
    try:
        where = EpisodeQuery(task=task, harness=tuple(harness) if harness else None, since=started)
        episodes = [
            e
            for e in store.list_episodes(limit=None, where=where, counts=False)
            if rollout is None or e.metadata.get("rollout_id") == rollout
        ]
        report = compare(store, episodes)
    finally:
        store.close()
    text = markdown(report)
    if md is not None:
        md.write_text(text, encoding="utf-8")
    if json_out:
        print_json(report)
    else:
        typer.echo(text, nl=False)
