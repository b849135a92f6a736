"""Chat mode end to end: harness → polarproxy (real mitmproxy) → a server that applies the template itself.

The server is the vLLM-shaped double rendering with the tiny model's real chat template, so the prompt IDs
it reports are what a real server would; records must carry them, marked server-rendered.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest
from capture.conftest import ProxyThread
from vllm_double import VLLMDouble, VLLMFault

from polarproxy.backends.base import BackendError, GenerateParams
from polarproxy.backends.chat import ChatBackend, chat_request
from polarproxy.capture.stack import ProxyConfig
from polarproxy.conversation import Conversation, Message, Tool
from polarproxy.render.renderer import Renderer

REPLY = "Hello from the server."


@pytest.fixture(scope="module")
def renderer(tiny_model_dir) -> Renderer:
    return Renderer(tiny_model_dir)


@pytest.fixture
def server(renderer):
    im_end = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def render(messages, tools):
        text = renderer.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return renderer.encode(text)

    outputs = [*renderer.encode(REPLY), im_end]
    with VLLMDouble(
        outputs=outputs, eos_token_ids=frozenset({im_end}), render_chat=render, token_text=renderer.token_text
    ) as d:
        d.render = render  # type: ignore[attr-defined]
        yield d


@pytest.fixture
def proxy(server, tiny_model_dir, tmp_path: Path):
    p = ProxyThread(
        ProxyConfig(
            backend=server.url,
            model=tiny_model_dir,
            db=str(tmp_path / "chat.db"),
            backend_kind="vllm",
            backend_mode="chat",
        )
    )
    yield p
    p.stop()


def test_chat_request_renders_tools_without_server_side_parsing():
    conv = Conversation(
        messages=[Message(role="user", content="hi")], tools=[Tool(name="ls", parameters={"type": "object"})]
    )
    body = chat_request("m", conv, GenerateParams(max_new_tokens=4), stream=False, flavor="vllm")
    assert body["return_token_ids"] is True and body["logprobs"] is True and body["top_logprobs"] == 0
    assert body["tools"][0]["function"]["name"] == "ls" and body["tool_choice"] == "none"
    assert "return_meta_info" not in body
    assert chat_request("m", conv, GenerateParams(max_new_tokens=4), stream=False, flavor="sglang")[
        "return_meta_info"
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_mode_records_the_server_rendered_prompt(proxy, server, stream):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 32, "stream": stream}
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=60) as r:
        raw = r.read().decode()
    assert r.status_code == 200
    if stream:
        assert raw.rstrip().endswith("data: [DONE]")
        events = [orjson.loads(b[6:]) for b in raw.split("\n\n") if b.startswith("data: {")]
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == REPLY
    else:
        assert httpx.Response(200, content=raw).json()["choices"][0]["message"]["content"] == REPLY
    (call,) = proxy.store.list_calls(proxy.episode_id)
    assert call.status == "ok"
    assert call.fidelity == "server-rendered" and call.render_mode == "server"
    assert call.backend_kind == "vllm-chat" and call.extended_from is None
    assert call.prompt_ids == server.render(messages, None)  # what the server rendered and reported
    assert call.output_ids == server.outputs and call.output_ids[-1] in server.eos_token_ids
    assert call.output_logprobs == pytest.approx([server.logprob(i, t) for i, t in enumerate(server.outputs)])
    sent = server.requests[-1]
    assert sent["messages"][-1]["content"] == "Say hello." and sent["return_token_ids"] is True


def test_follow_up_turn_is_not_prefix_extended(proxy, server):
    first = [{"role": "user", "content": "Say hello."}]
    httpx.post(proxy.url + "/v1/chat/completions", json={"model": "tiny", "messages": first}, timeout=60)
    second = [*first, {"role": "assistant", "content": REPLY}, {"role": "user", "content": "Again."}]
    r = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "tiny", "messages": second}, timeout=60)
    assert r.status_code == 200
    calls = proxy.store.list_calls(proxy.episode_id)
    assert [c.render_mode for c in calls] == ["server", "server"]
    assert calls[1].extended_from is None
    assert calls[1].prompt_ids == server.render(second, None)


def test_server_that_reports_no_prompt_ids_fails_the_call(proxy, server):
    server.fault = VLLMFault(omit_prompt_ids=True)
    r = httpx.post(
        proxy.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert r.status_code >= 500
    (call,) = proxy.store.list_calls(proxy.episode_id)
    assert call.status == "failed" and "prompt token IDs" in (call.error or "")


async def test_chat_client_reads_streamed_deltas(server):
    backend = ChatBackend(server.url, flavor="vllm")
    conv = Conversation(messages=[Message(role="user", content="hi")])
    try:
        gens = [g async for g in backend.generate_chat(conv, GenerateParams(max_new_tokens=64), stream=True)]
        assert gens[-1].output_ids == server.outputs and gens[-1].finish_reason == "stop"
        assert gens[-1].prompt_ids == server.render([{"role": "user", "content": "hi"}], None)
        with pytest.raises(BackendError):
            async for _ in backend.generate([1], GenerateParams(max_new_tokens=1), stream=False):
                pass
    finally:
        await backend.aclose()


def test_sglang_meta_info_triples_are_read():
    """SGLang's chat answer with return_meta_info: IDs and logprobs from meta_info.output_token_logprobs."""
    from polarproxy.backends.chat import _Fold

    fold = _Fold("http://sglang")
    body = {
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
                "meta_info": {
                    "output_token_logprobs": [[-0.1, 40, None], [-0.2, 7, None]],
                    "finish_reason": {"type": "stop", "matched": 7},
                    "weight_version": "w3",
                },
            }
        ],
    }
    gen = fold.add(body, body["choices"][0])
    assert gen.output_ids == [40, 7] and gen.logprobs == [-0.1, -0.2]
    assert gen.matched_stop == 7 and gen.weight_version == "w3" and gen.prompt_ids == [1, 2, 3]
