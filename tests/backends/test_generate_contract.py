"""One `/generate` contract, two servers: the SGLang 0.5 double and our local backend answer alike.

The double follows SGLang's source (see tests/backends/sglang_double.py); the local backend
(`polarproxy backend`) runs the tiny model. Where SGLang's own behaviour is unhelpful the local backend
is allowed to be stricter, and the test says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import orjson
import pytest
from sglang_double import SGLangDouble

from polarproxy.backends.base import GenerateParams
from polarproxy.backends.sglang import SGLangBackend
from polarproxy.tiny import script


@dataclass
class Server:
    name: str
    url: str
    prompt: list[int]
    eos: int  # the end-of-turn token the answer to `prompt` ends with


@pytest.fixture(scope="module")
def local_server(tiny_model_dir) -> Iterator[Server]:
    from polarproxy.backends.local.model_runner import ModelRunner
    from polarproxy.backends.local.server import LocalServer

    with LocalServer(ModelRunner(tiny_model_dir), weight_version="v7") as srv:
        tok = srv.runner.tokenizer
        messages = [
            {"role": "system", "content": script.SYSTEM_PROMPT},
            {"role": "user", "content": script.USER_PROMPTS[0]},
        ]
        prompt = srv.runner.encode(
            tok.apply_chat_template(messages, tools=script.TOOLS, add_generation_prompt=True, tokenize=False)
        )
        yield Server("local", srv.url, prompt, tok.convert_tokens_to_ids("<|im_end|>"))


@pytest.fixture(scope="module")
def double_server() -> Iterator[Server]:
    eos = 7
    with SGLangDouble(
        outputs=[40, 41, 42, 43, eos, 50],
        eos_token_ids=frozenset({eos}),
        special_ids=frozenset({eos}),
        weight_version="v7",
    ) as d:
        yield Server("double", d.url, [1, 2, 3, 4], eos)


@pytest.fixture(params=["double", "local"])
def server(request) -> Server:
    return request.getfixturevalue(f"{request.param}_server")


def _post(server: Server, body: object) -> httpx.Response:
    return httpx.post(server.url + "/generate", json=body, timeout=120)


def _stream(server: Server, body: dict) -> tuple[int, list[object]]:
    with httpx.stream("POST", server.url + "/generate", json={**body, "stream": True}, timeout=120) as r:
        raw = r.read().decode()
    assert r.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in raw.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks)
    assert blocks[-1] == "data: [DONE]"
    return r.status_code, [orjson.loads(b[6:]) for b in blocks[:-1]]


def _greedy(server: Server, **extra: object) -> dict:
    sp = {
        "temperature": 0,
        "max_new_tokens": 64,
        "skip_special_tokens": False,
        "stop_token_ids": [server.eos],
    }
    return {"input_ids": server.prompt, "sampling_params": sp, "return_logprob": True, **extra}


META_KEYS = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "output_token_logprobs",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
}


def test_answer_shape_with_the_stop_token(server):
    r = _post(server, _greedy(server))
    assert r.status_code == 200
    body = r.json()
    assert set(body) >= {"text", "output_ids", "meta_info"}
    meta = body["meta_info"]
    assert set(meta) >= META_KEYS
    ids = body["output_ids"]
    assert ids[-1] == server.eos  # the stop token is in output_ids ...
    assert meta["finish_reason"] == {"type": "stop", "matched": server.eos}
    assert meta["prompt_tokens"] == len(server.prompt) and meta["completion_tokens"] == len(ids)
    assert meta["weight_version"] == "v7"
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == ids  # ... and has its logprob
    assert all(isinstance(lp, float) and lp <= 0 and text is None for lp, _, text in triples)
    assert "<|im_end|>" not in body["text"] and "<7>" not in body["text"]  # the text leaves it out


def test_text_in_logprobs_on_request(server):
    body = _post(server, _greedy(server, return_text_in_logprobs=True)).json()
    assert all(isinstance(text, str) for _, _, text in body["meta_info"]["output_token_logprobs"])


def test_length_finish_reason(server):
    body = _greedy(server)
    body["sampling_params"]["max_new_tokens"] = 2
    meta = _post(server, body).json()["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 2} and meta["completion_tokens"] == 2


def test_stream_is_cumulative_and_ends_with_done(server):
    status, chunks = _stream(server, _greedy(server))
    assert status == 200
    plain = _post(server, _greedy(server)).json()
    for a, b in itertools.pairwise(chunks):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
        assert a["meta_info"]["finish_reason"] is None and "e2e_latency" not in a["meta_info"]
    last = chunks[-1]
    assert last["output_ids"] == plain["output_ids"] and last["text"] == plain["text"]
    assert last["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]
    assert [t[1] for t in last["meta_info"]["output_token_logprobs"]] == last["output_ids"]


def test_neither_text_nor_ids_is_400(server):
    r = _post(server, {"sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("Either text")


def test_out_of_range_sampling_value_is_400(server):
    r = _post(server, {"input_ids": server.prompt, "sampling_params": {"top_p": 2.0}})
    assert r.status_code == 400 and "top_p" in r.json()["error"]["message"]


def test_streamed_validation_error_is_an_error_event(server):
    status, chunks = _stream(server, {"input_ids": server.prompt, "sampling_params": {"top_p": 2.0}})
    assert status == 200
    assert len(chunks) == 1 and "top_p" in chunks[0]["error"]["message"]


def test_unknown_sampling_key_is_refused(server):
    """SGLang: TypeError → bare 500; the local backend says which key with a 400. Both refuse."""
    r = _post(server, {"input_ids": server.prompt, "sampling_params": {"seed": 1}})
    assert r.status_code == (500 if server.name == "double" else 400)


def test_health_and_model_info(server):
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    info = httpx.get(server.url + "/get_model_info", timeout=10).json()
    assert info["is_generation"] is True and info["weight_version"] == "v7" and "model_path" in info


@pytest.mark.parametrize("stream", [False, True])
async def test_client_reads_both_alike(server, stream):
    backend = SGLangBackend(server.url)
    try:
        gens = [
            g
            async for g in backend.generate(
                server.prompt,
                GenerateParams(max_new_tokens=64, temperature=0.0, stop_token_ids=[server.eos]),
                stream=stream,
            )
        ]
    finally:
        await backend.aclose()
    last = gens[-1]
    assert last.finish_reason == "stop" and last.matched_stop == server.eos == last.output_ids[-1]
    assert len(last.logprobs) == len(last.output_ids) and last.weight_version == "v7"
    assert last.prompt_tokens == len(server.prompt)


# -- weight updates -----------------------------------------------------------------------------------


@pytest.fixture(params=["double", "local"])
def fresh_server(request, random_model_dir) -> Iterator[str]:
    """A server of each kind whose weights a test may change (the URL)."""
    if request.param == "double":
        with SGLangDouble(outputs=[40, 41, 7], eos_token_ids=frozenset({7}), weight_version="v7") as d:
            yield d.url
        return
    from polarproxy.backends.local.model_runner import ModelRunner
    from polarproxy.backends.local.server import LocalServer

    with LocalServer(ModelRunner(random_model_dir), weight_version="v7") as srv:
        yield srv.url


def test_pause_and_continue_answer_alike(fresh_server):
    paused = httpx.post(fresh_server + "/pause_generation", json={"mode": "in_place"}, timeout=10)
    assert paused.status_code == 200
    assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}
    resumed = httpx.post(fresh_server + "/continue_generation", json={}, timeout=10)
    assert resumed.json() == {"message": "Generation continued successfully.", "status": "ok"}
    assert (
        httpx.post(fresh_server + "/pause_generation", json={"mode": "sometime"}, timeout=10).status_code
        == 400
    )


def test_update_weights_from_disk_answers_alike(fresh_server, random_model_dir, tmp_path):
    r = httpx.post(
        fresh_server + "/update_weights_from_disk",
        json={"model_path": str(random_model_dir), "weight_version": "v8", "flush_cache": True},
        timeout=60,
    )
    assert r.status_code == 200
    assert r.json() == {
        "success": True,
        "message": "Succeeded to update model weights. Weight version updated to v8.",
        "num_paused_requests": 0,
    }
    info = httpx.get(fresh_server + "/get_model_info", timeout=10).json()
    assert info["weight_version"] == "v8" and info["model_path"] == str(random_model_dir)
    answer = httpx.post(
        fresh_server + "/generate",
        json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}},
        timeout=60,
    ).json()
    assert answer["meta_info"]["weight_version"] == "v8"

    missing = tmp_path / "step-404"
    bad = httpx.post(
        fresh_server + "/update_weights_from_disk",
        json={"model_path": str(missing), "weight_version": "v9"},
        timeout=60,
    )
    assert bad.status_code == 400
    body = bad.json()
    assert body["success"] is False and str(missing) in body["message"] and body["num_paused_requests"] == 0
    assert httpx.get(fresh_server + "/get_weight_version", timeout=10).json() == {"weight_version": "v8"}
