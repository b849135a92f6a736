"""The local backend speaks SGLang 0.5's /generate contract over real HTTP on loopback."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import orjson
import pytest

from polarproxy.backends.local.model_runner import ModelRunner
from polarproxy.backends.local.server import LocalServer
from polarproxy.tiny import script


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with LocalServer(ModelRunner(tiny_model_dir), weight_version="v7") as srv:
        yield srv


@pytest.fixture(scope="module")
def random_server(random_model_dir):
    with LocalServer(ModelRunner(random_model_dir), max_new_tokens_limit=50_000) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def prompt_ids(server) -> list[int]:
    tok = server.runner.tokenizer
    messages = [
        {"role": "system", "content": script.SYSTEM_PROMPT},
        {"role": "user", "content": script.USER_PROMPTS[0]},
    ]
    return server.runner.encode(
        tok.apply_chat_template(messages, tools=script.TOOLS, add_generation_prompt=True, tokenize=False)
    )


def _events(client, body) -> list:
    with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    chunks = [c for c in raw.split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks)
    return [orjson.loads(c[6:]) for c in chunks[:-1]]


def test_generate_returns_sglang_shape_with_the_stop_token(client, server, prompt_ids):
    r = client.post(
        "/generate",
        json={
            "input_ids": prompt_ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": 64},
            "return_logprob": True,
        },
    )
    assert r.status_code == 200
    body = r.json()
    im_end = server.runner.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert body["text"] == script.EXPECTED_REPLIES[0]
    assert body["output_ids"][-1] == im_end
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": im_end}
    assert meta["prompt_tokens"] == len(prompt_ids)
    assert meta["completion_tokens"] == len(body["output_ids"])
    assert meta["cached_tokens"] == 0
    assert meta["weight_version"] == "v7"
    assert isinstance(meta["id"], str) and meta["e2e_latency"] >= 0
    assert [t for _, t, _ in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(text is None for _, _, text in meta["output_token_logprobs"])


def test_logprobs_over_http_equal_a_teacher_forced_score(client, server, prompt_ids):
    body = client.post(
        "/generate",
        json={
            "input_ids": prompt_ids,
            "sampling_params": {"temperature": 1.0, "sampling_seed": 5, "max_new_tokens": 32},
            "return_logprob": True,
        },
    ).json()
    logprobs = [lp for lp, _, _ in body["meta_info"]["output_token_logprobs"]]
    scored = server.runner.score(prompt_ids, body["output_ids"])
    assert max(abs(a - b) for a, b in zip(logprobs, scored, strict=True)) < 1e-4


def test_skip_special_tokens_false_still_trims_the_matched_stop_token(client, prompt_ids):
    body = client.post(
        "/generate",
        json={"input_ids": prompt_ids, "sampling_params": {"temperature": 0, "skip_special_tokens": False}},
    ).json()
    assert body["text"] == script.EXPECTED_REPLIES[0]
    with_stop = client.post(
        "/generate",
        json={
            "input_ids": prompt_ids,
            "sampling_params": {"temperature": 0, "skip_special_tokens": False, "no_stop_trim": True},
        },
    ).json()
    assert with_stop["text"] == script.EXPECTED_REPLIES[0] + "<|im_end|>"


def test_streamed_and_unstreamed_generations_match(client, prompt_ids):
    body = {
        "input_ids": prompt_ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": 64},
        "return_logprob": True,
    }
    once = client.post("/generate", json=body).json()
    events = _events(client, body)
    assert len(events) == len(once["output_ids"])  # one event per token
    last = events[-1]
    assert last["output_ids"] == once["output_ids"]
    assert last["text"] == once["text"]
    assert last["meta_info"]["finish_reason"] == once["meta_info"]["finish_reason"]
    a = [lp for lp, _, _ in last["meta_info"]["output_token_logprobs"]]
    b = [lp for lp, _, _ in once["meta_info"]["output_token_logprobs"]]
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5


def test_stream_chunks_are_cumulative_prefixes(client, prompt_ids):
    events = _events(
        client, {"input_ids": prompt_ids, "sampling_params": {"temperature": 0}, "return_logprob": True}
    )
    for i, (prev, cur) in enumerate(itertools.pairwise(events)):
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
        assert len(cur["output_ids"]) == i + 2
        assert cur["text"].startswith(prev["text"])
        lp_prev = prev["meta_info"]["output_token_logprobs"]
        assert cur["meta_info"]["output_token_logprobs"][: len(lp_prev)] == lp_prev
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "stop"


def test_stream_text_never_shows_a_partial_stop_string(client, prompt_ids):
    events = _events(
        client, {"input_ids": prompt_ids, "sampling_params": {"temperature": 0, "stop": ["README.md"]}}
    )
    # The first turn never says README.md: the stop string never matches, so no held-back tail leaks.
    assert events[-1]["text"] == script.EXPECTED_REPLIES[0]
    for prev, cur in itertools.pairwise(events):
        assert cur["text"].startswith(prev["text"])


def test_stop_string_trims_the_text_and_reports_the_match(client, server, prompt_ids):
    body = client.post(
        "/generate",
        json={"input_ids": prompt_ids, "sampling_params": {"temperature": 0, "stop": ['"arguments"']}},
    ).json()
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": '"arguments"'}
    assert body["text"] == '<tool_call>\n{"name": "list_files", '
    # output_ids keep every sampled token, the one that completed the stop string included
    # (here `":`, so the trimmed text is shorter than the decoded output)
    assert server.runner.decode(body["output_ids"]) == '<tool_call>\n{"name": "list_files", "arguments":'
    events = _events(
        client, {"input_ids": prompt_ids, "sampling_params": {"temperature": 0, "stop": ['"arguments"']}}
    )
    assert events[-1]["text"] == body["text"] and events[-1]["output_ids"] == body["output_ids"]
    for prev, cur in itertools.pairwise(events):
        assert cur["text"].startswith(prev["text"])


def test_length_finish_reason_and_the_server_cap(tiny_model_dir, server, prompt_ids):
    with LocalServer(server.runner, max_new_tokens_limit=3) as capped, httpx.Client(base_url=capped.url) as c:
        body = c.post(
            "/generate", json={"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 8000}}
        ).json()
    assert len(body["output_ids"]) == 3
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


def test_text_input_is_tokenized_without_additions(client, server, prompt_ids):
    text = server.runner.decode(prompt_ids, skip_special_tokens=False)
    a = client.post("/generate", json={"text": text, "sampling_params": {"temperature": 0}}).json()
    b = client.post("/generate", json={"input_ids": prompt_ids, "sampling_params": {"temperature": 0}}).json()
    assert a["meta_info"]["prompt_tokens"] == len(prompt_ids)
    assert a["output_ids"] == b["output_ids"]


def test_sampling_seed_is_deterministic_over_http(random_server):
    with httpx.Client(base_url=random_server.url, timeout=60) as c:
        body = {
            "text": "seed",
            "sampling_params": {"sampling_seed": 42, "max_new_tokens": 16, "ignore_eos": True},
        }
        a = c.post("/generate", json=body).json()["output_ids"]
        b = c.post("/generate", json=body).json()["output_ids"]
        body["sampling_params"]["sampling_seed"] = 43
        d = c.post("/generate", json=body).json()["output_ids"]
    assert a == b and a != d and len(a) == 16


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, "repetition_penalty": 1.1}},
            "repetition_penalty",
        ),
        ({"input_ids": [1, 2], "sampling_params": {"top_p": 2}}, "top_p"),
        ({"input_ids": [1, 2], "text": "both"}, "Either text or input_ids"),
        ({"sampling_params": {}}, "Either text or input_ids"),
        ({"input_ids": [[1, 2], [3]]}, "batched"),
        ({"input_ids": [1, 10**9]}, "not a token ID"),
        ({"input_ids": []}, "empty"),
        ([1, 2, 3], "must be a JSON object"),
    ],
)
def test_bad_requests_get_400_with_sglangs_error_shape(client, body, message):
    r = client.post("/generate", json=body)
    assert r.status_code == 400
    assert message in r.json()["error"]["message"]


def test_invalid_json_gets_400(client):
    r = client.post("/generate", content=b'{"input_ids": [1,', headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "Invalid JSON" in r.json()["error"]["message"]


def test_prompt_longer_than_the_context_gets_400(client):
    r = client.post("/generate", json={"input_ids": [1] * 65536})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "The input (65536 tokens) is longer than the model's context length (65536 tokens)."
    )


def test_unknown_top_level_keys_are_ignored(client, prompt_ids):
    r = client.post(
        "/generate",
        json={
            "input_ids": prompt_ids,
            "sampling_params": {"max_new_tokens": 2},
            "lora_path": None,
            "custom": 1,
        },
    )
    assert r.status_code == 200 and len(r.json()["output_ids"]) <= 2


def test_info_endpoints(client, server):
    assert client.get("/health").status_code == 200
    assert client.get("/health_generate").status_code == 200
    info = client.get("/model_info").json()
    assert info["model_path"] == str(server.runner.model_dir)
    assert info["tokenizer_path"] == str(server.runner.model_dir)
    assert info["is_generation"] is True and info["weight_version"] == "v7"
    assert client.get("/get_model_info").json() == info
    assert client.get("/get_weight_version").json() == {"weight_version": "v7"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == str(server.runner.model_dir)
    assert client.get("/nope").status_code == 404


def test_weight_version_updates(random_model_dir):
    with LocalServer(ModelRunner(random_model_dir)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post(
            "/update_weights_from_disk",
            json={"model_path": str(random_model_dir), "weight_version": "step-2"},
        )
        assert r.status_code == 200 and r.json()["success"] is True
        assert c.get("/model_info").json()["weight_version"] == "step-2"
        body = c.post(
            "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}
        ).json()
        assert body["meta_info"]["weight_version"] == "step-2"
        bad = c.post("/update_weights_from_disk", json={"model_path": str(random_model_dir / "missing")})
        assert bad.status_code == 400 and bad.json()["success"] is False
        assert (
            c.post("/update_weight_version", json={"new_version": "step-3"}).json()["new_version"] == "step-3"
        )
        assert c.get("/get_weight_version").json() == {"weight_version": "step-3"}


def _wait_idle(runner: ModelRunner, timeout: float) -> float:
    started = time.monotonic()
    while runner.busy:
        if time.monotonic() - started > timeout:
            raise AssertionError("generation kept running after the client left")
        time.sleep(0.02)
    return time.monotonic() - started


def _wait_busy(runner: ModelRunner, timeout: float = 30) -> None:
    started = time.monotonic()
    while not runner.busy:
        assert time.monotonic() - started < timeout, "generation did not start"
        time.sleep(0.01)


def test_stream_client_disconnect_stops_generation_and_health_stays_responsive(random_server):
    runner = random_server.runner
    body = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"max_new_tokens": 40_000, "ignore_eos": True},
        "stream": True,
    }
    with (
        httpx.Client(base_url=random_server.url, timeout=60) as c,
        c.stream("POST", "/generate", json=body) as r,
    ):
        lines = r.iter_lines()
        seen = [line for _, line in zip(range(6), lines, strict=False) if line]
        assert len(seen) >= 2 and runner.busy
        t = time.monotonic()
        assert httpx.get(f"{random_server.url}/health", timeout=5).status_code == 200
        assert httpx.get(f"{random_server.url}/health_generate", timeout=5).status_code == 200
        assert time.monotonic() - t < 3
    # leaving the block closed the connection mid-stream
    _wait_idle(runner, timeout=10)
    again = httpx.post(
        f"{random_server.url}/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 2}}
    )
    assert again.status_code == 200  # and the server still serves


def test_unstreamed_client_disconnect_stops_generation(random_server):
    runner = random_server.runner
    payload = json.dumps(
        {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 40_000, "ignore_eos": True}}
    ).encode()
    sock = socket.create_connection(("127.0.0.1", random_server.port))
    sock.sendall(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    _wait_busy(runner)
    sock.close()
    _wait_idle(runner, timeout=10)


def test_long_prompt_is_prefilled_in_chunks(random_server):
    ids = [(i * 7919) % 4000 + 10 for i in range(8192)]
    with httpx.Client(base_url=random_server.url, timeout=300) as c:
        body = c.post(
            "/generate",
            json={
                "input_ids": ids,
                "sampling_params": {"temperature": 0, "max_new_tokens": 3, "ignore_eos": True},
                "return_logprob": True,
            },
        ).json()
    assert body["meta_info"]["prompt_tokens"] == 8192
    assert len(body["output_ids"]) == 3
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


@pytest.mark.integration
def test_module_entry_point_serves_on_a_free_port(random_model_dir):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "polarproxy.backends.local",
            str(random_model_dir),
            "--port",
            "0",
            "--weight-version",
            "w1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        url = f"http://127.0.0.1:{ready['port']}"
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        assert httpx.get(f"{url}/model_info", timeout=10).json()["weight_version"] == "w1"
    finally:
        proc.terminate()
        proc.wait(10)


def test_admin_routes_take_json_from_loopback_and_the_key_when_one_is_set(server, tmp_path):
    """A web page elsewhere cannot swap weights or freeze generation: not by a cross-site simple POST
    (text/plain), not through DNS rebinding (a foreign Host); with --api-key only the key opens them."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        plain = c.post(
            "/pause_generation", content=b'{"mode": "abort"}', headers={"content-type": "text/plain"}
        )
        assert plain.status_code == 415
        rebound = c.post(
            "/update_weight_version", json={"new_version": "evil"}, headers={"host": "evil.example"}
        )
        assert rebound.status_code == 400
        assert c.get("/flush_cache", headers={"host": "evil.example"}).status_code == 400
        assert c.get("/get_weight_version").json()["weight_version"] != "evil"
        assert c.get("/health", headers={"host": "evil.example"}).status_code == 200  # read-only: open
    with (
        LocalServer(server.runner, api_key="k-123") as keyed,
        httpx.Client(base_url=keyed.url, timeout=60) as c,
    ):
        assert c.post("/update_weight_version", json={"new_version": "x"}).status_code == 401
        wrong = {"authorization": "Bearer nope"}
        assert c.post("/update_weight_version", json={"new_version": "x"}, headers=wrong).status_code == 401
        right = {"authorization": "Bearer k-123"}
        assert c.put("/update_weight_version", json={"new_version": "v9"}, headers=right).status_code == 200
        assert c.get("/get_weight_version").json()["weight_version"] == "v9"


def test_the_backend_beyond_loopback_needs_an_api_key(tiny_model_dir):
    r = subprocess.run(
        [sys.executable, "-m", "polarproxy", "backend", "--model", str(tiny_model_dir), "--host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "POLARPROXY_SYNC_API_KEY"},
    )  # fmt: skip
    assert r.returncode == 2 and "--api-key" in r.stderr and "Traceback" not in r.stderr
