"""`polarproxy train --data FILE --model DIR --out DIR`: GRPO steps on exported rows, checkpoints in OUT/step-N."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polarproxy.commands.support import fail, print_json, usage_fail

_OPTS = "Loss"
_RUN = "Run"


def train_command(
    data: Annotated[
        list[Path],
        typer.Option(
            "--data",
            help="Export file (JSONL or .parquet, from `polarproxy export --advantages grpo`); repeat for more.",
        ),
    ],
    model: Annotated[Path, typer.Option("--model", help="Model folder to start from (transformers format).")],
    out: Annotated[
        Path, typer.Option("--out", help="Folder for checkpoints (OUT/step-N) and metrics.jsonl.")
    ],
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
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Train a model with GRPO on exported rows; write checkpoints and metrics."""
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
    for path in data:
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
            import os

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
