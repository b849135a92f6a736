"""The weight-sync client (`polarproxy.train.sync`) against the SGLang and vLLM contract doubles, and the
SGLang client's record of the weight version of a call's first and last chunk."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from factories import free_port
from sglang_double import SGLangDouble
from vllm_double import VLLMDouble

from polarproxy.backends.base import GenerateParams
from polarproxy.backends.sglang import SGLangBackend
from polarproxy.redact import without_userinfo
from polarproxy.train.sync import SyncError, sync_weights

EOS = 7


def checkpoint(root: Path, name: str, version: str | None = None) -> Path:
    """A folder shaped like the trainer's OUT/step-N (the doubles read only config.json)."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if version is not None:
        (folder / "polarproxy.json").write_text(json.dumps({"weight_version": version}))
    return folder


@pytest.fixture
def double():
    with SGLangDouble(outputs=[11, 12, 13, EOS], eos_token_ids=frozenset({EOS})) as d:
        yield d


def test_sglang_sync_updates_from_disk_then_continues_and_checks_the_version(double, tmp_path):
    step = checkpoint(tmp_path, "step-3", "step-3")
    result = sync_weights(double.url, step, kind="sglang")  # the version comes from polarproxy.json
    assert [path for path, _ in double.admin] == ["/update_weights_from_disk", "/continue_generation"]
    assert double.admin[0][1] == {
        "model_path": str(step),
        "weight_version": "step-3",
        "flush_cache": True,
        "abort_all_requests": False,
    }
    assert double.admin[1][1] == {}
    assert result.weight_version == "step-3" and double.weight_version == "step-3"
    assert result.message == "Succeeded to update model weights. Weight version updated to step-3."
    assert httpx.get(f"{double.url}/get_model_info").json()["model_path"] == str(step)


def test_sglang_sync_with_a_pause_mode_pauses_first_and_keeps_the_cache_when_in_place(double, tmp_path):
    step = checkpoint(tmp_path, "step-4")
    sync_weights(double.url, step, "v4", kind="sglang", pause_mode="in_place")
    assert [(p, b.get("mode"), b.get("flush_cache")) for p, b in double.admin] == [
        ("/pause_generation", "in_place", None),
        ("/update_weights_from_disk", None, False),
        ("/continue_generation", None, None),
    ]
    assert not double.paused and double.weight_version == "v4"


def test_a_checkpoint_the_server_cannot_load_is_an_error_naming_the_url_and_its_answer(double, tmp_path):
    step = checkpoint(tmp_path, "step-5")
    double.load_problem = lambda path: f"Failed to update weights: no tensors in {path}."
    with pytest.raises(SyncError) as e:
        sync_weights(double.url, step, "v5", kind="sglang", pause_mode="abort")
    message = str(e.value)
    assert double.url in message and f"no tensors in {step}" in message
    assert double.weight_version == "default"
    assert not double.paused, "a failed sync still continues generation"


def test_a_folder_that_is_no_checkpoint_fails_before_the_server_is_asked(double, tmp_path):
    with pytest.raises(SyncError, match="does not exist"):
        sync_weights(double.url, tmp_path / "nope", "v1")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SyncError, match=r"no config\.json"):
        sync_weights(double.url, tmp_path / "empty", "v1")
    with pytest.raises(SyncError, match=r"polarproxy\.json"):
        sync_weights(double.url, checkpoint(tmp_path, "unlabelled"))  # no version given, none in the folder
    with pytest.raises(SyncError, match="Unknown backend kind 'tgi'"):
        sync_weights(double.url, checkpoint(tmp_path, "s"), "v1", kind="tgi")  # type: ignore[arg-type]
    assert double.admin == []


def test_errors_never_show_credentials(tmp_path):
    url = f"http://trainer:hunter2@127.0.0.1:{free_port()}"
    assert without_userinfo(url) == url.replace("trainer:hunter2@", "")
    with pytest.raises(SyncError) as e:
        sync_weights(url, checkpoint(tmp_path, "s"), "v1", api_key="sk-secret-key", timeout=5)
    assert "Cannot reach the backend" in str(e.value)
    assert "hunter2" not in str(e.value) and "sk-secret" not in str(e.value)


def test_the_double_holds_the_update_until_the_stream_in_flight_ends(double, tmp_path):
    double.outputs = [*range(20, 60), EOS]
    double.token_delay = 0.01
    step = checkpoint(tmp_path, "step-6")

    async def run() -> list:
        backend = SGLangBackend(double.url)
        gens = []
        try:
            async for gen in backend.generate([1, 2], GenerateParams(max_new_tokens=64), stream=True):
                if not gens:
                    asyncio.get_running_loop().run_in_executor(
                        None, lambda: sync_weights(double.url, step, "v6", kind="sglang")
                    )
                gens.append(gen)
        finally:
            await backend.aclose()
        return gens

    gens = asyncio.run(run())
    assert {g.weight_version for g in gens} == {"default"} and gens[-1].weight_version_first == "default"
    deadline = time.monotonic() + 10
    while double.weight_version != "v6" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert double.weight_version == "v6"


async def test_a_call_whose_first_and_last_chunk_report_different_versions_carries_both(double, tmp_path):
    double.outputs = [*range(20, 60), EOS]
    double.token_delay = 0.01
    step = checkpoint(tmp_path, "step-7")
    backend = SGLangBackend(double.url)
    synced = threading.Event()
    gens = []
    try:
        async for gen in backend.generate([1, 2], GenerateParams(max_new_tokens=64), stream=True):
            if not gens:  # SGLang paused in place swaps under the running request
                threading.Thread(
                    target=lambda: (
                        sync_weights(double.url, step, "v7", kind="sglang", pause_mode="in_place"),
                        synced.set(),
                    )
                ).start()
            gens.append(gen)
    finally:
        await backend.aclose()
    assert synced.wait(10)
    last = gens[-1]
    assert last.finish_reason == "stop" and len(last.output_ids) == 41
    assert (last.weight_version_first, last.weight_version) == ("default", "v7")


async def test_a_whole_answer_reports_one_version_as_first_and_last(double):
    double.weight_version = "w3"
    backend = SGLangBackend(double.url)
    try:
        (gen,) = [g async for g in backend.generate([1], GenerateParams(max_new_tokens=8), stream=False)]
    finally:
        await backend.aclose()
    assert (gen.weight_version_first, gen.weight_version) == ("w3", "w3")


def tied(folder: Path, tie: bool) -> Path:
    (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": tie}))
    return folder


def test_vllm_sync_pauses_reloads_through_the_extension_labels_and_resumes(tmp_path):
    step = tied(checkpoint(tmp_path, "step-8", "step-8"), True)
    with VLLMDouble(outputs=[1, EOS], dev_mode=True, extension=True) as d:
        result = sync_weights(d.url, step, kind="vllm")
        rpc = {"method": "polarproxy_reload_weights", "kwargs": {"weights_path": str(step)}}
        assert d.admin == [
            ("/pause?mode=wait", None),
            ("/collective_rpc", rpc),
            ("/update_weight_version", {"new_version": "step-8"}),
            ("/resume", None),
            ("/weight_info", None),
        ]
        assert (result.weight_version, d.weight_version, d.weights_path, d.paused) == (
            "step-8",
            "step-8",
            str(step),
            False,
        )


def test_vllm_without_the_extension_reloads_an_untied_model_and_refuses_a_tied_one(tmp_path):
    untied = tied(checkpoint(tmp_path, "untied"), False)
    with VLLMDouble(outputs=[1, EOS], dev_mode=True) as d:
        sync_weights(d.url, untied, "u1", kind="vllm")
        methods = [b["method"] for p, b in d.admin if p == "/collective_rpc"]
        assert methods == ["polarproxy_reload_weights", "reload_weights"]
        assert (d.weight_version, d.weights_path) == ("u1", str(untied))

        d.admin.clear()
        with pytest.raises(SyncError, match=r"--worker-extension-cls polarproxy\.backends\.vllm_worker"):
            sync_weights(d.url, tied(checkpoint(tmp_path, "tied"), True), "t1", kind="vllm")
        assert [b["method"] for p, b in d.admin if p == "/collective_rpc"] == ["polarproxy_reload_weights"]
        assert (d.weight_version, d.paused) == ("u1", False)


def test_vllm_without_dev_mode_or_with_a_failed_reload_is_a_clear_error(tmp_path):
    step = checkpoint(tmp_path, "step-9")
    with VLLMDouble(outputs=[1, EOS]) as d, pytest.raises(SyncError, match=r"VLLM_SERVER_DEV_MODE=1"):
        sync_weights(d.url, step, "v9", kind="vllm")
    with VLLMDouble(outputs=[1, EOS], dev_mode=True, extension=True) as d:
        d.reload_problem = lambda path: f"safetensors: no weights in {path}"
        with pytest.raises(SyncError) as e:
            sync_weights(d.url, step, "v9", kind="vllm")
        assert "/collective_rpc answered 500" in str(e.value) and f"no weights in {step}" in str(e.value)
        assert not d.paused and d.weight_version == "default"
    with pytest.raises(SyncError, match="pause mode"):
        sync_weights("http://127.0.0.1:1", step, "v9", kind="vllm", pause_mode="abort")
