"""`polarproxy rollout TASKS`: G samples of every task as sandboxed, recorded, verified episodes."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from polarproxy.commands.enums import BackendMode, Isolation, RewardFrom, SamplingPolicy
from polarproxy.commands.proxy_options import (
    BackendKindOpt,
    BackendLogprobsOpt,
    BackendModeOpt,
    BackendOpt,
    MaxBodyOpt,
    MaxTokensOpt,
    SamplingPolicyOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    proxy_config,
)
from polarproxy.commands.support import DbOpt, ModelOpt, fail, need, print_json, typed, usage_fail


def rollout(
    tasks: Annotated[
        Path,
        typer.Argument(
            help="The TASKS file (JSONL; schemas/rollout-task.v2.json), or SWE-bench instances (JSONL or "
            "Parquet) with --repos."
        ),
    ],
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="The agent command, after -- (instead of --harness); the instruction is on its stdin."
        ),
    ] = None,
    harness: Annotated[
        list[str] | None,
        typer.Option(
            help="Harness preset whose headless `command` runs each episode. Repeatable: every task x sample "
            "runs under each harness, into one store, in a group per task and harness (compare them with "
            "`polarproxy compare --rollout ID`)."
        ),
    ] = None,
    group_across_harnesses: Annotated[
        bool,
        typer.Option(
            "--group-across-harnesses",
            help="With --harness repeated: one GRPO group per task across the harnesses, not one per harness.",
        ),
    ] = False,
    api: Annotated[str | None, typer.Option(help="Wire format, for presets that speak several.")] = None,
    model_name: Annotated[
        str | None,
        typer.Option(help="Model name the preset tells the harness to use (default: the model folder's)."),
    ] = None,
    samples: Annotated[
        int, typer.Option("--samples", "-G", help="Samples (episodes) per task: one group.")
    ] = 1,
    concurrency: Annotated[int, typer.Option("--concurrency", "-n", help="Harnesses running at once.")] = 4,
    min_samples: Annotated[
        int | None,
        typer.Option(help="Accept a group once K samples are evaluated; the rest are stopped (aborted)."),
    ] = None,
    backend: BackendOpt = None,
    backend_kind: BackendKindOpt = None,
    backend_mode: BackendModeOpt = BackendMode.tokens,
    backend_logprobs: BackendLogprobsOpt = None,
    model: ModelOpt = None,
    db: DbOpt = None,
    max_tokens: MaxTokensOpt = 4096,
    max_body_bytes: MaxBodyOpt = "32M",
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    sampling_policy: SamplingPolicyOpt = SamplingPolicy.harness,
    serve: Annotated[
        str | None,
        typer.Option("--serve", help="A running `polarproxy serve` (its URL) instead of --backend."),
    ] = None,
    control_token: Annotated[
        str | None,
        typer.Option(envvar="POLARPROXY_CONTROL_TOKEN", help="The control token of --serve (never printed)."),
    ] = None,
    isolation: Annotated[
        Isolation | None,
        typer.Option(
            help="Sandbox of each harness, setup and verify command (default: bwrap; where it does not work, "
            "an error: `none` runs the agents unsandboxed only when asked for)."
        ),
    ] = None,
    pass_env: Annotated[
        list[str] | None,
        typer.Option(
            "--pass-env",
            help="Pass this host environment variable to the harness, setup and verify commands (repeatable; "
            "only PATH, locale and terminal variables pass otherwise).",
        ),
    ] = None,
    repos: Annotated[
        Path | None,
        typer.Option(
            "--repos",
            help="A SWE-bench source's repositories: a folder of clones named owner__name (docs/rollout.md).",
        ),
    ] = None,
    harness_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--harness-arg",
            help="Add this argument to the --harness preset's headless command, before the instruction "
            "(repeatable): --harness-arg=--sandbox --harness-arg=workspace-write.",
        ),
    ] = None,
    ro_bind: Annotated[
        list[Path] | None,
        typer.Option(
            "--ro-bind",
            help="Show this host path to the bwrap sandbox, read-only (repeatable): an install the allow-list "
            "does not find.",
        ),
    ] = None,
    max_workspace_bytes: Annotated[
        str,
        typer.Option(help="Most the evaluate stage copies of a workspace (512M, 4G; apparent sizes)."),
    ] = "1G",
    max_procs: Annotated[int, typer.Option(help="Processes an episode may run at once (0: no limit).")] = 512,
    max_memory: Annotated[
        str, typer.Option(help="Memory of all an episode's processes together (8G; 0: no limit).")
    ] = "8G",
    max_file_size: Annotated[
        str, typer.Option(help="Largest file an episode may write (4G; 0: no limit).")
    ] = "4G",
    max_cpu_seconds: Annotated[
        int, typer.Option(help="CPU seconds each of an episode's processes may use (0: no limit).")
    ] = 0,
    image: Annotated[
        str | None, typer.Option(help="Container image, for --isolation docker|apptainer.")
    ] = None,
    reward_from: Annotated[
        RewardFrom,
        typer.Option(help="exit: verify's exit 0 is reward 1.0; stdout: its last line (a number or JSON)."),
    ] = RewardFrom.exit,
    timeout: Annotated[
        float, typer.Option(help="Seconds a harness may run (a task's timeout_s overrides).")
    ] = 1800.0,
    setup_timeout: Annotated[float, typer.Option(help="Seconds each setup command may run.")] = 600.0,
    verify_timeout: Annotated[float, typer.Option(help="Seconds the verify command may run.")] = 600.0,
    rollout_id: Annotated[
        str | None, typer.Option(help="Name of this rollout, stored with its episodes (default: a new one).")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Run only the (task, sample) pairs of --rollout-id not yet finished."),
    ] = False,
    workdir: Annotated[
        Path | None, typer.Option(help="Keep each episode's folder (workspace, HOME, logs) here.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Spread the episodes over a Ray cluster: local:N (N nodes on loopback) or 127.0.0.1:PORT; "
            "a gateway per node, all recording into the PostgreSQL --db.",
        ),
    ] = None,
) -> None:
    """Run every task of TASKS G times through the gateway: prewarm, execute (sandboxed), evaluate, reconstruct."""
    from polarproxy.errors import PolarproxyError
    from polarproxy.rollout.sources import load_source

    if (command is None) == (not harness):
        usage_fail(
            "Give either --harness NAME or an agent command after --.",
            "e.g. polarproxy rollout tasks.jsonl -- python agent.py",
        )
    if samples < 1 or concurrency < 1:
        usage_fail(f"--samples {samples} and --concurrency {concurrency} must be at least 1.")
    if min_samples is not None and not 1 <= min_samples <= samples:
        usage_fail(f"--min-samples {min_samples} must be between 1 and --samples ({samples}).")
    if resume and rollout_id is None:
        usage_fail(
            "--resume needs the --rollout-id of the rollout to resume.",
            "It is printed when a rollout starts.",
        )
    if serve is not None and typed("backend", "model", "db"):
        usage_fail(
            "--serve and --backend/--model/--db exclude each other.", "The running gateway has its own."
        )
    episode_sampling = None  # under --serve the values travel with each episode (its `sampling`)
    if serve is not None and (temperature, top_p, top_k) != (None, None, None):
        from polarproxy.capture.sampling import check_sampling

        try:
            check_sampling(temperature, top_p, top_k)
        except ValueError as e:
            usage_fail(str(e))
        given = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "policy": sampling_policy.value}
        episode_sampling = {k: v for k, v in given.items() if v is not None}
    if serve is not None and typed("backend_logprobs"):
        usage_fail(
            "--backend-logprobs says what the gateway's backend returns; a running serve knows its own.",
            "Start `polarproxy serve` with it, or drop --serve.",
        )
    if serve is not None and not control_token:
        usage_fail("--serve needs --control-token (or POLARPROXY_CONTROL_TOKEN).")
    if ray is not None:
        need("ray", "rollout --ray", "ray")
    ray_target = _ray_target(ray, serve, db)
    if isolation in (Isolation.docker, Isolation.apptainer) and not image:
        usage_fail(f"--isolation {isolation.value} needs --image.")
    from polarproxy.sizes import parse_size

    try:
        workspace_cap = parse_size(max_workspace_bytes)
    except ValueError as e:
        usage_fail(f"--max-workspace-bytes: {e}")
    from polarproxy.rollout.limits import Limits

    try:
        memory_cap, file_cap = parse_size(max_memory), parse_size(max_file_size)
    except ValueError as e:
        usage_fail(f"--max-memory / --max-file-size: {e}")
    if max_procs < 0 or max_cpu_seconds < 0:
        usage_fail(
            f"--max-procs {max_procs} and --max-cpu-seconds {max_cpu_seconds} must be >= 0 (0: no limit)."
        )
    limits = Limits(max_procs or None, memory_cap or None, file_cap or None, max_cpu_seconds or None)
    for name in pass_env or []:
        if not name or "=" in name:
            usage_fail(
                f"--pass-env {name!r} is not a variable name.", "Pass the name alone: --pass-env HF_HOME."
            )
    names: list[str | None] = list(harness) if harness else [None]
    if len(set(names)) != len(names):
        usage_fail(
            f"--harness {', '.join(n for n in names if n)}: a harness is named twice.", "Name each once."
        )
    if group_across_harnesses and len(names) < 2:
        usage_fail("--group-across-harnesses goes with --harness given more than once.", "Drop it.")
    if harness_arg and (command or not harness):
        usage_fail(
            "--harness-arg adds to a --harness preset's command; with -- CMD the command is yours.",
            "Put the argument in the command after --, or pass --harness NAME.",
        )
    for path in ro_bind or []:
        if not path.is_absolute() or not path.exists():
            usage_fail(
                f"--ro-bind {path} is not an existing absolute path.", "Pass one, e.g. --ro-bind /opt/node."
            )
    try:
        task_list = load_source(tasks, repos=repos)
        presets = {name: _preset(name) for name in names}
        apis = {name: p.choose_api(api) if p is not None else None for name, p in presets.items()}
        from polarproxy.rollout.sandbox import get_runner

        runner = get_runner(isolation.value if isolation is not None else None)
    except PolarproxyError as e:
        fail(e.message, e.hint)
    if len(names) > 1 and rollout_id is None:
        from polarproxy.rollout.run import new_rollout_id

        rollout_id = new_rollout_id()  # one rollout, a run per harness

    def run_one(name: str | None) -> tuple[dict[str, Any], bool]:
        """One harness's run: its own gateway and preset, the command's other options."""
        cfg = None
        if serve is None:
            cfg = proxy_config(
                backend,
                model,
                db,
                0,
                max_tokens,
                backend_kind=backend_kind,
                backend_mode=backend_mode,
                backend_logprobs=backend_logprobs,
                harness=name,
                max_body_bytes=max_body_bytes,
                sampling=(temperature, top_p, top_k, sampling_policy),
            )
        try:
            return run_rollout(
                task_list,
                cfg=cfg,
                serve=serve,
                control_token=control_token,
                runner=runner,
                command=_resolved(list(command)) if command else None,
                preset=presets[name],
                api=apis[name],
                model_name=model_name or (cfg.model.name if cfg is not None else "default"),
                samples=samples,
                concurrency=concurrency,
                min_samples=min_samples,
                rollout_id=rollout_id,
                resume=resume,
                workdir=workdir,
                image=image,
                reward_from=reward_from.value,
                timeouts=(setup_timeout, timeout, verify_timeout),
                db=db,
                progress=sys.stderr.isatty(),  # on stderr: --json keeps stdout for the summary
                ray=ray_target,
                sandbox={
                    "pass_env": list(pass_env or []),
                    "harness_args": list(harness_arg or []),
                    "ro_binds": list(ro_bind or []),
                    "max_workspace_bytes": workspace_cap,
                    "limits": limits,
                    "group_by_harness": len(names) > 1 and not group_across_harnesses,
                },
                sampling=episode_sampling,
            )
        except PolarproxyError as e:
            fail(e.message, e.hint)

    runs = []
    for name in names:
        summary, ok = run_one(name)
        runs.append((name, summary, ok))
    summary, ok = runs[0][1], all(r[2] for r in runs)
    if len(runs) > 1:
        summary = _combined(runs)
    if json_out:
        print_json(summary)
    elif len(runs) == 1:
        _print_summary(summary)
    else:
        for name, one, _ok in runs:
            typer.echo(f"harness {name}:", err=True)
            _print_summary(one)
        typer.echo(f"compare them: polarproxy compare --rollout {summary['rollout_id']}", err=True)
    if not ok:
        failed = [e for e in summary["episodes"] if e["state"] == "failed"]
        from polarproxy.printable import printable  # a reason may quote what the agent left (a file name)

        first = "; ".join(f"{e['task']}#{e['sample']}: {printable(str(e['reason']))}" for e in failed[:3])
        typer.echo(
            f"Error: {len(failed)} of {len(summary['episodes'])} episodes failed. First: {first}", err=True
        )
    raise typer.Exit(0 if ok else 1)


def _combined(runs: list[tuple[str | None, dict[str, Any], bool]]) -> dict[str, Any]:
    """One summary of a run per harness: each harness's own, and their episodes together (with `harness`)."""
    states: dict[str, int] = {}
    for _name, one, _ok in runs:
        for state, n in one["states"].items():
            states[state] = states.get(state, 0) + n
    return {
        "rollout_id": runs[0][1]["rollout_id"],
        "harnesses": {name: one for name, one, _ok in runs},
        "states": states,
        "episodes": [{**e, "harness": name} for name, one, _ok in runs for e in one["episodes"]],
    }


def _ray_target(ray: str | None, serve: str | None, db: str | None) -> Any:
    """--ray's target (rollout/ray_runner.py, which imports Ray only when it runs), or a usage error."""
    if ray is None:
        return None
    from polarproxy.errors import UsageError
    from polarproxy.rollout.ray_runner import check_db, parse_target

    if serve is not None:
        usage_fail("--ray and --serve exclude each other.", "Each Ray node starts a gateway of its own.")
    try:
        target = parse_target(ray)
        check_db(db)
    except UsageError as e:
        usage_fail(e.message, e.hint)
    return target


def _resolved(command: list[str]) -> list[str]:
    """The agent command with each path argument that names a file here (`examples/rollout/agent.py`, as
    given from the folder rollout runs in) made absolute: the harness runs in each workspace copy, where a
    relative path would name nothing. A bare name (`agent.py`) stays: it may be the workspace's own."""
    return [
        str(Path(a).resolve()) if "/" in a and not a.startswith(("-", "/")) and Path(a).is_file() else a
        for a in command
    ]


def _preset(harness: str | None) -> Any:
    if harness is None:
        return None
    from polarproxy.harness.presets import get_preset

    return get_preset(harness)


def run_rollout(
    task_list: list[Any],
    *,
    cfg: Any,
    serve: str | None,
    control_token: str | None,
    runner: Any,
    command: list[str] | None,
    preset: Any,
    api: str | None,
    model_name: str,
    samples: int,
    concurrency: int,
    min_samples: int | None,
    rollout_id: str | None,
    resume: bool,
    workdir: Path | None,
    image: str | None,
    reward_from: str,
    timeouts: tuple[float, float, float],
    db: str | None,
    progress: bool,
    ray: Any = None,
    sandbox: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Start (or reach) the gateway, run the plan, return (summary, whether every episode finished)."""
    import tempfile

    from polarproxy.rollout.episodes import ControlEpisodes, LocalGateway
    from polarproxy.rollout.run import Plan, Rollout, new_rollout_id, start_relay, summary
    from polarproxy.rollout.stages import Settings

    rid = rollout_id or new_rollout_id()
    typer.echo(
        f"polarproxy: rollout {rid}: {len(task_list)} tasks x {samples} samples, isolation {runner.name}",
        err=True,
    )
    if ray is not None:
        from polarproxy.rollout.ray_runner import NodeSpec, run_on_ray

        hidden = [t.tests for t in task_list if t.tests is not None]
        template = Settings(  # each node puts its own gateway in `episodes`
            rollout_id=rid,
            episodes=None,  # type: ignore[arg-type]
            runner=runner,
            command=command,
            preset=preset,
            api=api,
            model_name=model_name,
            harness=preset.name if preset is not None else None,
            hidden=hidden + ([workdir.resolve()] if workdir is not None else []),
            image=image,
            reward_from=reward_from,
            setup_timeout_s=timeouts[0],
            execute_timeout_s=timeouts[1],
            verify_timeout_s=timeouts[2],
            **(sandbox or {}),
        )
        spec = NodeSpec(cfg, template, concurrency, workdir=workdir.resolve() if workdir else None)
        bars = _Display(len(task_list) * samples) if progress else None
        try:
            out = run_on_ray(
                task_list,
                target=ray,
                spec=spec,
                db=str(db),
                samples=samples,
                min_samples=min_samples,
                resume=resume,
                on_job=(lambda job, node: [bars.advance(st, job) for st in job.ended]) if bars else None,
            )
        finally:
            if bars is not None:
                bars.close()
        return out, all(e["state"] != "failed" for e in out["episodes"])
    if cfg is not None:
        cfg.metadata["rollout_id"] = rid
        episodes: Any = LocalGateway(cfg)
    else:
        assert serve is not None and control_token is not None
        episodes = ControlEpisodes(serve, control_token, sampling)
        try:
            episodes.check()
        except BaseException:
            episodes.close()
            raise
    hidden = [t.tests for t in task_list if t.tests is not None]
    if db and "://" not in db:  # the store file and its WAL: not the harness's to read
        hidden += [Path(db + suffix).resolve() for suffix in ("", "-wal", "-shm")]
    if workdir is not None:
        hidden.append(workdir.resolve())
    settings = Settings(
        rollout_id=rid,
        episodes=episodes,
        runner=runner,
        command=command,
        preset=preset,
        api=api,
        model_name=model_name,
        harness=preset.name if preset is not None else None,
        hidden=hidden,
        image=image,
        reward_from=reward_from,
        setup_timeout_s=timeouts[0],
        execute_timeout_s=timeouts[1],
        verify_timeout_s=timeouts[2],
        keep=workdir is not None,
        **(sandbox or {}),
    )
    relay_dir = Path(tempfile.mkdtemp(prefix="polarproxy-bridge-"))
    relay = start_relay(settings, relay_dir)
    plan = Plan(task_list, samples, concurrency, min_samples=min_samples, resume=resume, scratch=workdir)
    display = _Display(len(task_list) * samples) if progress else None
    t0 = time.monotonic()
    try:
        jobs = Rollout(plan, settings, on_progress=display.advance if display else None).run()
    finally:
        if display is not None:
            display.close()
        if relay is not None:
            relay.close()
        import shutil

        shutil.rmtree(relay_dir, ignore_errors=True)
        episodes.close()
    result = summary(jobs, settings, wall_s=time.monotonic() - t0)
    return result, all(j.state != "failed" for j in jobs)


class _Display:
    """A rich progress bar per stage, on stderr."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from polarproxy.rollout.stages import STAGES

        self.progress = Progress(
            TextColumn("{task.description:>12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True, emoji=False),
        )
        self.ids = {st: self.progress.add_task(st, total=total) for st in STAGES}
        self.progress.start()

    def advance(self, stage: str, job: Any) -> None:
        self.progress.advance(self.ids[stage])

    def close(self) -> None:
        self.progress.stop()


def _print_summary(s: dict[str, Any]) -> None:
    from polarproxy.printable import printable

    states = ", ".join(f"{n} {k}" for k, n in sorted(s["states"].items()))
    where = f"store {s['db']}" if s["db"] is not None else f"stored by the serve at {s['serve']}"
    typer.echo(f"polarproxy: rollout {s['rollout_id']}: {states} in {s['wall_s']:.1f} s; {where}", err=True)
    for task, t in s["tasks"].items():
        mean = "-" if t["mean_reward"] is None else f"{t['mean_reward']:.3f}"
        typer.echo(f"  {task}: mean reward {mean} over {len(t['rewards'])} ({t['states']})", err=True)
    for e in s["episodes"]:
        if e["state"] == "failed":
            typer.echo(f"  failed {e['task']}#{e['sample']}: {printable(str(e['reason']))}", err=True)
