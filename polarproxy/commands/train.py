"""`polarproxy train --data FILE --model DIR --out DIR`: GRPO steps on exported rows, checkpoints in OUT/step-N."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from polarproxy.commands.support import fail, print_json, usage_fail

if TYPE_CHECKING:
    from polarproxy.train.config import TrainConfig
    from polarproxy.train.follow import FollowConfig

_OPTS = "Loss"
_RUN = "Run"
_FOLLOW = "Follow a gateway"


def train_command(
    model: Annotated[Path, typer.Option("--model", help="Model folder to start from (transformers format).")],
    out: Annotated[
        Path, typer.Option("--out", help="Folder for checkpoints (OUT/step-N) and metrics.jsonl.")
    ],
    data: Annotated[
        list[Path] | None,
        typer.Option(
            "--data",
            help="Export file (JSONL or .parquet, from `polarproxy export --advantages grpo`); repeat for more.",
        ),
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="Optimizer steps (default: one pass over the rows).")
    ] = None,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW).")] = 1e-6,
    clip_low: Annotated[
        float, typer.Option(help="Lower clip ε: ratio ≥ 1 - ε.", rich_help_panel=_OPTS)
    ] = 0.2,
    clip_high: Annotated[
        float, typer.Option(help="Upper clip ε: ratio ≤ 1 + ε.", rich_help_panel=_OPTS)
    ] = 0.28,
    dual_clip: Annotated[
        float | None,
        typer.Option(help="Dual clip c > 1: loss ≤ c·|A| for negative advantages.", rich_help_panel=_OPTS),
    ] = None,
    tis_cap: Annotated[
        float | None,
        typer.Option(
            help="Truncated importance sampling: weight tokens by min(π/π_behaviour, CAP).",
            rich_help_panel=_OPTS,
        ),
    ] = None,
    loss_agg: Annotated[
        str,
        typer.Option(help="token-mean | seq-mean-token-mean | episode-token-mean.", rich_help_panel=_OPTS),
    ] = "token-mean",
    importance_level: Annotated[
        str, typer.Option(help="token | sequence (GSPO: exp of the mean log-ratio).", rich_help_panel=_OPTS)
    ] = "token",
    kl_coef: Annotated[
        float, typer.Option(help="k3 KL penalty to the reference (0: none).", rich_help_panel=_OPTS)
    ] = 0.0,
    ref_model: Annotated[
        Path | None,
        typer.Option(help="Reference model for --kl-coef (default: --model).", rich_help_panel=_OPTS),
    ] = None,
    rows_per_step: Annotated[
        int, typer.Option(help="Rows per optimizer step (0: all).", rich_help_panel=_RUN)
    ] = 0,
    token_budget: Annotated[
        int, typer.Option(help="Tokens per packed micro-batch.", rich_help_panel=_RUN)
    ] = 8192,
    logprob_chunk: Annotated[
        int, typer.Option(help="Tokens per lm_head chunk.", rich_help_panel=_RUN)
    ] = 1024,
    warmup_steps: Annotated[int, typer.Option(help="Linear warm-up steps.", rich_help_panel=_RUN)] = 0,
    schedule: Annotated[
        str, typer.Option(help="constant | linear | cosine.", rich_help_panel=_RUN)
    ] = "constant",
    schedule_steps: Annotated[
        int | None,
        typer.Option(help="Decay horizon in global steps (default: the last step).", rich_help_panel=_RUN),
    ] = None,
    min_lr_ratio: Annotated[
        float, typer.Option(help="Decay floor as a share of --lr.", rich_help_panel=_RUN)
    ] = 0.1,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.", rich_help_panel=_RUN)] = 0.0,
    max_grad_norm: Annotated[
        float, typer.Option(help="Gradient clipping norm (0: off).", rich_help_panel=_RUN)
    ] = 1.0,
    gradient_checkpointing: Annotated[
        bool,
        typer.Option(
            "--gradient-checkpointing", help="Recompute activations in backward.", rich_help_panel=_RUN
        ),
    ] = False,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda.", rich_help_panel=_RUN)] = "auto",
    bf16: Annotated[
        bool, typer.Option("--bf16/--no-bf16", help="bf16 autocast on CUDA.", rich_help_panel=_RUN)
    ] = True,
    fused_loss: Annotated[
        str,
        typer.Option(
            help="auto | liger | off: liger-kernel's fused GRPO loss on CUDA.", rich_help_panel=_RUN
        ),
    ] = "auto",
    save_every: Annotated[
        int, typer.Option(help="Checkpoint every N steps (0: at the end).", rich_help_panel=_RUN)
    ] = 0,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the last checkpoint in --out.")
    ] = False,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    sync: Annotated[
        str | None,
        typer.Option(
            "--sync",
            help="Push the new checkpoint to this backend (SGLang's /update_weights_from_disk, or "
            "`polarproxy backend`'s) once trained.",
        ),
    ] = None,
    sync_kind: Annotated[
        str, typer.Option("--sync-kind", help="sglang | local | vllm: what serves --sync.")
    ] = "sglang",
    sync_pause: Annotated[
        str | None,
        typer.Option(
            "--sync-pause",
            help="abort | in_place | retract: pause generation around the update (default: none; the update "
            "itself waits for calls in flight).",
        ),
    ] = None,
    sync_timeout: Annotated[
        float, typer.Option("--sync-timeout", help="Seconds each sync request may take.")
    ] = 600.0,
    follow: Annotated[
        str | None,
        typer.Option(
            "--follow",
            help="Instead of --data: train on whole groups from this running `polarproxy serve`'s trajectory "
            "stream as they land, until Ctrl-C (or --steps).",
            rich_help_panel=_FOLLOW,
        ),
    ] = None,
    control_token: Annotated[
        str | None,
        typer.Option(
            "--control-token",
            envvar="POLARPROXY_CONTROL_TOKEN",
            help="The control token of --follow's gateway (never printed).",
            rich_help_panel=_FOLLOW,
        ),
    ] = None,
    max_staleness: Annotated[
        int | None,
        typer.Option(
            "--max-staleness",
            help="With --follow: drop (and count) rows more than K weight versions older than the trainer's "
            "(default 1).",
            rich_help_panel=_FOLLOW,
        ),
    ] = None,
    strategy: Annotated[
        str | None,
        typer.Option(
            help="With --follow: per-request (default) | prefix-merge rows.", rich_help_panel=_FOLLOW
        ),
    ] = None,
    advantages: Annotated[
        str | None,
        typer.Option(
            help="With --follow: grpo (default) | rloo, computed by the gateway.", rich_help_panel=_FOLLOW
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Train a model with GRPO on exported rows (or, with --follow, on a gateway's stream); write checkpoints
    and metrics."""
    from polarproxy.train.config import TrainConfig

    cfg = TrainConfig(
        steps=steps,
        lr=lr,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        warmup_steps=warmup_steps,
        schedule=schedule,
        schedule_steps=schedule_steps,
        min_lr_ratio=min_lr_ratio,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        tis_cap=tis_cap,
        loss_agg=loss_agg,
        importance_level=importance_level,
        kl_coef=kl_coef,
        ref_model=str(ref_model) if ref_model else None,
        rows_per_step=rows_per_step,
        token_budget=token_budget,
        logprob_chunk=logprob_chunk,
        gradient_checkpointing=gradient_checkpointing,
        device=device,
        bf16=bf16,
        fused_loss=fused_loss,
        save_every=save_every,
        resume=resume,
        seed=seed,
    )
    try:
        cfg.check()
    except ValueError as e:
        usage_fail(str(e), "See `polarproxy train --help`.")
    from polarproxy.train.sync import SYNC_KINDS

    if sync_kind not in SYNC_KINDS:
        usage_fail(
            f"Unknown --sync-kind {sync_kind!r}. Must be one of {', '.join(map(repr, SYNC_KINDS))}.",
            "See `polarproxy train --help`.",
        )
    if (follow is None) == (not data):
        usage_fail(
            "Pass either --data FILE (export files) or --follow URL (a running gateway), not both or neither.",
            "See `polarproxy train --help`.",
        )
    if follow is None and (max_staleness, strategy, advantages) != (None, None, None):
        usage_fail(
            "--max-staleness, --strategy and --advantages go with --follow.", "See `polarproxy train --help`."
        )
    if follow is not None and not control_token:
        usage_fail(
            "--follow needs --control-token (or POLARPROXY_CONTROL_TOKEN).", "See `polarproxy train --help`."
        )
    for path in data or []:
        if not path.is_file():
            fail(
                f"Data file '{path}' does not exist.",
                "Pass files written by `polarproxy export --advantages grpo`.",
            )
    if not (model / "config.json").is_file():
        fail(
            f"'{model}' is not a model folder (no config.json).",
            "Pass a transformers model folder to --model.",
        )

    if follow is not None:
        from polarproxy.train.follow import FollowConfig

        fcfg = FollowConfig(
            url=follow,
            token=control_token,
            max_staleness=1 if max_staleness is None else max_staleness,
            strategy=strategy or "per-request",
            advantages=advantages or "grpo",
            sync_url=sync,
            sync_kind=sync_kind,
            sync_pause=sync_pause,
            sync_timeout=sync_timeout,
            sync_api_key=os.environ.get("POLARPROXY_SYNC_API_KEY"),
        )
        try:
            fcfg.check(cfg)
        except ValueError as e:
            usage_fail(str(e), "See `polarproxy train --help`.")
        _follow(model, out, cfg, fcfg, json_out=json_out)
        return
    assert data is not None
    from polarproxy.train.data import DataError, load_samples
    from polarproxy.train.loop import TrainError, train
    from polarproxy.train.metrics import RichProgress

    try:
        samples = load_samples(data)
    except DataError as e:
        fail(str(e))
    from polarproxy.train.batching import plan_steps

    total = len(plan_steps(samples, cfg.rows_per_step, cfg.steps, seed=cfg.seed))
    try:
        with RichProgress(total) as progress:
            result = train(samples, model, out, cfg, progress=progress.update)
    except (DataError, TrainError) as e:
        fail(str(e))
    synced = None
    if sync is not None:
        from polarproxy.train.sync import SyncError, sync_weights

        try:
            synced = sync_weights(
                sync,
                result.checkpoint,
                result.weight_version,
                kind=sync_kind,  # type: ignore[arg-type]
                timeout=sync_timeout,
                pause_mode=sync_pause,  # type: ignore[arg-type]
                api_key=os.environ.get("POLARPROXY_SYNC_API_KEY"),
            )
        except SyncError as e:
            fail(
                f"Trained, but the backend did not take the checkpoint: {e}",
                f"The checkpoint is in {result.checkpoint}; push it again with --sync once the backend answers.",
            )
    summary = {
        "checkpoint": str(result.checkpoint),
        "synced": None if synced is None else {"url": sync, "weight_version": result.weight_version},
        "weight_version": result.weight_version,
        "step": result.step,
        "steps_run": result.steps_run,
        "metrics": str(out / "metrics.jsonl"),
        "last": result.metrics[-1] if result.metrics else None,
    }
    if json_out:
        print_json(summary)
    else:
        typer.echo(
            f"trained {result.steps_run} step(s) to step {result.step}; checkpoint {result.checkpoint} "
            f"(weight version {result.weight_version})",
            err=True,
        )


def _follow(model: Path, out: Path, cfg: TrainConfig, fcfg: FollowConfig, *, json_out: bool) -> None:
    """`train --follow`: steps as groups land, a line per step on stderr, a summary at Ctrl-C."""
    import threading

    from polarproxy.train.data import DataError
    from polarproxy.train.follow import FollowError, follow, stop_on_signals
    from polarproxy.train.loop import TrainError
    from polarproxy.train.sync import display_url

    def ready() -> None:
        typer.echo(
            f"following {display_url(fcfg.url)} (whole groups, {fcfg.advantages} advantages, "
            f"max staleness {fcfg.max_staleness}); Ctrl-C stops after the step in flight",
            err=True,
        )

    def step(m: dict) -> None:
        synced = f", synced {m['synced_version']}" if m.get("synced_version") else ""
        typer.echo(
            f"step {m['step']}: {m['rows']} rows, loss {m['loss']:.4f}, staleness max {m['staleness_max']}, "
            f"{m['rows_dropped_stale']} stale rows dropped so far{synced}",
            err=True,
        )

    def stopping(_signum: int) -> None:
        typer.echo("stopping after the step in flight ...", err=True)

    stop = threading.Event()
    try:
        with stop_on_signals(stop, stopping):
            result = follow(model, out, cfg, fcfg, stop=stop, progress=step, on_ready=ready)
    except FollowError as e:
        done = e.result
        kept = (
            f" Trained {done.steps} step(s); the last checkpoint is {done.checkpoint}."
            if done and done.checkpoint
            else ""
        )
        fail(str(e), (e.hint or "") + kept)
    except (DataError, TrainError) as e:
        fail(str(e))
    summary = result.summary()
    if json_out:
        print_json(summary)
    else:
        typer.echo(
            f"trained {result.steps} step(s) to step {result.step} on {result.rows_trained} rows; "
            f"{result.rows_dropped_stale} stale rows dropped, {result.rows_pending} pending; checkpoint "
            f"{result.checkpoint} (weight version {result.weight_version})",
            err=True,
        )
