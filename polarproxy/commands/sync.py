"""`polarproxy sync CHECKPOINT --backend URL`: push a checkpoint to a backend again (as `train --sync` did)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from polarproxy.commands.enums import PauseMode, SyncKind
from polarproxy.commands.support import fail, print_json


def sync_command(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint folder (OUT/step-N) written by `train`.")],
    backend: Annotated[
        str, typer.Option("--backend", envvar="POLARPROXY_BACKEND", help="The backend to load it (its URL).")
    ],
    sync_kind: Annotated[
        SyncKind, typer.Option("--sync-kind", help="What serves --backend.")
    ] = SyncKind.sglang,
    sync_pause: Annotated[
        PauseMode | None, typer.Option("--sync-pause", help="Pause generation around the update.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds each sync request may take.")] = 600.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Make a backend serve a checkpoint's weights (sends POLARPROXY_SYNC_API_KEY as train --sync does)."""
    if not (checkpoint / "config.json").is_file():
        fail(
            f"'{checkpoint}' is not a checkpoint folder (no config.json).",
            "Pass OUT/step-N of a `train` run.",
        )
    from polarproxy.redact import without_userinfo
    from polarproxy.train.sync import SyncError, sync_weights

    try:
        done = sync_weights(
            backend,
            checkpoint,
            kind=sync_kind.value,  # type: ignore[arg-type]
            timeout=timeout,
            pause_mode=sync_pause.value if sync_pause else None,  # type: ignore[arg-type]
            api_key=os.environ.get("POLARPROXY_SYNC_API_KEY"),
        )
    except SyncError as e:
        fail(f"The backend did not take the checkpoint: {e}", "Is it running, and of --sync-kind?")
    summary = {
        "backend": without_userinfo(backend),
        "checkpoint": str(checkpoint),
        "weight_version": done.weight_version,
    }
    if json_out:
        print_json(summary)
    else:
        typer.echo(
            f"{without_userinfo(backend)} serves {checkpoint} (weight version {done.weight_version})",
            err=True,
        )
