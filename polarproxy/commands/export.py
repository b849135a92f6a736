"""`polarproxy export`: recorded calls as training rows (token rows for RL, chat messages for SFT)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from polarproxy.commands.support import (
    DbOpt,
    JsonOpt,
    NothingRecorded,
    fail,
    nothing_recorded,
    open_store,
    print_json,
    usage_fail,
)


class Strategy(StrEnum):
    per_request = "per-request"
    prefix_merge = "prefix-merge"


class Format(StrEnum):
    jsonl = "jsonl"
    parquet = "parquet"
    sft = "sft"


SFT_ONLY = ("--tokenizer", "--encoding")


def check_out_path(out: Path) -> None:
    """`Error:` before the store is read when `out` cannot be written: a folder, a missing or read-only parent."""
    import os

    if out.is_dir():
        fail(f"--out '{out}' is a folder.", "Pass a file path, e.g. --out calls.jsonl.")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        fail(f"The folder of --out '{out}' does not exist.", f"Create it first (mkdir -p {parent}).")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        fail(f"Cannot write --out '{out}': permission denied.", "Pass a path you can write to.")


def _open_for_export(db: str | None, json_out: bool) -> Any:
    """The store to export from; with the default store not created yet, say so and exit 0."""
    try:
        return open_store(db, create=False)
    except NothingRecorded:
        nothing_recorded(json_out, {"rows": 0, "calls": 0})
        raise typer.Exit(0) from None


def export(
    out: Annotated[Path, typer.Option("--out", help="Output file.")],
    strategy: Annotated[
        Strategy,
        typer.Option(
            help="per-request: one row per call; prefix-merge: calls that extend earlier ones share a row."
        ),
    ] = Strategy.per_request,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format", help="jsonl or parquet: token rows; sft: chat messages (schemas/sft-row.v1.json)."
        ),
    ] = Format.jsonl,
    episode: Annotated[
        list[str] | None, typer.Option("--episode", help="Only these episodes (repeatable).")
    ] = None,
    include_failed: Annotated[bool, typer.Option(help="Also export failed and aborted calls.")] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
    status: Annotated[
        str | None, typer.Option(help="--format sft: only episodes with this status (ok).")
    ] = None,
    min_reward: Annotated[
        float | None, typer.Option(help="--format sft: only episodes with reward >= this.")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="--format sft: only episodes started since (ISO time, or an age: 24h, 7d)."),
    ] = None,
    harness: Annotated[str | None, typer.Option(help="--format sft: only episodes of this harness.")] = None,
    model_name: Annotated[
        str | None,
        typer.Option("--model-name", help="--format sft: only calls asking for this model name (glob)."),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="--format sft: also write input_ids/loss_mask rendered with this model folder's template."
        ),
    ] = None,
    encoding: Annotated[
        str | None,
        typer.Option(help="--format sft: also write input_ids/loss_mask with this tiktoken encoding."),
    ] = None,
) -> None:
    """Write recorded calls as training rows."""
    if fmt is not Format.sft and (tokenizer is not None or encoding is not None):
        usage_fail(f"{', '.join(SFT_ONLY)} go with --format sft.", "Drop them, or pass --format sft.")
    check_out_path(out)
    if fmt is Format.sft:
        from polarproxy.errors import PolarproxyError
        from polarproxy.export.sft import run_export_sft

        try:
            summary = run_export_sft(
                _open_for_export(db, json_out),
                out,
                episodes=episode,
                status=status,
                min_reward=min_reward,
                since=since,
                harness=harness,
                model=model_name,
                tokenizer=tokenizer,
                encoding=encoding,
            )
        except PolarproxyError as e:
            fail(e.message, e.hint)
        if json_out:
            print_json(summary)
        else:
            typer.echo(f"wrote {summary['rows']} SFT rows ({summary['calls']} calls) to {out}", err=True)
        return
    from polarproxy.export.writers import get_writer
    from polarproxy.reconstruct import get_strategy
    from polarproxy.store.errors import StoreError

    reconstruct = get_strategy(strategy.value)
    write = get_writer(fmt.value)
    store = _open_for_export(db, json_out)
    try:
        ids = [store.get_episode(e).id for e in episode] if episode else None
    except StoreError as e:
        fail(str(e), "List episodes with `polarproxy ls`.")
    episodes = {e.id: e for e in store.list_episodes(limit=None)}
    rows = reconstruct(store.iter_calls(ids), episodes=episodes, include_failed=include_failed)
    try:
        stats = write(rows, out)
    except ValueError as e:
        fail(str(e), "Pick the episodes to export with --episode.")
    summary = {"out": str(out), "strategy": strategy.value, "format": fmt.value, **stats.summary()}
    if json_out:
        print_json(summary)
    else:
        typer.echo(
            f"wrote {stats.rows} rows ({stats.calls} calls, {stats.trainable_tokens} trainable of "
            f"{stats.total_tokens} tokens; a per-request export holds {stats.per_request_tokens} tokens in "
            f"{stats.calls} rows) to {out}",
            err=True,
        )
