"""What every backend client does on the wire: POST JSON, map HTTP failures to BackendError, read errors.

Error bodies come in three shapes and all are read: SGLang's `{"error": {"message": ...}}`, the
OpenAI/vLLM ErrorResponse `{"error": {"message", "type", "param", "code"}}` (SGLang's validation errors
put the same fields at the top level), and plain text (a bare 500).
"""

from __future__ import annotations

from array import array
from typing import Any

import orjson

from polarproxy.backends.base import BackendError
from polarproxy.backends.http11 import HTTPClient, HTTPError, Response

JSON = {"content-type": "application/json"}


def _json_default(value: Any) -> Any:
    """orjson's fallback: an int32 `array('i')` of token IDs (a prompt, render/prefix.py) is written through a
    numpy view of its buffer, as fast as the bytes, no Python int per ID; the text is the list's."""
    if isinstance(value, array) and value.typecode == "i":
        import numpy as np

        return np.frombuffer(value, dtype=np.int32)
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def error_message(body: bytes) -> str:
    """The human-readable part of an error body."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)
        return str(err)
    return str(data)[:500]


def status_error(url: str, path: str, status: int, body: bytes) -> BackendError:
    """A non-200 answer: 4xx means the request was refused (the harness gets a 400), else the backend failed."""
    rejected = 400 <= status < 500
    return BackendError(
        f"Backend {url}{path} answered {status}: {error_message(body)}",
        kind="backend_rejected" if rejected else "backend_error",
        status=400 if rejected else (503 if status == 503 else 502),
    )


def unreachable(url: str, e: HTTPError) -> BackendError:
    if e.connect:
        return BackendError(f"Backend {url} is unreachable: {e}", kind="backend_unreachable", status=503)
    return BackendError(f"Backend {url} failed: {e}")


async def post_json(http: HTTPClient, url: str, path: str, payload: dict[str, Any]) -> Response:
    """POST `payload`; returns the open 200 response (the caller reads and closes it) or raises BackendError."""
    try:
        body = orjson.dumps(payload, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)
        response = await http.request("POST", path, body, JSON)
    except HTTPError as e:
        raise unreachable(url, e) from e
    if response.status != 200:
        try:
            body = await response.read()
        except HTTPError:
            body = b""
        finally:
            await response.close()
        raise status_error(url, path, response.status, body)
    return response


async def get(http: HTTPClient, url: str, path: str) -> tuple[int, bytes]:
    """GET `path`: (status, body). An unreachable backend raises BackendError."""
    try:
        r = await http.request("GET", path)
        try:
            return r.status, await r.read()
        finally:
            await r.close()
    except HTTPError as e:
        kind = "backend_unreachable" if e.connect else "backend_error"
        raise BackendError(f"Backend {url} is unreachable: {e}", kind=kind, status=503) from e


def disconnected(url: str, e: HTTPError) -> BackendError:
    return BackendError(f"Backend {url} dropped the connection mid-answer: {e}", kind="backend_disconnected")


async def check_health(http: HTTPClient, url: str) -> None:
    """`/health` must answer 200 (vLLM, SGLang): else a BackendError naming the status."""
    status, _ = await get(http, url, "/health")
    if status != 200:
        raise BackendError(f"Backend {url}/health answered {status}.", status=503)


async def first_served_model(http: HTTPClient, url: str) -> str:
    """The first model an OpenAI-compatible server lists at `/v1/models`."""
    status, body = await get(http, url, "/v1/models")
    data = orjson.loads(body).get("data") if status == 200 else None
    if not data:
        raise BackendError(f"Backend {url}/v1/models answered {status} without a model.", status=503)
    return str(data[0]["id"])
