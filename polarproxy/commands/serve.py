"""`polarproxy serve`: the recording proxy on its own, for many episodes, until interrupted."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import typer

from polarproxy.commands.enums import BackendMode, PrefixPolicy, SamplingPolicy
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
from polarproxy.commands.support import DbOpt, ModelOpt, fail, print_json, usage_fail


def serve(
    backend: BackendOpt = None,
    backend_kind: BackendKindOpt = None,
    backend_mode: BackendModeOpt = BackendMode.tokens,
    backend_logprobs: BackendLogprobsOpt = None,
    model: ModelOpt = None,
    db: DbOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Proxy port (0: any free port).")] = 8000,
    max_tokens: MaxTokensOpt = 4096,
    max_body_bytes: MaxBodyOpt = "32M",
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    sampling_policy: SamplingPolicyOpt = SamplingPolicy.harness,
    prefix_policy: PrefixPolicyOpt = PrefixPolicy.extend,
    tool_format: ToolFormatOpt = None,
    reasoning_format: ReasoningFormatOpt = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON line when ready (url, port, pid) on stdout.")
    ] = False,
    control_token: Annotated[
        str | None,
        typer.Option(
            "--control-token",
            envvar="POLARPROXY_CONTROL_TOKEN",
            show_envvar=True,
            help="Require this token (Authorization: Bearer TOKEN) on the control API (/polarproxy/v1/...), and "
            "an episode's API key on every model call. Default: no token (loopback use; episodes also from the "
            "x-polarproxy-episode header or /e/ID/ paths).",
        ),
    ] = None,
) -> None:
    """Run the recording proxy until interrupted (episodes from the x-polarproxy-episode header or /e/ID/ paths)."""
    from polarproxy.commands.backend import check_port_free
    from polarproxy.control.serve import serve as run_serve
    from polarproxy.errors import PolarproxyError

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
        max_body_bytes=max_body_bytes,
        sampling=(temperature, top_p, top_k, sampling_policy),
    )
    cfg.host = host
    if control_token is not None and not control_token.strip():
        fail(
            "--control-token is empty.",
            "Pass a secret (e.g. `openssl rand -hex 24`), or leave the option out.",
        )
    cfg.control_token = control_token
    from polarproxy.loopback import is_loopback

    if not control_token and not is_loopback(host):
        usage_fail(
            f"--host {host} is not a loopback address, and serve has no --control-token.",
            "Pass --control-token SECRET (or POLARPROXY_CONTROL_TOKEN) to listen beyond loopback, or keep "
            "--host 127.0.0.1.",
        )
    check_port_free(host, port)

    def ready(url: str, episode_id: str) -> None:
        if json_out:
            import sys

            print_json(
                {
                    "url": url,
                    "base_url": url + "/v1",
                    "port": int(url.rsplit(":", 1)[1]),
                    "pid": os.getpid(),
                    "default_episode": episode_id,
                }
            )
            sys.stdout.flush()
        typer.echo(
            f"polarproxy: recording on {url} (default episode {episode_id}); base URL {url}/v1", err=True
        )

    try:
        asyncio.run(run_serve(cfg, on_ready=ready))
    except PolarproxyError as e:
        fail(e.message, e.hint)
