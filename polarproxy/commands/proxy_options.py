"""The options `record` and `serve` share: the backend, what serves it, and the proxy's configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from polarproxy.commands.enums import (
    BackendKind,
    BackendLogprobs,
    BackendMode,
    PrefixPolicy,
    ReasoningFormat,
    SamplingPolicy,
    ToolFormat,
)
from polarproxy.commands.support import fail, usage_fail

BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend", envvar="POLARPROXY_BACKEND", help="Backend URL (SGLang, vLLM or `polarproxy backend`)."
    ),
]


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
BackendLogprobsOpt = Annotated[
    BackendLogprobs | None,
    typer.Option(
        "--backend-logprobs",
        envvar="POLARPROXY_BACKEND_LOGPROBS",
        help="What the backend's logprobs are: scaled, log_softmax(logits / T) (SGLang's and the local "
        "backend's default); raw, log_softmax(logits) (vLLM's default, or SGLang with "
        "SGLANG_RETURN_ORIGINAL_LOGPROB=1). Default: the backend kind's. Recorded per call as its logprob "
        "temperature, which `train` scores at.",
    ),
]
MaxTokensOpt = Annotated[int, typer.Option(help="max_new_tokens when a request sets none.")]
_SAMPLING = "Sampling (the gateway's: sent to the backend, recorded with each call)"
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        help="Sampling temperature sent to the backend (default: the harness's, else 1.0, never the "
        "server's hidden default).",
        rich_help_panel=_SAMPLING,
    ),
]
TopPOpt = Annotated[
    float | None,
    typer.Option(
        "--top-p",
        help="top_p sent to the backend (default: the harness's, else 1.0).",
        rich_help_panel=_SAMPLING,
    ),
]
TopKOpt = Annotated[
    int | None,
    typer.Option(
        "--top-k",
        help="top_k sent to the backend (default: the harness's, else -1: off).",
        rich_help_panel=_SAMPLING,
    ),
]
SamplingPolicyOpt = Annotated[
    SamplingPolicy,
    typer.Option(
        "--sampling-policy",
        help="harness: a value the harness sends wins and the flags fill what it leaves out; override: the "
        "flags always win.",
        rich_help_panel=_SAMPLING,
    ),
]
MaxBodyOpt = Annotated[
    str,
    typer.Option(
        "--max-body-bytes",
        help="Refuse a request body over this size after decompression (413, before parsing): 32M, 64M.",
    ),
]


PrefixPolicyOpt = Annotated[
    PrefixPolicy,
    typer.Option(
        "--prefix-policy",
        envvar="POLARPROXY_PREFIX_POLICY",
        help="extend: a call that extends an earlier one is prompted with its tokens (T2); fresh: every call "
        "rendered as the chat template does (for templates that rewrite earlier turns, e.g. Mistral's).",
    ),
]


ToolFormatOpt = Annotated[
    ToolFormat | None,
    typer.Option(
        "--tool-format",
        envvar="POLARPROXY_TOOL_FORMAT",
        help="How the model writes tool calls (default: detected from the chat template and tokenizer).",
    ),
]
ReasoningFormatOpt = Annotated[
    ReasoningFormat | None,
    typer.Option(
        "--reasoning-format",
        envvar="POLARPROXY_REASONING_FORMAT",
        help="think: <think>...</think> is reasoning; none: it is text (default: detected from the template).",
    ),
]


def check_backend_url(backend: str) -> str:
    """The backend URL as given, or `Error:` when it is no http(s) URL (`localhost:30000` lacks a scheme)."""
    from urllib.parse import urlsplit

    parts = urlsplit(backend)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(
            f"--backend {backend!r} is not an http(s) URL.",
            f"Write it with its scheme, e.g. --backend http://{backend.split('://')[-1] or '127.0.0.1:30000'}.",
        )
    return backend


def proxy_config(
    backend: str | None,
    model: Path | None,
    db: str | None,
    port: int,
    max_tokens: int,
    *,
    backend_kind: BackendKind | None,
    backend_mode: BackendMode,
    prefix_policy: PrefixPolicy = PrefixPolicy.extend,
    tool_format: ToolFormat | None = None,
    reasoning_format: ReasoningFormat | None = None,
    harness: str | None = None,
    task: str | None = None,
    group: str | None = None,
    max_body_bytes: str = "32M",
    sampling: tuple[float | None, float | None, int | None, Any] = (None, None, None, None),
    backend_logprobs: BackendLogprobs | None = None,
) -> Any:
    """The `ProxyConfig` for these options, or `Error:` naming the option that is missing or wrong (checked
    before the proxy's modules are imported, so a mistake is told at once)."""
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
    backend = check_backend_url(backend)
    from polarproxy.sizes import parse_size

    try:
        body_cap = parse_size(max_body_bytes)
    except ValueError as e:
        usage_fail(f"--max-body-bytes: {e}")
    from polarproxy.capture.stack import ProxyConfig

    cfg = ProxyConfig(
        backend=backend,
        model=model.resolve(),
        db=db,
        port=port,
        max_tokens_default=max_tokens,
        harness=harness,
        task=task,
        group_id=group,
        metadata={"model_dir": str(model.resolve())},
        max_body_bytes=body_cap,
    )
    temperature, top_p, top_k, policy = sampling
    from polarproxy.capture.sampling import check_sampling

    try:
        check_sampling(temperature, top_p, top_k)
    except ValueError as e:
        usage_fail(str(e))
    cfg.temperature, cfg.top_p, cfg.top_k = temperature, top_p, top_k
    cfg.sampling_policy = policy.value if policy is not None else "harness"
    cfg.backend_kind, cfg.backend_mode = backend_kind and backend_kind.value, backend_mode.value
    cfg.backend_logprobs = backend_logprobs and backend_logprobs.value
    cfg.prefix_policy = prefix_policy.value
    cfg.tool_format = tool_format and tool_format.value
    cfg.reasoning_format = reasoning_format and reasoning_format.value
    return cfg
