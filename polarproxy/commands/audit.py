"""`polarproxy audit [EPISODE]`: where a re-tokenizing system would have fed the model different tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polarproxy.commands.support import (
    DbOpt,
    JsonOpt,
    NothingRecorded,
    fail,
    nothing_recorded,
    open_store,
    print_json,
)


def audit(
    episode: Annotated[
        str | None, typer.Argument(help="Episode ID (or a unique prefix); all episodes when left off.")
    ] = None,
    db: DbOpt = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            envvar="POLARPROXY_MODEL",
            help="Model folder to re-render with (default: the one each episode was recorded with).",
        ),
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
    try:
        ids = [store.get_episode(episode).id] if episode else None
        report = audit_store(store, ids, model)
    except StoreError as e:
        fail(str(e), "List episodes with `polarproxy ls`.")
    except PolarproxyError as e:
        fail(e.message, e.hint)
    if json_out:
        print_json(report.to_dict())
        return
    from rich.console import Console

    from polarproxy.audit.view import print_report

    print_report(Console(emoji=False), report)
