"""`polarproxy record -- CMD`: run a harness command as one recorded episode (gateway or intercept mode)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from polarproxy.commands.enums import BackendMode, PrefixPolicy, RewardFrom, SamplingPolicy
from polarproxy.commands.proxy_options import (
    BackendKindOpt,
    BackendLogprobsOpt,
    BackendModeOpt,
    BackendOpt,
    MaxBodyOpt,
    MaxTokensOpt,
    PrefixPolicyOpt,
    ReasoningFormatOpt,
    SamplingPolicyOpt,
    TemperatureOpt,
    ToolFormatOpt,
    TopKOpt,
    TopPOpt,
    proxy_config,
)
from polarproxy.commands.support import (
    FAST_EXIT,
    DbOpt,
    ModelOpt,
    fail,
    open_or_explain,
    plain_text,
    usage_fail,
)

JsonSummaryOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print the summary as JSON on stderr once the harness has exited (its stdout is its own).",
    ),
]
JsonOutOpt = Annotated[
    Path | None, typer.Option("--json-out", help="Write the summary as JSON to this file.")
]


def summarize(outcome: Any, db: str | None, *, mode: str, json_out: bool, json_file: Path | None) -> None:
    """The summary of a recorded episode, printed once the harness has exited: one line on stderr, or
    JSON on stderr (`--json`), and JSON in a file (`--json-out`)."""
    import orjson

    store = open_or_explain(db)  # None: the database is down; the episode's writes wait in a spool
    if store is None:
        return
    from polarproxy.store.errors import StoreError

    try:
        episode = store.get_episode(outcome.episode_id)
        counts = store.call_statuses(outcome.episode_id)  # counted in the store: no call's tokens rebuilt
    except StoreError as e:  # the database stopped taking writes mid-run: they wait in a spool
        typer.echo(
            plain_text(
                f"polarproxy: episode {outcome.episode_id} is not in the store yet ({e}); its calls wait in a "
                "spool (named above) until the database takes writes: run `polarproxy db repair` then"
            ),
            err=True,
        )
        return
    finally:
        store.close()
    summary = {
        "episode_id": outcome.episode_id,
        "exit_code": outcome.exit_code,
        "mode": mode,
        "calls": sum(counts.values()),
        "statuses": counts,
        "tokens": episode.tokens,
        "reward": episode.reward,
        "db": outcome.db,
    }
    verified = getattr(outcome, "reward", None)  # the verifier's result (`--reward-cmd`)
    if verified is not None:
        summary["reward_note"] = verified.note
    if getattr(outcome, "reward_error", None):
        summary["reward_error"] = outcome.reward_error
        typer.echo(f"polarproxy: {plain_text(outcome.reward_error)}", err=True)
    from polarproxy.printable import json_printable  # a verifier's note and error are the agent's text

    text = json_printable(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode()) + "\n"
    if json_file is not None:
        try:
            json_file.write_text(text)
        except OSError as e:
            typer.echo(f"polarproxy: cannot write --json-out {json_file}: {e.strerror}", err=True)
    if json_out:
        typer.echo(text, err=True, nl=False)
        return
    detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"
    what = "provider calls" if mode == "intercept" else "calls"
    reward = f", reward {episode.reward:g}" if episode.reward is not None else ""
    if verified is not None:
        reward += f" ({verified.note})"
    typer.echo(
        f"polarproxy: episode {outcome.episode_id}{' (intercept)' if mode == 'intercept' else ''}: "
        f"{summary['calls']} {what} ({detail}), {episode.tokens} tokens{reward}, exit {outcome.exit_code}, "
        f"store {outcome.db}",
        err=True,
    )


def record(
    command: Annotated[list[str] | None, typer.Argument(help="The harness command, after --.")] = None,
    backend: BackendOpt = None,
    backend_kind: BackendKindOpt = None,
    backend_mode: BackendModeOpt = BackendMode.tokens,
    backend_logprobs: BackendLogprobsOpt = None,
    model: ModelOpt = None,
    db: DbOpt = None,
    port: Annotated[int, typer.Option(help="Proxy port (0: any free port).")] = 0,
    harness: Annotated[
        str | None,
        typer.Option(
            help="Harness preset (codex, claude, qwen, gemini, opencode, pi, aider): the environment and a "
            "throwaway config home that point it at the proxy. Stored with the episode."
        ),
    ] = None,
    harness_file: Annotated[
        Path | None, typer.Option(help="A preset of your own (YAML; see docs/usage.md) instead of --harness.")
    ] = None,
    api: Annotated[
        str | None,
        typer.Option(
            help="Wire format, for presets that speak several (pi: chat, responses, anthropic, gemini)."
        ),
    ] = None,
    model_name: Annotated[
        str | None,
        typer.Option(
            help="Model name the preset tells the harness to use (default: the model folder's name)."
        ),
    ] = None,
    task: Annotated[str | None, typer.Option(help="Task ID stored with the episode.")] = None,
    group: Annotated[str | None, typer.Option(help="Group ID (several samples of one task).")] = None,
    reward_cmd: Annotated[
        str | None,
        typer.Option(
            help="Verifier shell command run after the harness, in its folder and environment, with "
            "POLARPROXY_EPISODE and POLARPROXY_EXIT_CODE set; its result is the episode's reward."
        ),
    ] = None,
    reward_from: Annotated[
        RewardFrom,
        typer.Option(
            help="exit: exit 0 is reward 1.0, else 0.0; stdout: the last line is a number or "
            'JSON {"reward": x, "calls": {"N": y}}.'
        ),
    ] = RewardFrom.exit,
    reward_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds the verifier may run; then its process group is killed and the reward is 0.0."
        ),
    ] = 600.0,
    max_tokens: MaxTokensOpt = 4096,
    max_body_bytes: MaxBodyOpt = "32M",
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    sampling_policy: SamplingPolicyOpt = SamplingPolicy.harness,
    prefix_policy: PrefixPolicyOpt = PrefixPolicy.extend,
    tool_format: ToolFormatOpt = None,
    reasoning_format: ReasoningFormatOpt = None,
    json_out: JsonSummaryOpt = False,
    json_file: JsonOutOpt = None,
    intercept: Annotated[
        bool,
        typer.Option(
            "--intercept",
            help="Keep the harness's real provider and record its traffic through an HTTPS proxy (MITM) "
            "with polarproxy's CA (`polarproxy ca path`); calls are text-fidelity.",
        ),
    ] = False,
    intercept_host: Annotated[
        list[str] | None,
        typer.Option(
            "--intercept-host", help="With --intercept: also record this host (glob, [:PORT]; repeatable)."
        ),
    ] = None,
    resolve: Annotated[
        list[str] | None,
        typer.Option(
            "--resolve", help="With --intercept: dial HOST at ADDR:PORT (HOST=ADDR:PORT; repeatable)."
        ),
    ] = None,
    upstream_ca: Annotated[
        Path | None,
        typer.Option("--upstream-ca", help="With --intercept: trust this CA (PEM) for upstream servers."),
    ] = None,
) -> None:
    """Run a harness command as one recorded episode; exits with the command's exit code."""
    from polarproxy.errors import PolarproxyError

    if not command:
        usage_fail(
            "No command to record.",
            "Put the harness command after --, e.g. polarproxy record -- python agent.py",
        )
    if intercept and (temperature, top_p, top_k) != (None, None, None):
        usage_fail(
            "--temperature, --top-p and --top-k go with gateway mode: in --intercept mode the harness's real "
            "provider samples.",
            "Drop them, or record in gateway mode (--backend URL --model DIR).",
        )
    if intercept:
        _record_intercept(
            list(command),
            db=db,
            port=port,
            hosts=intercept_host or [],
            resolve=resolve or [],
            upstream_ca=upstream_ca,
            harness=harness,
            task=task,
            group=group,
            json_out=json_out,
            json_file=json_file,
            gateway_only=[
                name
                for name, given in (
                    ("--harness-file", harness_file is not None),
                    ("--api", api is not None),
                    ("--model-name", model_name is not None),
                    ("--backend-mode", backend_mode is not BackendMode.tokens),
                    ("--backend-logprobs", backend_logprobs is not None),
                    ("--reward-cmd", reward_cmd is not None),
                )
                if given
            ],
        )
    if intercept_host or resolve or upstream_ca is not None:
        usage_fail(
            "--intercept-host, --resolve and --upstream-ca go with --intercept.",
            "Add --intercept, or drop them.",
        )
    preset = None
    try:
        if harness_file is not None or harness is not None:  # YAML is read only for a preset
            from polarproxy.harness.presets import get_preset, load_preset_file
        if harness_file is not None:
            preset = load_preset_file(harness_file)
            if harness is not None and harness != preset.name:
                usage_fail(
                    f"--harness {harness} and --harness-file {harness_file} (preset '{preset.name}') disagree.",
                    "Pass one of them.",
                )
        elif harness is not None:
            preset = get_preset(harness)
        elif api is not None:
            usage_fail(
                "--api needs a harness preset.",
                "Pass --harness pi (or another preset with an 'apis' section).",
            )
        chosen_api = preset.choose_api(api) if preset is not None else None
    except PolarproxyError as e:
        fail(e.message, e.hint)
    cfg = proxy_config(
        backend,
        model,
        db,
        port,
        max_tokens,
        backend_kind=backend_kind,
        backend_mode=backend_mode,
        backend_logprobs=backend_logprobs,
        prefix_policy=prefix_policy,
        tool_format=tool_format,
        reasoning_format=reasoning_format,
        harness=preset.name if preset else None,
        task=task,
        group=group,
        max_body_bytes=max_body_bytes,
        sampling=(temperature, top_p, top_k, sampling_policy),
    )
    verifier = None
    if reward_cmd is not None:
        from polarproxy.rewards import Verifier

        try:
            verifier = Verifier(reward_cmd, reward_from.value, reward_timeout)  # type: ignore[arg-type]
        except ValueError as e:
            usage_fail(str(e), "See `polarproxy record --help` and docs/usage.md (Rewards).")
    elif reward_from is not RewardFrom.exit or reward_timeout != 600.0:
        usage_fail(
            "--reward-from and --reward-timeout go with --reward-cmd.", "Add --reward-cmd CMD, or drop them."
        )
    from polarproxy.harness.record import HarnessRun

    run = HarnessRun(verifier=verifier)
    if preset is not None:
        run.preset, run.api, run.model_name = preset, chosen_api, model_name
        cfg.metadata["model_name"] = model_name or cfg.model.name
        if chosen_api is not None:
            cfg.metadata["api"] = chosen_api
    _run_gateway(cfg, run, list(command), json_out=json_out, json_file=json_file)


def _run_gateway(cfg: Any, run: Any, command: list[str], *, json_out: bool, json_file: Path | None) -> None:
    from polarproxy.errors import PolarproxyError
    from polarproxy.harness.record import record as run_record

    try:
        outcome = asyncio.run(run_record(cfg, command, run=run))
    except PolarproxyError as e:
        fail(e.message, e.hint)
    summarize(outcome, cfg.db, mode="gateway", json_out=json_out, json_file=json_file)
    FAST_EXIT["on"] = True  # the store is closed and the summary written: no teardown needed
    raise typer.Exit(outcome.exit_code)


def _record_intercept(
    command: list[str],
    *,
    db: str | None,
    port: int,
    hosts: list[str],
    resolve: list[str],
    upstream_ca: Path | None,
    harness: str | None,
    task: str | None,
    group: str | None,
    json_out: bool,
    json_file: Path | None,
    gateway_only: list[str],
) -> None:
    from polarproxy.errors import PolarproxyError
    from polarproxy.harness.intercept.command import run_record_intercept
    from polarproxy.harness.presets import get_preset

    if gateway_only:
        usage_fail(
            f"{', '.join(gateway_only)} do not apply with --intercept (the harness keeps its own provider).",
            "Drop them, or record through the gateway without --intercept.",
        )
    try:
        if harness is not None:
            get_preset(harness)  # --harness always names a known preset
        outcome = run_record_intercept(
            command,
            db=db,
            port=port,
            hosts=hosts,
            resolve=resolve,
            upstream_ca=upstream_ca,
            harness=harness,
            task=task,
            group=group,
        )
    except PolarproxyError as e:
        fail(e.message, e.hint)
    summarize(outcome, db, mode="intercept", json_out=json_out, json_file=json_file)
    FAST_EXIT["on"] = True
    raise typer.Exit(outcome.exit_code)
