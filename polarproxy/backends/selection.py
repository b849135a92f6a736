"""Choose and build the backend client: `--backend URL`, `--backend-kind`, `--backend-mode`.

Kinds: `sglang` (SGLang's native `/generate`), `local` (`polarproxy backend`, the same protocol), `vllm`
(`/v1/completions` with token IDs). When no kind is given it is detected from what the server answers:
`/get_server_info` (SGLang and the local backend; ours says `"backend": "polarproxy-local"`) or
`/get_model_info`, else `/version` together with `/v1/models` (vLLM). Modes: `tokens` (polarproxy renders
the prompt and sends token IDs: T1 and T2 hold) and `chat` (the server applies its own template to
`/v1/chat/completions` and reports the token IDs: records are server-rendered and T2 does not hold).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from polarproxy.backends.base import Backend, BackendError
from polarproxy.backends.http11 import HTTPClient
from polarproxy.backends.wire import get
from polarproxy.choices import BACKEND_KINDS, BACKEND_MODES

log = logging.getLogger("polarproxy.backends")

KINDS = BACKEND_KINDS
MODES = BACKEND_MODES


class SelectionError(ValueError):
    """A kind or mode that does not exist, or a server whose kind cannot be told."""


def check_choice(value: str | None, allowed: tuple[str, ...], option: str) -> str | None:
    if value is None or value in allowed:
        return value
    raise SelectionError(f"Unknown {option} {value!r}. Must be one of {', '.join(repr(a) for a in allowed)}.")


async def _json(http: HTTPClient, url: str, path: str) -> dict | None:
    status, body = await get(http, url, path)
    if status != 200:
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


async def detect_kind(url: str) -> str:
    """What serves `url`. Raises BackendError when nothing answers, SelectionError when it cannot tell."""
    return (await _detect(url))[0]


async def _detect(url: str) -> tuple[str, dict[str, Any] | None]:
    """(kind, the server's /get_server_info when it answers one)."""
    url = url.rstrip("/")
    http = HTTPClient(url, connect_timeout=5.0, read_timeout=30.0)
    try:
        info = await _json(http, url, "/get_server_info")
        if info is not None:
            return ("local" if info.get("backend") == "polarproxy-local" else "sglang"), info
        if await _json(http, url, "/get_model_info") is not None:
            return "sglang", None
        version = await _json(http, url, "/version")
        models = await _json(http, url, "/v1/models")
        if version is not None and "version" in version and models is not None and models.get("data"):
            return "vllm", None
    finally:
        await http.aclose()
    raise SelectionError(
        f"Cannot tell what serves {url}: it answers neither SGLang's /get_server_info nor vLLM's "
        "/version and /v1/models."
    )


_SAME_PROTOCOL = {"sglang": "sglang", "local": "sglang", "vllm": "vllm"}


async def _check_kind(url: str, kind: str) -> dict[str, Any] | None:
    """Refuse a given kind that the server's own answers contradict (`--backend-kind vllm` against SGLang):
    every call would fail later. A server whose kind cannot be told (a gateway in front) is taken at its word.
    Returns the server's /get_server_info, when it answers one."""
    try:
        seen, info = await _detect(url)
    except SelectionError:
        return None
    if _SAME_PROTOCOL[seen] != _SAME_PROTOCOL[kind]:
        raise SelectionError(
            f"--backend-kind {kind} does not match the server at {url.rstrip('/')}: it answers as {seen} "
            f"({'/get_server_info' if seen != 'vllm' else '/version and /v1/models'}).",
        )
    return info


def _cumulative_stream_warning(url: str, info: dict[str, Any] | None) -> str | None:
    """What to tell a user whose SGLang server streams cumulatively (its /get_server_info says
    `incremental_streaming_output: false`), else None. Every event of such a stream repeats the whole answer
    so far, so the proxy's CPU per streamed answer grows with the square of its length (docs/benchmarks-history.md:
    a 4,096-token answer ~1.3 s against ~0.06 s incrementally, on 2 cores)."""
    if info is None or info.get("incremental_streaming_output") is not False:
        return None  # incremental, or a server without the setting: nothing to change
    return (
        f"The SGLang server at {url.rstrip('/')} streams cumulatively (every event repeats the whole answer "
        "so far): each streamed answer costs the proxy CPU that grows with the square of its length. "
        "Start SGLang with --incremental-streaming-output."
    )


def make_backend(url: str, kind: str, mode: str = "tokens") -> Backend:
    """The client for a known kind and mode."""
    check_choice(kind, KINDS, "backend kind")
    check_choice(mode, MODES, "backend mode")
    if mode == "chat" and kind == "local":
        raise SelectionError(
            "The local backend serves /generate only, not /v1/chat/completions: use --backend-mode tokens."
        )
    if mode == "chat":
        from polarproxy.backends.chat import ChatBackend

        return ChatBackend(url, flavor=kind)
    if kind == "vllm":
        from polarproxy.backends.vllm import VLLMBackend

        return VLLMBackend(url)
    from polarproxy.backends.sglang import SGLangBackend

    backend = SGLangBackend(url)
    backend.kind = kind  # 'sglang' or 'local': the same protocol, recorded as what it is
    return backend


async def open_backend(url: str, kind: str | None = None, mode: str | None = None) -> Backend:
    """Detect the kind when not given, build the client and check the server's health.

    Raises BackendError (nothing answers, or it is unhealthy) or SelectionError (bad choice, unknown server).
    """
    mode = check_choice(mode, MODES, "backend mode") or "tokens"
    kind = check_choice(kind, KINDS, "backend kind")
    if kind is None:
        kind, info = await _detect(url)
    else:
        info = await _check_kind(url, kind)
    backend = make_backend(url, kind, mode)
    try:
        await backend.health()
    except BackendError:
        await backend.aclose()
        raise
    if kind == "sglang" and mode == "tokens" and (warning := _cumulative_stream_warning(url, info)):
        log.warning("%s", warning)
    return backend


__all__ = [
    "KINDS",
    "MODES",
    "SelectionError",
    "check_choice",
    "detect_kind",
    "make_backend",
    "open_backend",
]
