"""The recorder addon through mitmproxy's own test helpers (taddons, tflow): no sockets."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons, tflow, tutils

from polarproxy.capture.addon import META_KEY, Recorder
from polarproxy.capture.responder import PATH_PREFIX, Responder
from polarproxy.store.store import Store


def chat_flow(body: bytes, path: str = "/v1/chat/completions", headers: dict | None = None):
    req = tutils.treq(
        method=b"POST", path=path.encode(), content=body, headers=((b"content-type", b"application/json"),)
    )
    for k, v in (headers or {}).items():
        req.headers[k] = v
    return tflow.tflow(req=req)


@pytest.fixture
async def configured(tiny_model_dir, tmp_path):
    addon = Recorder()
    with taddons.context(addon) as tctx:
        tctx.configure(
            addon,
            mode=["reverse:http://127.0.0.1:9"],
            polarproxy_model=str(tiny_model_dir),
            polarproxy_db=str(tmp_path / "a.db"),
            polarproxy_episode="ep_addon",
        )
        # the stack mitmdump builds once it runs (capture/stack.py), without a backend to detect
        await addon._start_stack(
            dataclasses.replace(addon._config, check_backend=False, backend_kind="sglang")
        )
        addon.responder = Responder(addon.gateway.serve)
        addon.responder.port = 4242
        yield addon, tmp_path / "a.db"


def test_configure_without_a_model_is_refused_with_the_option_name():
    addon = Recorder()
    with taddons.context(addon) as tctx, pytest.raises(exceptions.OptionsError, match="polarproxy_model"):
        tctx.configure(addon, polarproxy_db=":memory:", polarproxy_backend="http://127.0.0.1:9")


def test_configure_takes_the_backend_from_the_reverse_target(configured):
    addon, _ = configured
    assert addon.gateway.backend.url == "http://127.0.0.1:9"


async def test_chat_request_is_parked_and_forwarded_to_the_responder_without_secrets(configured):
    addon, _ = configured
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    f = chat_flow(body, headers={"authorization": "Bearer sk-secret"})
    await addon.request(f)
    assert f.response is None
    assert f.request.host == "127.0.0.1" and f.request.port == 4242
    assert f.request.path == PATH_PREFIX + f.id
    assert "authorization" not in f.request.headers and f.request.content == b""
    parked = addon.responder.pending[f.id].call
    assert parked.conversation.stream and parked.episode_id == "ep_addon"
    assert parked.start.request_headers["authorization"] == "<redacted>"
    f.response = tutils.tresp(headers=((b"content-type", b"text/event-stream"),))
    await addon.responseheaders(f)
    assert f.response.stream is True
    addon.error(f)  # the harness hung up: the parked call is dropped
    assert f.id not in addon.responder.pending


async def test_episode_comes_from_the_path_prefix(configured):
    addon, _ = configured
    f = chat_flow(
        orjson.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True}),
        path="/e/ep_other/v1/chat/completions",
    )
    await addon.request(f)
    assert addon.responder.pending[f.id].call.episode_id == "ep_other"


async def test_a_non_streamed_call_is_answered_in_the_hook_without_a_hop(configured):
    addon, db = configured
    f = chat_flow(orjson.dumps({"messages": [{"role": "user", "content": "x"}]}))
    await addon.request(f)  # the backend (port 9) cannot be reached: the answer is the provider error
    assert f.response is not None and f.response.status_code == 503
    assert orjson.loads(f.response.content)["error"]["message"]
    assert f.id not in addon.responder.pending and META_KEY not in f.metadata
    assert f.request.port != 4242  # not pointed at the responder
    (call,) = Store.open(str(db)).list_calls("ep_addon")
    assert call.status == "failed" and call.http_status == 503


async def test_malformed_request_is_answered_here_and_recorded_as_failed(configured):
    addon, db = configured
    f = chat_flow(b"[1, 2")
    await addon.request(f)
    assert f.response.status_code == 400
    assert "not valid JSON" in orjson.loads(f.response.content)["error"]["message"]
    assert META_KEY not in f.metadata
    store = Store.open(str(db))
    (call,) = store.list_calls("ep_addon")
    assert call.status == "failed" and call.http_status == 400


async def test_unknown_route_and_models_list_are_answered_without_a_record(configured):
    addon, db = configured
    f = tflow.tflow(req=tutils.treq(method=b"GET", path=b"/v1/models"))
    await addon.request(f)
    assert orjson.loads(f.response.content)["data"][0]["object"] == "model"
    m = tflow.tflow(req=tutils.treq(method=b"GET", path=b"/v1/models/gpt-x"))
    await addon.request(m)
    assert orjson.loads(m.response.content)["id"] == "gpt-x"
    g = tflow.tflow(req=tutils.treq(method=b"DELETE", path=b"/v1/files/1"))
    await addon.request(g)
    assert g.response.status_code == 404
    assert list(Store.open(str(db)).iter_calls()) == []


async def test_without_a_default_episode_a_call_that_names_none_is_refused_and_not_recorded(configured):
    addon, db = configured
    addon.default_episode = None  # as the rollout gateway runs it (its control token refuses first)
    f = chat_flow(orjson.dumps({"messages": [{"role": "user", "content": "x"}]}))
    await addon.request(f)
    assert f.response.status_code == 400
    assert orjson.loads(f.response.content)["error"]["code"] == "no_episode"
    assert list(Store.open(str(db)).iter_calls()) == []


async def test_a_long_request_that_resends_the_history_parses_only_its_new_messages(configured):
    """dialects/resend.py in the addon: the second request repeats the first one's messages (each ~9 KB) and
    adds two; its conversation is the whole parse's, and the repeated messages are the first call's objects."""
    from polarproxy.dialects import OPENAI_CHAT
    from polarproxy.dialects.resend import parse_whole

    addon, _ = configured
    history = [{"role": "system", "content": "s" * 9000}, {"role": "user", "content": "u" * 9000}]
    later = [*history, {"role": "assistant", "content": "a" * 9000}, {"role": "user", "content": "v" * 9000}]
    convs = []
    for messages in (history, later):
        body = orjson.dumps({"model": "m", "messages": messages, "stream": True})
        assert len(body) >= addon.resent.min_bytes
        f = chat_flow(body, path="/e/ep_long/v1/chat/completions")
        await addon.request(f)
        convs.append(addon.responder.pending[f.id].call.conversation)
        assert convs[-1] == parse_whole(OPENAI_CHAT, body, path="/v1/chat/completions", query={})
    assert (addon.resent.reused, addon.resent.parsed) == (2, 2 + 2)
    assert convs[1].messages[0] is convs[0].messages[0] and convs[1].messages[1] is convs[0].messages[1]
