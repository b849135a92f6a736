"""`polarproxy audit [EPISODE]`: where a re-tokenizing system would have fed the model different tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polarproxy.commands.support import (
    EPISODE_REF,
    DbOpt,
    JsonOpt,
    NothingRecorded,
    fail,
    nothing_recorded,
    open_store,
    print_json,
)


def audit(
    episode: Annotated[str | None, typer.Argument(help=EPISODE_REF + "; all episodes when left off.")] = None,
    db: DbOpt = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            envvar="POLARPROXY_MODEL",
            help="Model folder to re-render with (default: the one each episode was recorded with).",
        ),
    ] = None,
    task: Annotated[str | None, typer.Option(help="Only episodes of this task.")] = None,
    group: Annotated[str | None, typer.Option(help="Only episodes of this group.")] = None,
    harness: Annotated[str | None, typer.Option(help="Only episodes of this harness.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Only episodes started since (ISO time, or an age: 24h, 7d).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Re-render each call fresh from text and report where it drifts from the recorded prompt IDs."""
    from polarproxy.audit import audit_store
    from polarproxy.errors import PolarproxyError
    from polarproxy.store.errors import StoreError

    try:
        store = open_store(db, create=False)
    except NothingRecorded:
        nothing_recorded(json_out, {"episodes": []})
        return
    from polarproxy.commands.support import parse_time_option
    from polarproxy.store.query import EpisodeQuery

    where = None
    if (task, group, harness, since) != (None, None, None, None):
        when = parse_time_option("--since", since) if since is not None else None
        where = EpisodeQuery(task=task, group_id=group, harness=harness, since=when)
    try:
        if episode:
            ids: list[str] | None = [store.get_episode(episode).id]
        elif where is not None:
            ids = [e.id for e in reversed(store.list_episodes(limit=None, where=where, counts=False))]
        else:
            ids = None
        report = audit_store(store, ids, model, named=bool(episode))
    except StoreError as e:
        fail(str(e), "List episodes with `polarproxy ls`.")
    except PolarproxyError as e:
        fail(e.message, e.hint)
    if json_out:
        print_json(report.to_dict())
    else:
        from rich.console import Console

        from polarproxy.audit.view import print_report

        print_report(Console(emoji=False), report)
    skipped = [ep for ep in report.episodes if ep.skipped]
    if skipped and len(skipped) == sum(1 for ep in report.episodes if ep.skipped or ep.calls):
        fail(
            f"No call was audited: {len(skipped)} episode(s) with calls were skipped ({skipped[0].skipped}).",
            "Pass --model DIR, the model folder the calls were recorded with.",
        )
