"""A Python (httpx) and a Node (fetch) client through `polarproxy record --intercept` to provider stand-ins."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
from intercept_run import HERE, Intercepted, run_intercept
from requests_plan import SECRET, plan
from standin import OTHER_BODY, expected_body

REPO = HERE.parent.parent
UNDICI = REPO / ".cache" / "harnesses" / "node_modules" / "undici"


def _expected(item: dict) -> bytes:
    url = item["url"].removeprefix("https://")
    host, _, path = url.partition("/")
    return expected_body(host, "/" + path, item.get("json") or {})


@pytest.fixture(scope="module")
def python_run(tmp_path_factory, standin, test_ca) -> tuple[Intercepted, list[dict], list[dict]]:
    tmp = tmp_path_factory.mktemp("py-client")
    items = plan()
    (tmp / "plan.json").write_text(json.dumps(items))
    before = len(standin.received)
    rec = run_intercept(
        tmp, standin, test_ca, [sys.executable, str(HERE / "client.py"), "plan.json", "out.json"]
    )
    results = json.loads((tmp / "out.json").read_text())
    return rec, items, results, standin.received[before:]


def test_python_client_gets_every_answer_byte_for_byte(python_run):
    _, items, results, _ = python_run
    for item, res in zip(items, results, strict=True):
        assert "error" not in res, res
        assert res["status"] == 200, res
        assert base64.b64decode(res["body"]) == _expected(item), item["name"]


def test_provider_calls_are_recorded_with_text_fidelity(python_run):
    rec, items, _, _ = python_run
    recorded = [i for i in items if i["recorded"]]
    assert len(rec.calls) == len(recorded), [(c.dialect, c.path) for c in rec.calls]
    assert rec.episode.metadata["mode"] == "intercept" and rec.episode.status == "ok"
    for call in rec.calls:
        assert call.fidelity == "text" and call.status == "ok", (call.path, call.error)
        assert call.backend_kind == "provider" and call.prompt_ids == [] and call.output_ids == []
        assert call.latency_ms is not None and call.latency_ms > 0
        assert call.ttft_ms is not None and 0 < call.ttft_ms <= call.latency_ms


def test_records_keep_full_request_and_response(python_run):
    rec, items, _, received = python_run
    for item, call in zip([i for i in items if i["recorded"]], rec.calls, strict=True):
        assert json.loads(call.request_body) == item["json"]
        assert call.response_body.encode() == _expected(item)
    upstream = next(r for r in received if r.path.startswith("/v1/chat/completions"))
    assert upstream.headers["authorization"] == f"Bearer {SECRET}"  # the provider got the real key


def test_no_secret_reaches_the_store(python_run):
    rec, _, _, _ = python_run
    for f in rec.db.parent.glob(rec.db.name + "*"):
        try:
            data = f.read_bytes()
        except FileNotFoundError:  # SQLite removes -wal and -shm when its last connection closes
            continue
        assert SECRET.encode() not in data, f.name
    chat = rec.calls[0]
    assert chat.request_headers["authorization"] == "<redacted>"
    gem = next(c for c in rec.calls if c.dialect == "gemini" and c.stream)
    assert "key=%3Credacted%3E" in gem.path


@pytest.mark.parametrize(
    ("dialect", "stream", "text", "reasoning", "tools", "finish", "usage"),
    [
        ("openai_chat", False, "", None, [("call_1", "ls", '{"path": "."}')], "tool_calls", (21, 7)),
        ("openai_chat", True, "Hello there.", None, [], "stop", (12, 3)),
        ("openai_responses", False, "Hi!", "The user greets me.", [], "stop", (30, 9)),
        ("openai_responses", True, "Hi!", "The user greets me.", [], "stop", (30, 9)),
        (
            "anthropic",
            False,
            "Listing.",
            "List the files.",
            [("toolu_1", "Bash", '{"command": "ls"}')],
            "tool_calls",
            (140, 25),
        ),
        (
            "anthropic",
            True,
            "Listing.",
            "List the files.",
            [("toolu_1", "Bash", '{"command": "ls"}')],
            "tool_calls",
            (140, 25),
        ),
        (
            "gemini",
            False,
            "Reading it.",
            "Weighing it.",
            [("call_1_0", "read_file", '{"path": "README.md"}')],
            "tool_calls",
            (50, 15),
        ),
        ("gemini", True, "Hello.", None, [], "stop", (8, 2)),
    ],
)
def test_completion_is_parsed_per_provider(
    python_run, dialect, stream, text, reasoning, tools, finish, usage
):
    rec, _, _, _ = python_run
    call = rec.call(dialect=dialect, stream=stream)
    c = call.completion
    assert c["text"] == text and c["reasoning"] == reasoning
    assert [(t["id"], t["name"], t["arguments"]) for t in c["tool_calls"]] == tools
    assert call.finish_reason == finish
    assert (call.prompt_tokens, call.completion_tokens) == usage
    assert call.conversation["messages"][-1]["role"] == "user"


def test_non_provider_traffic_passes_through_unrecorded(python_run):
    rec, _items, results, received = python_run
    other = next(r for r in results if r["name"] == "other")
    assert base64.b64decode(other["body"]) == OTHER_BODY
    assert any(r.host == "downloads.example.test" for r in received)
    assert any(r.path == "/v1/models" for r in received)
    assert any(r.host == "llm.internal.test" for r in received)  # reached, but not a provider without --host
    assert not [c for c in rec.calls if "llm.internal.test" in c.backend]
    assert not [c for c in rec.calls if c.path.rsplit("/", 1)[-1] == "models" or not c.dialect]


def test_ca_key_is_readable_by_its_owner_only(python_run):
    rec, _, _, _ = python_run
    key = rec.ca_dir / "mitmproxy-ca.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(rec.ca_dir.stat().st_mode) == 0o700
    assert b"PRIVATE KEY" in key.read_bytes()


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_fetch_client_through_intercept(tmp_path, standin, test_ca):
    if not UNDICI.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{UNDICI} is missing: run `make harnesses`")
        pytest.skip(f"{UNDICI} is missing (make harnesses installs it)")
    items = plan()  # the hosts that are not intercepted present the test CA's certificate: Node trusts it
    # through the NODE_EXTRA_CA_CERTS it had, which polarproxy keeps beside its own CA
    (tmp_path / "plan.json").write_text(json.dumps(items))
    rec = run_intercept(
        tmp_path,
        standin,
        test_ca,
        ["node", str(HERE / "client.mjs"), "plan.json", "out.json"],
        env={"UNDICI_FROM": str(UNDICI.parent / "x.js"), "NODE_EXTRA_CA_CERTS": str(test_ca.cert)},
    )
    results = json.loads((tmp_path / "out.json").read_text())
    for item, res in zip(items, results, strict=True):
        assert "error" not in res, res
        assert base64.b64decode(res["body"]) == _expected(item), item["name"]
    assert len(rec.calls) == sum(i["recorded"] for i in items)
    assert {c.status for c in rec.calls} == {"ok"} and {c.fidelity for c in rec.calls} == {"text"}


def test_the_child_exit_code_is_records(tmp_path, standin, test_ca):
    rec = run_intercept(tmp_path, standin, test_ca, ["sh", "-c", "exit 3"], expect_rc=3)
    assert rec.summary["exit_code"] == 3 and rec.episode.status == "failed" and rec.calls == []


def test_child_env_routes_through_the_proxy(tmp_path, standin, test_ca):
    script = "import json,os; e=dict(os.environ); e['bundle_text']=open(e['SSL_CERT_FILE']).read(); print(json.dumps(e))"
    rec = run_intercept(
        tmp_path, standin, test_ca, [sys.executable, "-c", script], env={"NO_PROXY": "localhost"}
    )
    env = json.loads(rec.proc.stdout)  # the summary is on stderr: stdout is the harness's own
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        assert env[name].startswith("http://127.0.0.1:")
    assert env["NO_PROXY"] == "localhost"
    bundle = Path(env["SSL_CERT_FILE"]).name
    assert (
        bundle == "ca-bundle.pem"
        and env["REQUESTS_CA_BUNDLE"] == env["CURL_CA_BUNDLE"] == env["SSL_CERT_FILE"]
    )
    assert env["NODE_EXTRA_CA_CERTS"].endswith("node-extra-ca.pem")
    bundle_text = env["bundle_text"]
    assert test_ca.cert.read_text() in bundle_text  # what the child trusted before is still trusted
    assert (rec.ca_dir / "mitmproxy-ca-cert.pem").read_text() in bundle_text


def test_intercepted_calls_export_as_schema_valid_sft_rows(python_run, tmp_path):
    import jsonschema
    from typer.testing import CliRunner

    from polarproxy.cli import app
    from polarproxy.export.schema import load_schema

    rec, _, _, _ = python_run
    out = tmp_path / "sft.jsonl"
    r = CliRunner().invoke(
        app, ["export", "--format", "sft", "--db", str(rec.db), "--out", str(out), "--json"]
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(rec.calls)  # eight independent requests: eight one-call trajectories
    schema = load_schema("sft-row.v1")
    for row in rows:
        jsonschema.validate(row, schema)
        assert row["fidelity"] == ["text"] and row["messages"][-1]["role"] == "assistant"
    anthropic = next(r for r in rows if r["metadata"]["dialects"] == ["anthropic"])
    assert anthropic["messages"][-1]["reasoning_content"] == "List the files."
