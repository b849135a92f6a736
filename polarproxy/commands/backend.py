"""`polarproxy backend --model DIR`: serve a transformers model over SGLang's /generate API."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from polarproxy.commands.support import fail, need, usage_fail


def check_port_free(host: str, port: int) -> None:
    """`Error:` unless `host:port` can be listened on (checked before anything slow is loaded)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            fail(
                f"Cannot listen on {host}:{port}: {e.strerror}.",
                "Pick another --port, or stop what is using it.",
            )


def check_model_folder(model: Path) -> None:
    if not model.is_dir():
        fail(f"Model folder '{model}' does not exist.", "Build one with `polarproxy tiny-model ./tiny`.")
    if not (model / "config.json").is_file():
        fail(
            f"'{model}' is not a model folder: it has no config.json.",
            "Pass a folder written by save_pretrained (or `polarproxy tiny-model DIR`).",
        )


def backend(
    model: Annotated[Path, typer.Option("--model", help="Model folder to serve.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 30000,
    weight_version: Annotated[
        str, typer.Option(help="Weight version reported with every answer (until a weight update).")
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
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="POLARPROXY_SYNC_API_KEY",
            help="Key the admin routes (weights, pause, cache) require as Authorization: Bearer KEY, as "
            "SGLang's --api-key; `train --sync` sends POLARPROXY_SYNC_API_KEY. Needed beyond loopback.",
        ),
    ] = None,
) -> None:
    """Serve a transformers model over SGLang's /generate API (CPU, or GPU when present)."""
    from polarproxy.loopback import is_loopback

    if not api_key and not is_loopback(host):
        usage_fail(
            f"--host {host} is not a loopback address, and the backend has no --api-key.",
            "Pass --api-key KEY (or POLARPROXY_SYNC_API_KEY) to serve beyond loopback: its admin routes swap "
            "weights. Or keep --host 127.0.0.1.",
        )
    check_model_folder(model)
    need("torch", "backend", "torch")
    from polarproxy.backends.local.script import Script, ScriptError
    from polarproxy.backends.local.server import serve

    loaded = None
    if script is not None:
        try:
            loaded = Script.load(script)
        except ScriptError as e:
            fail(str(e), "See `polarproxy backend --help` and docs/usage.md for the script format.")
    check_port_free(host, port)

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
            api_key=api_key or None,
        )
    except OSError as e:
        fail(
            f"Cannot listen on {host}:{port}: {e.strerror}.", "Pick another --port, or stop what is using it."
        )
    except KeyboardInterrupt:
        pass
    except ModuleNotFoundError as e:  # an optional dependency, not the model folder
        fail(
            f"polarproxy backend needs {e.name}, which is not installed.", "pip install 'polarproxy[torch]'."
        )
    except Exception as e:  # transformers raises many types for a folder it cannot load
        fail(f"Cannot load the model in '{model}': {e}", "Pass a folder written by save_pretrained.")
