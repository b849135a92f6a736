"""`polarproxy export`: recorded calls as training rows (token rows for RL, chat messages for SFT)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from polarproxy.commands.enums import Advantages, Format, ScaleRewards, StdEstimator, Strategy
from polarproxy.commands.support import (
    DbOpt,
    JsonOpt,
    NothingRecorded,
    fail,
    nothing_recorded,
    open_store,
    parse_time_option,
    print_json,
    usage_fail,
)

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
        Strategy | None,
        typer.Option(
            help="per-request: one row per call; prefix-merge: calls that extend earlier ones share a row. "
            "Default: per-request for jsonl and parquet, prefix-merge for the trainer formats."
        ),
    ] = None,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            help="jsonl or parquet: token rows; sft: chat messages (schemas/sft-row.v1.json); slime, verl, "
            "trl, nemo-rl, openrlhf: each trainer's own rows (docs/trainers.md).",
        ),
    ] = Format.jsonl,
    episode: Annotated[
        list[str] | None, typer.Option("--episode", help="Only these episodes (repeatable).")
    ] = None,
    include_failed: Annotated[bool, typer.Option(help="Also export failed and aborted calls.")] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
    status: Annotated[str | None, typer.Option(help="Only episodes with this status (ok).")] = None,
    min_reward: Annotated[float | None, typer.Option(help="Only episodes with reward >= this.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Only episodes started since (ISO time, or an age: 24h, 7d).")
    ] = None,
    harness: Annotated[
        list[str] | None, typer.Option(help="Only episodes of this harness (repeatable: any of them).")
    ] = None,
    model_name: Annotated[
        str | None, typer.Option("--model-name", help="Only calls asking for this model name (glob).")
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
    task: Annotated[str | None, typer.Option(help="Only episodes of this task.")] = None,
    group: Annotated[str | None, typer.Option(help="Only episodes of this group.")] = None,
    advantages: Annotated[
        Advantages | None,
        typer.Option(
            help="Add each row's advantage from its group's episode rewards: grpo (r - mean) / (std + 1e-6), "
            "rloo (r - mean of the others), none. Episodes without a reward, and groups whose rewards are "
            "all equal, are left out and counted (docs/usage.md). Default: none for jsonl and parquet, "
            "grpo for the trainer formats."
        ),
    ] = None,
    scale_rewards: Annotated[
        ScaleRewards | None,
        typer.Option(
            help="--advantages grpo: the std to divide by: group (the default), batch (over the export), "
            "none (no division: Dr. GRPO)."
        ),
    ] = None,
    std_estimator: Annotated[
        StdEstimator,
        typer.Option(
            help="--advantages grpo: sample (n - 1, as verl, slime and TRL) or population (n) standard "
            "deviation."
        ),
    ] = StdEstimator.sample,
    failed_as_zero: Annotated[
        bool,
        typer.Option(
            help="Keep episodes that failed outside the agent's control (the harness never reached the model, "
            "the proxy died) in their groups with reward 0.0, as before 2026-12-06; by default they leave "
            "their groups and are counted as excluded_failed."
        ),
    ] = False,
    keep_zero_variance: Annotated[
        bool,
        typer.Option(
            help="Keep groups whose rewards are all equal (advantage 0.0) instead of dropping them."
        ),
    ] = False,
    follow: Annotated[
        str | None,
        typer.Option(
            "--follow",
            help="Write a `serve` gateway's trajectory stream (whole groups, advantages computed there) as "
            "files in the folder --out while rollouts run, until Ctrl-C (docs/trainers.md).",
        ),
    ] = None,
    control_token: Annotated[
        str | None,
        typer.Option(
            "--control-token",
            envvar="POLARPROXY_CONTROL_TOKEN",
            help="The control token of --follow's gateway (never printed).",
        ),
    ] = None,
    groups_per_file: Annotated[
        int | None,
        typer.Option(
            help="--format slime with an --out holding {rollout_id}: groups per step file (default 1)."
        ),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(
            min=1,
            help="Token formats: write from this many processes (Linux), the same rows in the same order "
            "in one file. Small exports run as one.",
        ),
    ] = 1,
) -> None:
    """Write recorded calls as training rows."""
    from polarproxy.errors import PolarproxyError
    from polarproxy.export.advantages import AdvantageOptions
    from polarproxy.export.filters import ExportFilters
    from polarproxy.export.run import OptionError, check_options, default_estimator, run_export

    adv = AdvantageOptions(
        advantages.value if advantages is not None else default_estimator(fmt.value),
        scale_rewards.value if scale_rewards else None,
        keep_zero_variance,
        std_estimator=std_estimator.value,
        failed_as_zero=failed_as_zero,
    )
    options = {
        "strategy": strategy.value if strategy else None,
        "include_failed": include_failed,
        "tokenizer": tokenizer,
        "encoding": encoding,
        "advantages": adv,
    }
    try:
        check_options(fmt.value, **options)  # type: ignore[arg-type]
        filters = ExportFilters(
            status=status,
            min_reward=min_reward,
            since=parse_time_option("--since", since) if since is not None else None,
            harness=(harness[0] if len(harness) == 1 else tuple(harness)) if harness else None,
            model_name=model_name,
            task=task,
            group=group,
        )
    except OptionError as e:
        usage_fail(e.message, e.hint)
    except PolarproxyError as e:
        usage_fail(e.message, e.hint)
    if follow is not None:
        store_only = {
            "--db": db,
            "--episode": episode,
            "--include-failed": include_failed,
            "--status": status,
            "--min-reward": min_reward,
            "--since": since,
            "--harness": harness,
            "--model-name": model_name,
            "--task": task,
            "--group": group,
            "--scale-rewards": scale_rewards,
            "--keep-zero-variance": keep_zero_variance,
            "--failed-as-zero": failed_as_zero,
            "--jobs": jobs if jobs > 1 else None,
        }
        given = [flag for flag, value in store_only.items() if value not in (None, False, [])]
        if given:
            usage_fail(
                f"{', '.join(given)} read the store; --follow reads a gateway's trajectory stream.",
                "Drop them, or export from the store without --follow.",
            )
        _follow(follow, control_token, out, fmt.value, options, adv, groups_per_file, json_out)
        return
    check_out_path(out)
    store = _open_for_export(db, json_out)
    from polarproxy.export.parallel import ExportJobError
    from polarproxy.export.trainer_rows import TrainerRowError

    try:
        summary = run_export(
            store,
            out,
            fmt=fmt.value,
            filters=filters,
            episodes=episode,
            jobs=jobs,
            groups_per_file=groups_per_file,
            **options,  # type: ignore[arg-type]
        )
    except OptionError as e:
        usage_fail(e.message, e.hint)
    except PolarproxyError as e:
        fail(e.message, e.hint)
    except TrainerRowError as e:
        fail(f"{e} {out} was left as it was.")
    except ExportJobError as e:
        fail(f"{e} {out} was left as it was.", "Run it again with --jobs 1 to export in this process alone.")
    except ValueError as e:
        fail(str(e), "Pick the episodes to export with --episode.")
    if json_out:
        print_json(summary)
    elif fmt is Format.sft:
        typer.echo(f"wrote {summary['rows']} SFT rows ({summary['calls']} calls) to {out}", err=True)
    else:
        line = (
            f"wrote {summary['rows']} rows ({summary['calls']} calls, {summary['trainable_tokens']} trainable of "
            f"{summary['total_tokens']} tokens; a per-request export holds {summary['per_request_tokens']} "
            f"tokens in {summary['calls']} rows) to {out}"
        )
        skipped = summary.get("skipped_empty_rows")
        if skipped:
            line += f"; skipped {skipped} row{'s' if skipped != 1 else ''} without tokens (text-only calls)"
        adv_summary = summary.get("advantages")
        if adv_summary:
            line += (
                f"; {adv_summary['estimator']} advantages over {adv_summary['groups']} groups: "
                f"{adv_summary['zero_variance_groups']} with equal rewards "
                f"{'kept' if adv_summary['zero_variance_kept'] else 'dropped'}, "
                f"{adv_summary['episodes_without_reward']} episodes without a reward left out, "
                f"{adv_summary['rows_dropped']} rows dropped"
            )
        typer.echo(line, err=True)


def _follow(
    url: str,
    token: str | None,
    out: Path,
    fmt: str,
    options: dict[str, Any],
    adv: Any,
    groups_per_file: int | None,
    json_out: bool,
) -> None:
    """`export --follow URL`: the stream's answers as files in the folder `out` until Ctrl-C."""
    import threading

    from polarproxy.errors import UsageError
    from polarproxy.export.follow import ExportFollowConfig, follow_export
    from polarproxy.export.pull import StreamError, stop_on_signals
    from polarproxy.export.run import default_strategy
    from polarproxy.export.trainer_rows import TrainerRowError

    if out.exists() and not out.is_dir():
        usage_fail(
            f"--out '{out}' is a file; --follow writes a folder of files.",
            "Pass a folder, e.g. --out rollouts/.",
        )
    if groups_per_file is not None and (fmt != "slime" or groups_per_file < 1):
        usage_fail(
            "--groups-per-file takes 1 or more, with --format slime.", "Drop it, or pass --format slime."
        )
    if adv.estimator == "none":
        usage_fail(
            "--follow pulls whole groups with their advantages; --advantages none has none to pull.",
            "Pass --advantages grpo or rloo (grpo is the default).",
        )
    cfg = ExportFollowConfig(
        url=url,
        out=out,
        fmt=fmt,
        token=token,
        strategy=options["strategy"] or default_strategy(fmt),
        advantages=adv.estimator,
        std_estimator=adv.std_estimator,
        groups_per_file=groups_per_file or 1,
    )
    stop = threading.Event()

    def written(files: list[str], _stats: Any) -> None:
        if not json_out:
            for f in files:
                typer.echo(f"wrote {f}", err=True)

    try:
        with stop_on_signals(stop):
            result = follow_export(cfg, stop, written)
    except StreamError as e:
        fail(str(e), e.hint)
    except UsageError as e:
        usage_fail(e.message, e.hint)
    except TrainerRowError as e:
        fail(f"{e} The stream's cursor stays before these rows.")
    if json_out:
        print_json({"out": str(out), "format": fmt, "strategy": cfg.strategy, **result.summary()})
    else:
        typer.echo(f"stopped: {len(result.files)} file(s), {result.stats.rows} rows in {out}", err=True)
