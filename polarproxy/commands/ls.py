"""`polarproxy ls`: the episodes, newest first."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from polarproxy.commands.support import (
    DbOpt,
    JsonOpt,
    NothingRecorded,
    backlog_lines,
    nothing_recorded,
    open_store,
    print_json,
    usage_fail,
)


def list_episodes(
    db: DbOpt = None,
    limit: Annotated[int, typer.Option(help="How many episodes, newest first.")] = 50,
    task: Annotated[str | None, typer.Option(help="Only episodes of this task (`record --task`).")] = None,
    group: Annotated[str | None, typer.Option(help="Only episodes of this group (`record --group`).")] = None,
    status: Annotated[
        str | None, typer.Option(help="Only episodes with this status (running, ok, failed, interrupted).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """List episodes: id, command, task, group, exit code, calls, tokens, reward, status, time."""
    from polarproxy.views import episode_rows, episodes_plain, episodes_table

    try:
        store = open_store(db, create=False)
    except NothingRecorded:
        nothing_recorded(json_out, [])
        return
    from polarproxy.store.query import EpisodeQuery

    try:
        where = EpisodeQuery(task=task, group_id=group, status=status)
    except ValueError as e:
        usage_fail(str(e), "See `polarproxy ls --help`.")
    episodes = store.list_episodes(limit=limit, where=where)
    total = store.count_episodes(where=where)
    for line in backlog_lines(store.url):  # writes waiting in spools (the database was down)
        typer.echo(line, err=True)
    if json_out:
        print_json(episode_rows(episodes))
        return
    if not sys.stdout.isatty():  # piped: plain tab-separated lines, one per episode
        for row in episodes_plain(episodes):
            typer.echo(row)
        typer.echo(f"{len(episodes)} of {total} episodes", err=True)
        return
    from rich.console import Console

    Console(emoji=False).print(episodes_table(episodes, total))
