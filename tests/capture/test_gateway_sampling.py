"""The gateway owns the sampling parameters: it always sends explicit values (the harness's, the flags', or
the full distribution), never leaves them to the server's hidden defaults, and records what it sent and who
chose each value."""

from __future__ import annotations

import httpx
import pytest

from polarproxy.capture.gateway import GatewayOptions, sent_sampling
from polarproxy.conversation import Sampling
from polarproxy.export.rows import trajectory_to_row
from polarproxy.reconstruct import per_request

pytestmark = pytest.mark.integration


def test_who_chooses_each_value():
    harness_none, harness_some = Sampling(), Sampling(temperature=0.2, top_k=5, seed=7)
    default = sent_sampling(harness_none, GatewayOptions())
    assert {k: default[k] for k in ("temperature", "top_p", "top_k")} == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
    }
    assert set(default["chosen_by"].values()) == {"default"} and "seed" not in default
    flags = GatewayOptions(temperature=0.6, top_p=0.95)
    filled = sent_sampling(
        harness_some, flags
    )  # policy harness: the harness's values win, flags fill the rest
    assert (filled["temperature"], filled["top_p"], filled["top_k"], filled["seed"]) == (0.2, 0.95, 5, 7)
    assert filled["chosen_by"] == {"temperature": "harness", "top_p": "flag", "top_k": "harness"}
    over = sent_sampling(harness_some, GatewayOptions(temperature=0.6, sampling_policy="override"))
    assert over["temperature"] == 0.6 and over["chosen_by"]["temperature"] == "flag" and over["top_k"] == 5


def test_a_harness_sending_no_temperature_is_recorded_at_the_flags(make_proxy, make_stub):
    proxy = make_proxy(make_stub("Fine.").url, temperature=0.6)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with httpx.Client(base_url=proxy.url, timeout=60) as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        assert c.post("/v1/chat/completions", json={**body, "temperature": 0.3}).status_code == 200
    calls = proxy.store.list_calls(proxy.episode_id)
    assert [c.temperature for c in calls] == [0.6, 0.3]  # the flag fills; the harness's own value wins
    sent = [c.conversation["sent_sampling"] for c in calls]
    assert [s["chosen_by"]["temperature"] for s in sent] == ["flag", "harness"]
    assert [(s["top_p"], s["top_k"]) for s in sent] == [(1.0, -1), (1.0, -1)]  # never the server's defaults
    rows = [trajectory_to_row(t) for t in per_request(proxy.store.iter_calls([proxy.episode_id]))]
    assert [r["temperatures"] for r in rows] == [[0.6], [0.3]]
