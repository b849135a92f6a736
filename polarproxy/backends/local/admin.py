"""SGLang's admin routes over the local backend: weight updates from disk, the weight version, pausing and
continuing generation. Each takes the server and the request's JSON object and returns (status, answer);
the server (backends/local/server.py) checks who may call them and sends the answer.

A weight update loads the new folder while the old weights keep serving, then waits for the generations in
flight to finish and swaps (`gate.py`), so every call's tokens come from one weight version; a folder that
cannot be loaded answers `success: false` and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polarproxy.backends.checkpoint import CheckpointMetaError, read_weight_version
from polarproxy.backends.local.request import RequestError

if TYPE_CHECKING:
    from polarproxy.backends.local.server import LocalBackendServer

log = logging.getLogger("polarproxy.backends.local")

Answer = tuple[int, dict[str, Any]]


def update_weights_from_disk(srv: LocalBackendServer, obj: dict[str, Any]) -> Answer:
    """SGLang's UpdateWeightFromDiskReqInput: `model_path`, optional `weight_version`,
    `abort_all_requests` (default false); `flush_cache`, `load_format` and the rest are accepted (this
    backend keeps no cache). Answers `{success, message, num_paused_requests}`, 400 when it failed."""
    path = obj.get("model_path")
    if not isinstance(path, str) or not path:
        raise RequestError(
            "model_path must be a non-empty string (a model folder written by save_pretrained)."
        )
    version = obj.get("weight_version")
    if version is not None and not isinstance(version, str):
        raise RequestError(f"weight_version must be a string, got {version!r}.")
    with srv.swap_lock:
        try:
            model = srv.runner.load_checkpoint(Path(path))  # the old weights serve meanwhile
            if version is None:
                version = read_weight_version(path)
        except (ValueError, CheckpointMetaError) as e:
            message = f"Failed to update weights: {e}"
            log.warning("weight update from %s failed: %s", path, message)
            return 400, {"success": False, "message": message, "num_paused_requests": 0}
        if obj.get("abort_all_requests") is True:
            srv.gate.abort_all()
        with srv.gate.swap() as drained:  # waits for the generations in flight unless paused
            # paused with generations frozen in place: one of them holds the runner, swap under it
            srv.runner.install_checkpoint(model, path, wait=drained or srv.gate.in_flight == 0)
            if version is not None:
                srv.weight_version = version
    message = "Succeeded to update model weights."
    if version is not None:
        message += f" Weight version updated to {version}."
    log.info("serving weights from %s (weight version %s)", path, srv.weight_version)
    return 200, {"success": True, "message": message, "num_paused_requests": 0}


def update_weight_version(srv: LocalBackendServer, obj: dict[str, Any]) -> Answer:
    version = obj.get("new_version")
    if not isinstance(version, str):
        raise RequestError("new_version must be a string.")
    srv.weight_version = version
    return 200, {"success": True, "message": f"Weight version updated to {version}", "new_version": version}


def pause_generation(srv: LocalBackendServer, obj: dict[str, Any]) -> Answer:
    """SGLang's PauseGenerationReqInput: `mode` is `abort` (default: abort the generations in flight, answer
    once none is left), `in_place` or `retract` (freeze them until continued)."""
    try:
        srv.gate.pause(obj.get("mode", "abort"))
    except ValueError as e:  # a mode the gate does not know (it names the allowed ones)
        raise RequestError(str(e)) from None
    return 200, {"message": "Generation paused successfully.", "status": "ok"}


def continue_generation(srv: LocalBackendServer, obj: dict[str, Any]) -> Answer:
    srv.gate.resume()
    return 200, {"message": "Generation continued successfully.", "status": "ok"}


# route -> its answer (POST or PUT, JSON bodies)
ANSWERS: dict[str, Callable[[LocalBackendServer, dict[str, Any]], Answer]] = {
    "/update_weights_from_disk": update_weights_from_disk,
    "/update_weight_version": update_weight_version,
    "/pause_generation": pause_generation,
    "/continue_generation": continue_generation,
}
