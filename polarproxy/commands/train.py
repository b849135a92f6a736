"""`polarproxy train --data FILE --model DIR --out DIR`: GRPO steps on exported rows, checkpoints in OUT/step-N."""

from __future__ import annotations

import dataclasses
import inspect
import os
import typing
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from polarproxy.commands.enums import SOURCES, Advantages, PauseMode, StdEstimator, Strategy, SyncKind
from polarproxy.commands.support import fail, need, print_json, usage_fail

if TYPE_CHECKING:
    from polarproxy.train.config import TrainConfig
    from polarproxy.train.follow import FollowConfig

_FOLLOW = "Follow a gateway"


def _command_params() -> tuple[list[inspect.Parameter], list[inspect.Parameter]]:
    """`train`'s own options (before and after TrainConfig's)."""
    P = inspect.Parameter
    kw = P.KEYWORD_ONLY
    before = [
        P(
            "model",
            kw,
            annotation=Annotated[
                Path, typer.Option("--model", help="Model folder to start from (transformers format).")
            ],
        ),
        P(
            "out",
            kw,
            default=None,
            annotation=Annotated[
                Path | None,
                typer.Option("--out", help="Folder for checkpoints (OUT/step-N) and metrics.jsonl."),
            ],
        ),
        P(
            "plan",
            kw,
            default=False,
            annotation=Annotated[
                bool,
                typer.Option(
                    "--plan",
                    help="Print the run's memory and disk plan (from the model's config.json alone: nothing "
                    "is loaded) and whether it fits --gpu-memory; train nothing.",
                ),
            ],
        ),
        P(
            "gpu_memory",
            kw,
            default=78.0,
            annotation=Annotated[
                float, typer.Option("--gpu-memory", help="GiB the trainer's GPU offers (--plan).")
            ],
        ),
        P(
            "data",
            kw,
            default=None,
            annotation=Annotated[
                list[Path] | None,
                typer.Option(
                    "--data",
                    help="Export file (JSONL or .parquet, from `polarproxy export --advantages grpo`); repeat for "
                    "more.",
                ),
            ],
        ),
    ]
    after = [
        P("sync", kw, default=None, annotation=Annotated[
            str | None,
            typer.Option(
                "--sync",
                help="Push the new checkpoint to this backend (SGLang's /update_weights_from_disk, or "
                "`polarproxy backend`'s) once trained.",
            ),
        ]),
        P("sync_kind", kw, default=SyncKind.sglang, annotation=Annotated[
            SyncKind, typer.Option("--sync-kind", help="What serves --sync.")
        ]),
        P("sync_pause", kw, default=None, annotation=Annotated[
            PauseMode | None,
            typer.Option(
                "--sync-pause",
                help="Pause generation around the update (default: none; the update itself waits for calls "
                "in flight).",
            ),
        ]),
        P("sync_timeout", kw, default=600.0, annotation=Annotated[
            float, typer.Option("--sync-timeout", help="Seconds each sync request may take.")
        ]),
        P("follow", kw, default=None, annotation=Annotated[
            str | None,
            typer.Option(
                "--follow",
                help="Instead of --data: train on whole groups from this running `polarproxy serve`'s "
                "trajectory stream as they land, until Ctrl-C (or --steps).",
                rich_help_panel=_FOLLOW,
            ),
        ]),
        P("control_token", kw, default=None, annotation=Annotated[
            str | None,
            typer.Option(
                "--control-token",
                envvar="POLARPROXY_CONTROL_TOKEN",
                help="The control token of --follow's gateway (never printed).",
                rich_help_panel=_FOLLOW,
            ),
        ]),
        P("max_staleness", kw, default=None, annotation=Annotated[
            int | None,
            typer.Option(
                "--max-staleness",
                help="With --follow: drop (and count) rows more than K weight versions older than the "
                "trainer's (default 1).",
                rich_help_panel=_FOLLOW,
            ),
        ]),
        P("strategy", kw, default=None, annotation=Annotated[
            Strategy | None,
            typer.Option(help="With --follow: the rows' strategy (default per-request).", rich_help_panel=_FOLLOW),
        ]),
        P("advantages", kw, default=None, annotation=Annotated[
            Advantages | None,
            typer.Option(
                help="With --follow: grpo (default) or rloo, computed by the gateway.", rich_help_panel=_FOLLOW
            ),
        ]),
        P("std_estimator", kw, default=None, annotation=Annotated[
            StdEstimator | None,
            typer.Option(
                help="With --follow: GRPO's std at the gateway, sample (default; n - 1, as verl, slime and "
                "TRL) or population (n).",
                rich_help_panel=_FOLLOW,
            ),
        ]),
        P("json_out", kw, default=False, annotation=Annotated[
            bool, typer.Option("--json", help="Print the result as JSON.")
        ]),
    ]  # fmt: skip
    return before, after


def _config_params() -> list[inspect.Parameter]:
    """One option per TrainConfig field that declares help (train/config.py: `option`): its default, help,
    panel, flag and choices come from that declaration alone."""
    from polarproxy.train.config import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    params = []
    for f in dataclasses.fields(TrainConfig):
        meta = f.metadata
        if "help" not in meta:
            continue
        kind: Any = hints[f.name]
        default = f.default
        if meta["choices"] is not None:
            enum = next(e for e, values in SOURCES.items() if values is meta["choices"])
            kind, default = enum, enum(default)
        decls = [meta["flag"]] if meta["flag"] else []
        opt = typer.Option(*decls, help=meta["help"], rich_help_panel=meta["panel"])
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, opt]
            )
        )
    return params


def _signature() -> inspect.Signature:
    before, after = _command_params()
    return inspect.Signature([*before, *_config_params(), *after], return_annotation=None)


def train_command(**options: Any) -> None:
    """Train a model with GRPO on exported rows (or, with --follow, on a gateway's stream); write checkpoints
    and metrics."""
    from polarproxy.train.config import TrainConfig

    need("torch", "train", "torch")
    names = {f.name for f in dataclasses.fields(TrainConfig) if "help" in f.metadata}
    _train(
        TrainConfig(**{k: _plain(v) for k, v in options.items() if k in names}),
        **{k: _plain(v) for k, v in options.items() if k not in names},
    )


train_command.__signature__ = _signature()  # type: ignore[attr-defined]


def _plain(value: Any) -> Any:
    """An enum member as its string (what the library takes); anything else as it is."""
    return value.value if isinstance(value, StrEnum) else value


def _train(
    cfg: TrainConfig,
    *,
    model: Path,
    out: Path | None,
    plan: bool,
    gpu_memory: float,
    data: list[Path] | None,
    sync: str | None,
    sync_kind: str,
    sync_pause: str | None,
    sync_timeout: float,
    follow: str | None,
    control_token: str | None,
    max_staleness: int | None,
    strategy: str | None,
    advantages: str | None,
    std_estimator: str | None,
    json_out: bool,
) -> None:
    try:
        cfg.check()
    except ValueError as e:
        usage_fail(str(e), "See `polarproxy train --help`.")
    if plan:
        _plan(model, cfg, gpu_memory, json_out=json_out)
        return
    if out is None:
        usage_fail("Missing option '--out'.", "Pass --out DIR: the folder for checkpoints and metrics.jsonl.")
    if (follow is None) == (not data):
        usage_fail(
            "Pass either --data FILE (export files) or --follow URL (a running gateway), not both or neither.",
            "See `polarproxy train --help`.",
        )
    if follow is None and (max_staleness, strategy, advantages, std_estimator) != (None, None, None, None):
        usage_fail(
            "--max-staleness, --strategy, --advantages and --std-estimator go with --follow.",
            "See `polarproxy train --help`.",
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
            std_estimator=std_estimator or "sample",
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
        samples = load_samples(
            data,
            warn=lambda message: typer.echo(f"Warning: {message}", err=True),
            assume_temperature=cfg.assume_logprob_temperature,
        )
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
                f"The checkpoint is in {result.checkpoint}; push it again once the backend answers: "
                f"polarproxy sync {result.checkpoint} --backend {sync} --sync-kind {sync_kind}",
            )
    summary = {
        "checkpoint": str(result.checkpoint),
        "synced": None if synced is None else {"url": sync, "weight_version": result.weight_version},
        "weight_version": result.weight_version,
        "step": result.step,
        "steps_run": result.steps_run,
        "metrics": str(out / "metrics.jsonl"),
        "last": result.metrics[-1] if result.metrics else None,
        # rows whose logprob temperature was not recorded (export rows before v3): trained at T = 1 or at
        # --assume-logprob-temperature
        "rows_assumed_temperature": sum(s.temperature_assumed for s in samples),
    }
    if json_out:
        print_json(summary)
    else:
        typer.echo(
            f"trained {result.steps_run} step(s) to step {result.step}; checkpoint {result.checkpoint} "
            f"(weight version {result.weight_version})",
            err=True,
        )


def _plan(model: Path, cfg: TrainConfig, gpu_memory: float, *, json_out: bool) -> None:
    """`train --plan`: the memory and disk plan, from config.json alone."""
    if not (model / "config.json").is_file():
        fail(f"'{model}' has no config.json.", "Pass a model folder (config.json is enough for --plan).")
    from polarproxy.train.plan import memory_plan, model_shape

    try:
        shape = model_shape(model)
    except (OSError, ValueError, KeyError) as e:
        fail(f"Cannot read the model's config in '{model}': {e}")
    device = "cpu" if cfg.device == "cpu" else "cuda"
    p = memory_plan(shape, cfg, device=device, gpu_memory_gib=gpu_memory)
    if json_out:
        print_json(p)
        return
    terms = (
        "weights",
        "gradients",
        "optimizer_state",
        "activations",
        "autocast_weight_copies",
        "reference_model",
    )
    lines = [
        f"plan for {model} on {device}: {p['params']:,} parameters, {p['token_budget']} tokens per micro-batch"
    ]
    lines += [f"  {t.replace('_', ' '):<24}{p[t + '_gib']:>8.2f} GiB" for t in terms if p[t + "_bytes"]]
    verdict = "fits" if p["fits"] else "does NOT fit"
    lines.append(f"  peak{'':<20}{p['peak_gib']:>8.2f} GiB: {verdict} {gpu_memory:g} GiB")
    lines.append(
        f"  checkpoint {p['checkpoint_gib']:.2f} GiB ({p['checkpoint_with_optimizer_gib']:.2f} GiB with the "
        f"optimizer state); sync {p['sync_gib']:.2f} GiB"
    )
    typer.echo("\n".join(lines))


def _follow(model: Path, out: Path, cfg: TrainConfig, fcfg: FollowConfig, *, json_out: bool) -> None:
    """`train --follow`: steps as groups land, a line per step on stderr, a summary at Ctrl-C."""
    import threading

    from polarproxy.export.pull import stop_on_signals
    from polarproxy.redact import without_userinfo
    from polarproxy.train.data import DataError
    from polarproxy.train.follow import FollowError, follow
    from polarproxy.train.loop import TrainError

    def ready() -> None:
        typer.echo(
            f"following {without_userinfo(fcfg.url)} (whole groups, {fcfg.advantages} advantages, "
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
            f"{result.rows_dropped_stale} stale rows dropped, {result.rows_pending} pending, "
            f"{result.excluded_failed} failed episodes left out of their groups (never reached the model); checkpoint "
            f"{result.checkpoint} (weight version {result.weight_version})",
            err=True,
        )
