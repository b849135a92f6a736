"""Bad input through `record --intercept`: the client sees what it would see without polarproxy, and the
call is recorded with the reason."""

from __future__ import annotations

import base64
import json
import ssl
import sys

import httpx
import pytest
from intercept_run import HERE, run_intercept
from requests_plan import CHAT, OPENAI_AUTH
from standin import CHAT_SSE, ERRORS, NOT_JSON

URL = "https://api.openai.com/v1/chat/completions"
STREAM = {**CHAT, "stream": True}
FAULTS = [
    {"name": "drop", "headers": {**OPENAI_AUTH, "x-standin": "drop"}, "json": STREAM},
    {"name": "notjson", "headers": {**OPENAI_AUTH, "x-standin": "notjson"}, "json": CHAT},
    {"name": "error", "headers": {**OPENAI_AUTH, "x-standin": "error"}, "json": CHAT},
]
REJECT = f"""
import ssl, sys, httpx
ctx = ssl.create_default_context(cafile=sys.argv[1])  # trusts the provider's CA only, not polarproxy's
try:
    httpx.post("{URL}", json={{}}, verify=ctx)
except httpx.ConnectError as e:
    print("REJECTED", e)
"""


def direct(standin, item: dict) -> dict:
    """The same request straight to the stand-in (no polarproxy), read the way client.py reads it."""
    got: list[bytes] = []
    res: dict = {}
    with httpx.Client(verify=ssl.create_default_context(cafile=standin.ca.cert), timeout=30) as client:
        try:
            req = client.build_request(
                "POST",
                f"https://127.0.0.1:{standin.port}/v1/chat/completions",
                headers={**item["headers"], "host": "api.openai.com", "content-type": "application/json"},
                content=json.dumps(item["json"]).encode(),
                extensions={"sni_hostname": "api.openai.com"},
            )
            r = client.send(req, stream=True)
            res["status"] = r.status_code
            for chunk in r.iter_raw():
                got.append(chunk)
        except httpx.HTTPError as e:
            res.update(error=type(e).__name__)
    res["body"] = b"".join(got)
    return res


@pytest.fixture(scope="module")
def faults_run(tmp_path_factory, standin, test_ca):
    tmp = tmp_path_factory.mktemp("faults")
    plan = [{**f, "method": "POST", "url": URL} for f in FAULTS]
    (tmp / "plan.json").write_text(json.dumps(plan))
    (tmp / "reject.py").write_text(REJECT)
    py = sys.executable
    script = f"{py} {HERE / 'client.py'} plan.json out.json && {py} reject.py {test_ca.cert}"
    rec = run_intercept(tmp, standin, test_ca, ["sh", "-c", script])
    results = {r["name"]: r for r in json.loads((tmp / "out.json").read_text())}
    return rec, results


def _call(rec, marker: str):
    calls = [c for c in rec.calls if marker in json.dumps(c.request_headers)]
    assert len(calls) == 1, [(c.path, c.request_headers) for c in rec.calls]
    return calls[0]


def test_provider_dropping_mid_stream_looks_the_same_to_the_client(faults_run, standin):
    rec, results = faults_run
    via, alone = results["drop"], direct(standin, FAULTS[0])
    assert alone.get("error") and via.get("error") == alone["error"]  # e.g. RemoteProtocolError both ways
    assert base64.b64decode(via["body"]) == alone["body"] == b"".join(CHAT_SSE[: len(CHAT_SSE) // 2])
    call = _call(rec, '"drop"')
    assert call.status == "failed" and "connection error" in call.error, call.error
    assert call.response_body.encode() == alone["body"]  # what arrived before the drop is kept
    assert (
        call.completion["text"] == "Hello there." and call.finish_reason is None
    )  # the part before the drop


def test_a_body_that_is_not_json_passes_through_and_is_recorded(faults_run, standin):
    rec, results = faults_run
    via, alone = results["notjson"], direct(standin, FAULTS[1])
    assert via["status"] == alone["status"] == 200
    assert base64.b64decode(via["body"]) == alone["body"] == NOT_JSON
    call = _call(rec, '"notjson"')
    assert call.status == "failed" and "not JSON" in call.error, call.error
    assert call.response_body.encode() == NOT_JSON


def test_a_provider_error_passes_through_and_is_recorded(faults_run, standin):
    rec, results = faults_run
    via, alone = results["error"], direct(standin, FAULTS[2])
    assert via["status"] == alone["status"] == 429
    assert base64.b64decode(via["body"]) == alone["body"] == json.dumps(ERRORS["api.openai.com"]).encode()
    call = _call(rec, '"error"')
    assert call.status == "failed" and call.http_status == 429
    assert call.error == "provider error 429: Rate limit reached"


def test_a_client_that_rejects_the_ca_fails_and_is_recorded(faults_run):
    rec, _ = faults_run
    assert "REJECTED" in rec.proc.stdout and "CERTIFICATE_VERIFY_FAILED" in rec.proc.stdout
    rejected = [c for c in rec.calls if c.method == "CONNECT"]
    assert len(rejected) == 1, [(c.method, c.error) for c in rec.calls]
    call = rejected[0]
    assert call.status == "failed" and "rejected polarproxy's certificate for api.openai.com" in call.error
    assert call.dialect == "openai_chat" and call.backend == "https://api.openai.com"
