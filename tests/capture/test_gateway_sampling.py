"""The gateway owns the sampling parameters: it always sends explicit values (the harness's, the flags', or
the full distribution), never leaves them to the server's hidden defaults, and records what it sent and who
chose each value."""

from __future__ import annotations

import httpx
import pytest

from polarproxy.capture.gateway import GatewayOptions
from polarproxy.capture.sampling import sent_sampling
from polarproxy.conversation import Sampling
from polarproxy.export.rows import ExportStats, trajectory_to_row
from polarproxy.logprob_semantics import logprob_temperature
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
    assert [r["logprob_temperatures"] for r in rows] == [[0.6], [0.3]]  # the stub is an SGLang: scaled
    assert [(r["top_ps"], r["top_ks"], r["truncated_sampling"]) for r in rows] == [([1.0], [-1], False)] * 2


def test_truncated_sampling_is_flagged_and_export_json_sums_up_the_settings(make_proxy, make_stub):
    proxy = make_proxy(make_stub("Fine.").url, temperature=0.6, top_p=0.95)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with httpx.Client(base_url=proxy.url, timeout=60) as c:
        for extra in ({}, {}, {"top_k": 20, "top_p": 1.0}):
            assert c.post("/v1/chat/completions", json={**body, **extra}).status_code == 200
    stats = ExportStats()
    rows = []
    for t in per_request(proxy.store.iter_calls([proxy.episode_id])):
        stats.add(t)
        rows.append(trajectory_to_row(t))
    assert [(r["top_ps"], r["top_ks"], r["truncated_sampling"]) for r in rows] == [
        ([0.95], [-1], True),
        ([0.95], [-1], True),
        ([1.0], [20], True),
    ]
    assert stats.summary()["sampling"] == [
        {"temperature": 0.6, "top_p": 0.95, "top_k": -1, "logprob_temperature": 0.6, "calls": 2},
        {"temperature": 0.6, "top_p": 1.0, "top_k": 20, "logprob_temperature": 0.6, "calls": 1},
    ]


def test_what_the_backends_logprobs_are_decides_the_recorded_logprob_temperature(make_proxy, make_stub):
    """--backend-logprobs raw (vLLM's default; SGLang with SGLANG_RETURN_ORIGINAL_LOGPROB=1): the logprobs
    are at T = 1 whatever was sampled; the kinds' defaults otherwise, greedy at 1."""
    proxy = make_proxy(make_stub("Fine.").url, temperature=0.6, backend_logprobs="raw")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with httpx.Client(base_url=proxy.url, timeout=60) as c:
        assert c.post("/v1/chat/completions", json=body).status_code == 200
    (call,) = proxy.store.list_calls(proxy.episode_id)
    assert (call.temperature, call.recorded_logprob_temperature, call.logprob_temperature) == (0.6, 1.0, 1.0)
    assert logprob_temperature("sglang", 0.6) == 0.6 and logprob_temperature("local", 0.0) == 1.0
    assert logprob_temperature("vllm", 0.6) == 1.0 and logprob_temperature("vllm-chat", 0.6) == 1.0
    assert logprob_temperature("sglang-chat", 0.7) == 0.7 and logprob_temperature("sglang", 0.6, "raw") == 1.0
    assert logprob_temperature("sglang", None) is None and logprob_temperature("provider", 0.6) is None
    with pytest.raises(ValueError, match=r"Unknown backend logprobs 'odd'\. Must be one of scaled, raw"):
        logprob_temperature("sglang", 0.6, "odd")


def test_rows_sampled_at_0_6_train_at_0_6_so_the_first_ratio_is_1(
    make_proxy, make_backend, random_model_dir, tmp_path
):
    """The local backend returns logprobs at the sampling temperature (as SGLang does); export rows carry
    it (`logprob_temperatures`) and the trainer scores each token at it, so with --lr 0 the first step's
    ratio π_train/π_behaviour is 1. The same rows without it (export rows v2) are trained at T = 1: the
    ratio is not 1, which is what this test guards against."""
    pytest.importorskip("torch")
    from polarproxy.train.config import TrainConfig
    from polarproxy.train.data import samples_from_rows
    from polarproxy.train.loop import train
    from polarproxy.train.metrics import read_metrics

    backend = make_backend(random_model_dir, "--max-new-tokens-limit", "64")
    proxy = make_proxy(backend.url, model=random_model_dir, temperature=0.6)
    with httpx.Client(base_url=proxy.url, timeout=120) as c:
        for text in ("hello", "write a word", "count"):
            body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 16}
            assert c.post("/v1/chat/completions", json=body).status_code == 200
    rows = [trajectory_to_row(t) for t in per_request(proxy.store.iter_calls([proxy.episode_id]))]
    assert [r["temperatures"] for r in rows] == [[0.6]] * 3
    assert [r["logprob_temperatures"] for r in rows] == [[0.6]] * 3
    for i, r in enumerate(rows):
        r["advantage"] = 1.0 if i % 2 else -1.0

    def first_step(rows: list[dict], out: str) -> tuple[float, float]:
        samples = samples_from_rows(rows, warn=lambda _m: None)
        train(samples, random_model_dir, tmp_path / out, TrainConfig(steps=1, lr=0.0, device="cpu"))
        m = read_metrics(tmp_path / out)[0]
        return m["ratio_mean"], m["ratio_max"]

    mean, top = first_step(rows, "scaled")
    assert mean == pytest.approx(1.0, abs=1e-4) and top == pytest.approx(1.0, abs=1e-3)
    told: list[str] = []
    v2 = [{k: v for k, v in r.items() if k != "logprob_temperatures"} for r in rows]
    assert len(samples_from_rows(v2, warn=told.append)) == 3
    assert told and told[0].startswith("3 rows do not say which temperature")
    # trained at T = 1, the tokens' ratios are off (their mean can come out near 1: ups and downs cancel)
    assert first_step(v2, "raw")[1] > 1.005  # seen: 1.3 to 1.6
