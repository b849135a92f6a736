"""T6 in intercept mode (the in-flight row is on disk before the answer's first byte reaches the client, the
finished row once it has it all), and `--host` adding a host of the user's."""

from __future__ import annotations

import json
import sys

from intercept_run import run_intercept
from requests_plan import CHAT, OPENAI_AUTH

CLIENT = """
import json, os, ssl, sys, httpx
from polarproxy.store.store import Store

store = Store.open(sys.argv[1])
episode = os.environ["POLARPROXY_EPISODE"]
seen = {}
with httpx.Client(timeout=30) as client:
    r = client.post("https://llm.internal.test/v1/chat/completions", headers=HEADERS, json=CHAT)
    seen["custom_status"] = r.status_code
    body = dict(CHAT, stream=True)
    with client.stream("POST", "https://api.openai.com/v1/chat/completions", headers={**HEADERS, "x-standin": "slow"},
                       json=body) as r:
        chunks = r.iter_raw()
        next(chunks)  # the first chunk; the stand-in now pauses for a second
        seen["during"] = [c.status for c in store.list_calls(episode)]
        for _ in chunks:
            pass
    seen["after"] = [c.status for c in store.list_calls(episode)]
print("SEEN " + json.dumps(seen))
"""


def test_in_flight_before_the_first_byte_and_ok_after_the_last(tmp_path, standin, test_ca):
    script = tmp_path / "t6_client.py"
    script.write_text(f"HEADERS = {OPENAI_AUTH!r}\nCHAT = {CHAT!r}\n" + CLIENT)
    db = tmp_path / "intercept.db"
    rec = run_intercept(
        tmp_path,
        standin,
        test_ca,
        [sys.executable, str(script), str(db)],
        "--intercept-host",
        "llm.internal.test",
    )
    seen = json.loads(rec.proc.stdout.split("SEEN ", 1)[1].splitlines()[0])
    assert seen["custom_status"] == 200
    assert seen["during"] == ["ok", "in_flight"]  # the custom host's call, then the stream in progress
    assert seen["after"] == ["ok", "ok"]
    custom = rec.calls[0]
    assert custom.backend == "https://llm.internal.test" and custom.dialect == "openai_chat"
    assert custom.completion["tool_calls"][0]["name"] == "ls"


UNREACHABLE_CLIENT = """
import httpx
try:
    r = httpx.post("https://api.openai.com/v1/chat/completions", headers=HEADERS, json=CHAT, timeout=30)
    print("STATUS", r.status_code)
except httpx.HTTPError as e:
    print("REFUSED", type(e).__name__)
"""


def test_a_provider_that_cannot_be_reached_is_said_and_recorded_as_a_failed_call(tmp_path, standin, test_ca):
    script = tmp_path / "unreachable.py"
    script.write_text(f"HEADERS = {OPENAI_AUTH!r}\nCHAT = {CHAT!r}\n" + UNREACHABLE_CLIENT)
    rec = run_intercept(
        tmp_path, standin, test_ca, [sys.executable, str(script)], "--resolve", "api.openai.com=127.0.0.1:1"
    )
    assert "STATUS" not in rec.proc.stdout or "STATUS 502" in rec.proc.stdout  # the client is refused
    assert "polarproxy: cannot reach api.openai.com" in rec.proc.stderr
    [call] = rec.calls
    assert call.status == "failed" and "cannot reach the provider api.openai.com" in call.error
    assert call.dialect == "openai_chat" and call.backend == "https://api.openai.com"
