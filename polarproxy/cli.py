"""The `polarproxy` command line. Parse, call the library, render with rich: no SQL, no wire parsing."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from polarproxy import __version__

app = typer.Typer(
    pretty_exceptions_show_locals=False,
    no_args_is_help=True,
    add_completion=False,
    help="Record the exact tokens a model saw and sampled inside unmodified agent harnesses.",
)

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", envvar="POLARPROXY_DB", help="SQLite path or database URL (default: the user data dir)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend", envvar="POLARPROXY_BACKEND", help="Backend URL (SGLang, vLLM or `polarproxy backend`)."
    ),
]


class BackendKind(StrEnum):
    sglang = "sglang"
    vllm = "vllm"
    local = "local"


class BackendMode(StrEnum):
    tokens = "tokens"
    chat = "chat"


BackendKindOpt = Annotated[
    BackendKind | None,
    typer.Option(
        "--backend-kind",
        envvar="POLARPROXY_BACKEND_KIND",
        help="What serves --backend (default: detected from what it answers).",
    ),
]
BackendModeOpt = Annotated[
    BackendMode,
    typer.Option(
        "--backend-mode",
        envvar="POLARPROXY_BACKEND_MODE",
        help="tokens: polarproxy renders the prompt and sends token IDs; chat: the server applies its own "
        "template to /v1/chat/completions (records are server-rendered; prompts are not prefix-preserving).",
    ),
]
ModelOpt = Annotated[
    Path | None,
    typer.Option("--model", envvar="POLARPROXY_MODEL", help="Model folder (tokenizer + chat template)."),
]


def fail(message: str, hint: str | None = None) -> NoReturn:
    """`Error: <what>` then a hint, exit 1 (DESIGN.md §9)."""
    from rich.console import Console

    err = Console(stderr=True, highlight=False)
    err.print(f"[bold red]Error:[/] {message}", markup=True, soft_wrap=True)
    if hint:
        err.print(hint, style="dim", markup=False, soft_wrap=True)
    raise typer.Exit(1)


def _print_json(data: Any) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def _require(backend: str | None, model: Path | None) -> tuple[str, Path]:
    if not backend:
        fail(
            "No backend given.",
            "Pass --backend URL (or set POLARPROXY_BACKEND), e.g. --backend http://127.0.0.1:30000 "
            "after `polarproxy backend --model DIR --port 30000`.",
        )
    if model is None:
        fail(
            "No model folder given.",
            "Pass --model DIR (or set POLARPROXY_MODEL): the folder with the tokenizer and "
            "chat template the backend serves. `polarproxy tiny-model ./tiny` builds one.",
        )
    return backend, model


def _open_store(db: str | None) -> Any:
    from polarproxy.store.store import Store
    from polarproxy.store.urls import display_url

    try:
        store = Store.open(db)
    except Exception as e:
        from polarproxy.commands.db import backlog_lines, default_backlog

        fail(
            f"Cannot open the store '{display_url(db) if db else 'default'}': {e}",
            "\n".join(
                [
                    *(backlog_lines(db) if db else default_backlog()),
                    "Pass --db PATH to a writable file, or set POLARPROXY_DB.",
                ]
            ),
        )
    from polarproxy.commands.db import recover_on_open

    recover_on_open(store)  # end the episodes of crashed proxies, replay their spools (issue 5)
    return store


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        typer.echo(__version__)
        raise typer.Exit(0)


@app.command("tiny-model")
def tiny_model(
    out: Annotated[Path, typer.Argument(help="Folder to write the model into.")],
    train_steps: Annotated[int | None, typer.Option(help="Training steps (0: random weights).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Build a tiny Qwen3-architecture model, tokenizer and chat template, offline."""
    from rich.progress import Progress

    from polarproxy.tiny import DEFAULT_TRAIN_STEPS, build_tiny_model

    steps = DEFAULT_TRAIN_STEPS if train_steps is None else train_steps
    if steps < 0:
        fail(f"--train-steps {steps} is negative.", "Pass 0 for random weights or a positive step count.")
    t0 = time.perf_counter()
    with Progress(transient=True) as progress:
        task = progress.add_task("training", total=max(steps, 1))

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=max(total, 1))

        path = build_tiny_model(out, train_steps=steps, seed=seed, progress=report)
    typer.echo(f"tiny model in {path} ({time.perf_counter() - t0:.1f} s, {steps} training steps)", err=True)


@app.command()
def backend(
    model: Annotated[Path, typer.Option("--model", help="Model folder to serve.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 30000,
    weight_version: Annotated[
        str, typer.Option(help="Weight version reported with every answer.")
    ] = "default",
    max_new_tokens_limit: Annotated[
        int | None, typer.Option(help="Cap every request's max_new_tokens (finish reason 'length').")
    ] = None,
    script: Annotated[
        Path | None,
        typer.Option(
            help="Answer from this script (YAML/JSON) instead of sampling; logprobs stay the model's."
        ),
    ] = None,
) -> None:
    """Serve a transformers model over SGLang's /generate API (CPU, or GPU when present)."""
    if not model.is_dir():
        fail(f"Model folder '{model}' does not exist.", "Build one with `polarproxy tiny-model ./tiny`.")
    from polarproxy.backends.local.script import Script, ScriptError
    from polarproxy.backends.local.server import serve

    loaded = None
    if script is not None:
        try:
            loaded = Script.load(script)
        except ScriptError as e:
            fail(str(e), "See `polarproxy backend --help` and docs/usage.md for the script format.")

    def ready(bound: int) -> None:
        typer.echo(f"polarproxy backend: serving {model} on http://{host}:{bound}", err=True)

    try:
        serve(
            model,
            host,
            port,
            weight_version=weight_version,
            max_new_tokens_limit=max_new_tokens_limit,
            ready=ready,
            script=loaded,
        )
    except OSError as e:
        fail(
            f"Cannot listen on {host}:{port}: {e.strerror}.", "Pick another --port, or stop what is using it."
        )
    except KeyboardInterrupt:
        pass


def _proxy_config(
    backend: str | None,
    model: Path | None,
    db: str | None,
    port: int,
    max_tokens: int,
    harness: str | None,
    task: str | None,
    group: str | None,
) -> Any:
    from polarproxy.capture.runner import ProxyConfig

    url, folder = _require(backend, model)
    return ProxyConfig(
        backend=url,
        model=folder.resolve(),
        db=db,
        port=port,
        max_tokens_default=max_tokens,
        harness=harness,
        task=task,
        group_id=group,
        metadata={"model_dir": str(folder.resolve())},
    )


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def record(
    command: Annotated[list[str] | None, typer.Argument(help="The harness command, after --.")] = None,
    backend: BackendOpt = None,
    backend_kind: BackendKindOpt = None,
    backend_mode: BackendModeOpt = BackendMode.tokens,
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
    task: Annotated[str | None, typer.Option(help="Task name stored with the episode.")] = None,
    group: Annotated[str | None, typer.Option(help="Group ID (several samples of one task).")] = None,
    max_tokens: Annotated[int, typer.Option(help="max_new_tokens when a request sets none.")] = 4096,
    json_out: JsonOpt = False,
    intercept: Annotated[
        bool,
        typer.Option(
            "--intercept",
            help="Keep the harness's real provider and record its traffic through an HTTPS proxy (MITM) "
            "with polarproxy's CA (`polarproxy ca path`); calls are text-fidelity.",
        ),
    ] = False,
    host: Annotated[
        list[str] | None,
        typer.Option("--host", help="With --intercept: also record this host (glob, [:PORT]; repeatable)."),
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
    from polarproxy.capture.presets import get_preset, load_preset_file
    from polarproxy.capture.runner import record as run_record
    from polarproxy.errors import PolarproxyError

    if not command:
        fail(
            "No command to record.",
            "Put the harness command after --, e.g. polarproxy record -- python agent.py",
        )
    if intercept:
        from polarproxy.capture.intercept.command import run_record_intercept

        try:
            rc = run_record_intercept(
                list(command),
                db=db,
                port=port,
                hosts=host or [],
                resolve=resolve or [],
                upstream_ca=upstream_ca,
                harness=harness,
                task=task,
                group=group,
                json_out=json_out,
            )
        except PolarproxyError as e:
            fail(e.message, e.hint)
        raise typer.Exit(rc)
    if host or resolve or upstream_ca is not None:
        fail("--host, --resolve and --upstream-ca go with --intercept.", "Add --intercept, or drop them.")
    preset = None
    try:
        if harness_file is not None:
            preset = load_preset_file(harness_file)
            if harness is not None and harness != preset.name:
                fail(
                    f"--harness {harness} and --harness-file {harness_file} (preset '{preset.name}') disagree.",
                    "Pass one of them.",
                )
        elif harness is not None:
            preset = get_preset(harness)
        elif api is not None:
            fail(
                "--api needs a harness preset.",
                "Pass --harness pi (or another preset with an 'apis' section).",
            )
        chosen_api = preset.choose_api(api) if preset is not None else None
    except PolarproxyError as e:
        fail(e.message, e.hint)
    cfg = _proxy_config(backend, model, db, port, max_tokens, preset.name if preset else None, task, group)
    cfg.backend_kind, cfg.backend_mode = backend_kind and backend_kind.value, backend_mode.value
    if preset is not None:
        cfg.preset, cfg.api, cfg.model_name = preset, chosen_api, model_name
        cfg.metadata["model_name"] = model_name or cfg.model.name
        if chosen_api is not None:
            cfg.metadata["api"] = chosen_api
    try:
        outcome = asyncio.run(run_record(cfg, list(command)))
    except PolarproxyError as e:
        fail(e.message, e.hint)
    from polarproxy.commands.db import open_or_explain

    store = open_or_explain(db)  # None: the database is down; the episode's writes wait in a spool
    if store is None:
        raise typer.Exit(outcome.exit_code)
    episode = store.get_episode(outcome.episode_id)
    calls = store.list_calls(outcome.episode_id)
    counts: dict[str, int] = {}
    for c in calls:
        counts[c.status] = counts.get(c.status, 0) + 1
    if json_out:
        _print_json(
            {
                "episode_id": outcome.episode_id,
                "exit_code": outcome.exit_code,
                "calls": len(calls),
                "statuses": counts,
                "tokens": episode.tokens,
                "db": outcome.db,
            }
        )
    else:
        detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"
        typer.echo(
            f"polarproxy: episode {outcome.episode_id}: {len(calls)} calls ({detail}), {episode.tokens} tokens, "
            f"exit {outcome.exit_code}, store {outcome.db}",
            err=True,
        )
    raise typer.Exit(outcome.exit_code)


@app.command()
def serve(
    backend: BackendOpt = None,
    backend_kind: BackendKindOpt = None,
    backend_mode: BackendModeOpt = BackendMode.tokens,
    model: ModelOpt = None,
    db: DbOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Proxy port.")] = 8000,
    max_tokens: Annotated[int, typer.Option(help="max_new_tokens when a request sets none.")] = 4096,
) -> None:
    """Run the recording proxy until interrupted (episodes from the x-polarproxy-episode header or /e/ID/ paths)."""
    from polarproxy.capture.runner import serve as run_serve
    from polarproxy.errors import PolarproxyError

    cfg = _proxy_config(backend, model, db, port, max_tokens, None, None, None)
    cfg.host = host
    cfg.backend_kind, cfg.backend_mode = backend_kind and backend_kind.value, backend_mode.value

    def ready(url: str, episode_id: str) -> None:
        typer.echo(
            f"polarproxy: recording on {url} (default episode {episode_id}); base URL {url}/v1", err=True
        )

    try:
        asyncio.run(run_serve(cfg, on_ready=ready))
    except PolarproxyError as e:
        fail(e.message, e.hint)


ca_app = typer.Typer(
    no_args_is_help=True, help="The CA that intercept mode signs provider certificates with."
)
app.add_typer(ca_app, name="ca")


@ca_app.command("path")
def ca_path() -> None:
    """Print the CA certificate's path (created on first use)."""
    from polarproxy.capture.intercept.command import ca_path as get_path
    from polarproxy.errors import PolarproxyError

    try:
        typer.echo(get_path())
    except PolarproxyError as e:
        fail(e.message, e.hint)


@ca_app.command("install-hint")
def ca_install_hint() -> None:
    """Show how to make other programs or machines trust the CA."""
    from polarproxy.capture.intercept.command import ca_install_hint as hint
    from polarproxy.errors import PolarproxyError

    try:
        typer.echo(hint())
    except PolarproxyError as e:
        fail(e.message, e.hint)


@app.command("ls")
def list_episodes(
    db: DbOpt = None,
    limit: Annotated[int, typer.Option(help="How many episodes, newest first.")] = 50,
    json_out: JsonOpt = False,
) -> None:
    """List episodes: id, command, exit code, calls, tokens, status, time."""
    from polarproxy.commands.db import backlog_lines
    from polarproxy.views import episode_rows, episodes_table

    store = _open_store(db)
    episodes = store.list_episodes(limit=limit)
    for line in backlog_lines(store.url):  # writes waiting in spools (the database was down)
        typer.echo(line, err=True)
    if json_out:
        _print_json(episode_rows(episodes))
        return
    from rich.console import Console

    Console().print(episodes_table(episodes))


@app.command()
def show(
    episode: Annotated[str, typer.Argument(help="Episode ID (or a unique prefix).")],
    db: DbOpt = None,
    tokens: Annotated[bool, typer.Option("--tokens", help="Show tokens, coloured by loss mask.")] = False,
    model: ModelOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show an episode's calls: messages, token counts, finish reasons, errors."""
    from polarproxy.store.errors import StoreError
    from polarproxy.views import call_rows, render_episode

    store = _open_store(db)
    try:
        ep = store.get_episode(episode)
    except StoreError as e:
        fail(str(e), "List episodes with `polarproxy ls`.")
    calls = store.list_calls(ep.id)
    if json_out:
        from dataclasses import asdict

        _print_json({"episode": asdict(ep), "calls": call_rows(calls, with_tokens=tokens)})
        return
    decode = None
    if tokens:
        folder = model or (Path(ep.metadata["model_dir"]) if ep.metadata.get("model_dir") else None)
        if folder is not None and folder.is_dir():
            from polarproxy.render.renderer import Renderer

            decode = Renderer(folder).token_text
    from rich.console import Console

    render_episode(Console(), ep, calls, show_tokens=tokens, decode=decode)


@app.command()
def export(
    out: Annotated[Path, typer.Option("--out", help="Output file.")],
    strategy: Annotated[
        str,
        typer.Option(
            help="'per-request' (one row per call) or 'prefix-merge' (calls that extend earlier ones share a row)."
        ),
    ] = "per-request",
    fmt: Annotated[
        str,
        typer.Option(
            "--format", help="'jsonl' or 'parquet'; 'sft' for chat messages (schemas/sft-row.v1.json)."
        ),
    ] = "jsonl",
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
        str | None, typer.Option(help="--format sft: only episodes started since (ISO time, or 24h, 7d).")
    ] = None,
    harness: Annotated[str | None, typer.Option(help="--format sft: only episodes of this harness.")] = None,
    model_name: Annotated[
        str | None,
        typer.Option("--model", help="--format sft: only trajectories asking for this model (glob)."),
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
    if fmt == "sft":
        from polarproxy.errors import PolarproxyError
        from polarproxy.export.sft import run_export_sft

        try:
            summary = run_export_sft(
                _open_store(db),
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
            _print_json(summary)
        else:
            typer.echo(f"wrote {summary['rows']} SFT rows ({summary['calls']} calls) to {out}", err=True)
        return
    from polarproxy.export.writers import get_writer
    from polarproxy.reconstruct import get_strategy
    from polarproxy.store.errors import StoreError

    try:
        reconstruct = get_strategy(strategy)
    except ValueError as e:
        fail(str(e), "Use --strategy per-request or --strategy prefix-merge.")
    try:
        write = get_writer(fmt)
    except ValueError as e:
        fail(
            str(e).rstrip(".") + ", or 'sft'.", "Use --format jsonl or --format parquet (sft: chat messages)."
        )

    store = _open_store(db)
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
    summary = {"out": str(out), "strategy": strategy, "format": fmt, **stats.summary()}
    if json_out:
        _print_json(summary)
    else:
        typer.echo(
            f"wrote {stats.rows} rows ({stats.calls} calls, {stats.trainable_tokens} trainable of "
            f"{stats.total_tokens} tokens; a per-request export holds {stats.per_request_tokens} tokens in "
            f"{stats.calls} rows) to {out}",
            err=True,
        )


@app.command()
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

    store = _open_store(db)
    try:
        ids = [store.get_episode(episode).id] if episode else None
        report = audit_store(store, ids, model)
    except StoreError as e:
        fail(str(e), "List episodes with `polarproxy ls`.")
    except PolarproxyError as e:
        fail(e.message, e.hint)
    if json_out:
        _print_json(report.to_dict())
        return
    from rich.console import Console

    from polarproxy.audit.view import print_report

    print_report(Console(), report)


from polarproxy.commands.db import db_app  # noqa: E402  (issue 5: store maintenance)
from polarproxy.commands.delete import prune, rm  # noqa: E402

app.add_typer(db_app, name="db")
app.command("rm")(rm)
app.command("prune")(prune)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()
