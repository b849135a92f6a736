"""The training loop on the random-weights tiny model: a step moves the weights, checkpoints reload to the
same logprobs and carry their weight version, metrics.jsonl has every key, --resume continues."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from polarproxy.train import TrainConfig, train  # noqa: E402
from polarproxy.train.batching import packed_batch, step_weights  # noqa: E402
from polarproxy.train.checkpoint import META, TRAINER_STATE, read_version  # noqa: E402
from polarproxy.train.data import DataError, samples_from_rows  # noqa: E402
from polarproxy.train.logprobs import batch_logprobs  # noqa: E402
from polarproxy.train.loop import TrainError, lr_at  # noqa: E402
from polarproxy.train.metrics import METRIC_KEYS, read_metrics  # noqa: E402

CFG = dict(lr=1e-3, token_budget=96, logprob_chunk=16, device="cpu")


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def test_one_step_moves_the_parameters_and_writes_a_loadable_checkpoint(
    tmp_path: Path, random_model_dir: Path, scored_rows
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    result = train(scored_rows, random_model_dir, out, TrainConfig(steps=1, **CFG))
    assert result.checkpoint == out / "step-1" and result.weight_version == "1" and result.step == 1
    before, after = _weights(random_model_dir), _weights(result.checkpoint)
    assert before.keys() == after.keys()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) >= len(before) // 2, moved

    # a model folder: tokenizer, chat template, weight version
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "config.json",
        TRAINER_STATE,
    ):
        assert (result.checkpoint / name).is_file(), name
    assert json.loads((result.checkpoint / META).read_text())["weight_version"] == "1"
    assert read_version(result.checkpoint) == 1
    tok = AutoTokenizer.from_pretrained(str(result.checkpoint))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)

    # reloaded, it gives the trained logprobs (not the starting ones)
    samples = samples_from_rows(scored_rows)
    order = list(range(len(samples)))
    mb = packed_batch(samples, order, step_weights(samples, "token-mean"))
    reloaded = AutoModelForCausalLM.from_pretrained(str(result.checkpoint), dtype=torch.float32).eval()
    again = AutoModelForCausalLM.from_pretrained(str(result.checkpoint), dtype=torch.float32).eval()
    with torch.no_grad():
        lp1, _ = batch_logprobs(reloaded, mb)
        lp2, _ = batch_logprobs(again, mb)
    assert torch.equal(lp1, lp2)
    assert (lp1 - mb.behaviour_logp).abs().max() > 1e-4  # the update changed the policy

    (m,) = read_metrics(out)
    assert set(METRIC_KEYS) <= m.keys()
    assert m["step"] == 1 and m["weight_version"] == "1"
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # behaviour logprobs are the model's own
    assert m["clip_frac"] == 0.0 and m["staleness"] == 0 and m["kl"] is None
    assert m["grad_norm"] > 0 and m["tokens_per_s"] > 0 and m["entropy"] > 0
    assert m["reward_mean"] == pytest.approx(sum(r["reward"] for r in scored_rows) / len(scored_rows))


def test_resume_continues_the_step_count_and_staleness_grows(
    tmp_path: Path, random_model_dir: Path, scored_rows
) -> None:
    out = tmp_path / "run"
    train(scored_rows, random_model_dir, out, TrainConfig(steps=2, save_every=1, rows_per_step=3, **CFG))
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("step-")) == ["step-1", "step-2"]
    with pytest.raises(TrainError, match="--resume"):
        train(scored_rows, random_model_dir, out, TrainConfig(steps=1, **CFG))
    result = train(scored_rows, random_model_dir, out, TrainConfig(steps=1, resume=True, kl_coef=0.1, **CFG))
    assert result.step == 3 and result.checkpoint == out / "step-3" and result.steps_run == 1
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["weight_version"] for m in metrics] == ["1", "2", "3"]
    # rows sampled by version 0, trained at versions 0, 1, 2
    assert [m["staleness"] for m in metrics] == [0, 1, 2]
    assert metrics[2]["kl"] is not None and metrics[2]["kl"] >= 0
    assert metrics[2]["ratio_mean"] != pytest.approx(1.0, abs=1e-6)  # the policy moved since sampling
    assert all(set(METRIC_KEYS) <= m.keys() for m in metrics)


def test_rows_without_advantages_are_refused_with_the_export_flag_to_use(
    random_model_dir: Path, scored_rows
) -> None:
    rows = [{k: v for k, v in r.items() if k != "advantage"} for r in scored_rows]
    with pytest.raises(DataError, match="--advantages grpo"):
        samples_from_rows(rows)


def test_warmup_then_cosine_schedule() -> None:
    cfg = TrainConfig(lr=1.0, warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg, horizon=14) for s in range(1, 15)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] < 1.0 and lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:]))
    assert lr_at(100, TrainConfig(lr=0.5), horizon=1) == 0.5


def test_keep_last_prunes_old_checkpoints_and_resume_takes_the_newest_with_optimizer_state(
    tmp_path: Path, random_model_dir: Path, scored_rows
) -> None:
    """Only the newest --keep-last checkpoints stay, and the newest resumable one is never deleted; the
    checkpoints are group-readable (a backend that runs as another user loads them)."""
    import stat

    from polarproxy.train import checkpoint as ckpt
    from polarproxy.train.data import samples_from_rows
    from polarproxy.train.loop import Trainer

    out = tmp_path / "run"
    samples = samples_from_rows(scored_rows)
    trainer = Trainer(random_model_dir, out, TrainConfig(keep_last=2, **CFG))
    trainer.run_step(samples, [0], 10)
    trainer.save(optimizer_state=True)  # step-1: resumable
    for _ in range(3):  # steps 2-4 with weights only, as `train --follow --sync` writes them
        trainer.run_step(samples, [0], 10)
        trainer.save(optimizer_state=False)
    kept = [p.name for _, p in ckpt.checkpoints(out)]
    assert kept == ["step-1", "step-3", "step-4"]  # the newest two, and the resumable one
    assert ckpt.resume_checkpoint(out)[1].name == "step-1"
    mode = (out / "step-4").stat().st_mode
    assert mode & stat.S_IRGRP and mode & stat.S_IXGRP and not mode & stat.S_IWOTH
    assert all(f.stat().st_mode & stat.S_IRGRP for f in (out / "step-4").iterdir())
    result = train(scored_rows, random_model_dir, out, TrainConfig(steps=1, resume=True, keep_last=2, **CFG))
    assert result.step == 2 and (out / "step-2" / TRAINER_STATE).is_file()  # continued from step-1


def test_bf16_checkpoints_keep_the_fp32_master_weights_that_resume_continues_from(
    tmp_path: Path, random_model_dir: Path, scored_rows
) -> None:
    """--save-dtype bfloat16 (the default on CUDA): the model folder the backend loads holds bf16 weights
    (half the bytes), the fp32 master weights go with the optimizer state, and --resume continues from
    them, not from the bf16 cast (with --lr 0 the next step's master weights are step 1's exactly)."""
    out = tmp_path / "run"
    train(scored_rows, random_model_dir, out, TrainConfig(steps=1, save_dtype="bfloat16", **CFG))
    folder = _weights(out / "step-1")
    assert {t.dtype for t in folder.values() if t.is_floating_point()} == {torch.bfloat16}
    master = torch.load(out / "step-1" / TRAINER_STATE, weights_only=False)["master_weights"]
    assert {t.dtype for t in master.values() if t.is_floating_point()} == {torch.float32}
    moved = [
        k
        for k, v in master.items()
        if v.is_floating_point() and not torch.equal(v, v.to(torch.bfloat16).float())
    ]
    assert moved  # the fp32 weights are not all representable in bf16: resuming from the cast would lose them
    cfg = {**CFG, "lr": 0.0}
    train(scored_rows, random_model_dir, out, TrainConfig(steps=1, resume=True, save_dtype="bfloat16", **cfg))
    resumed = torch.load(out / "step-2" / TRAINER_STATE, weights_only=False)["master_weights"]
    assert all(torch.equal(resumed[k], master[k]) for k in master)
    train(scored_rows, random_model_dir, tmp_path / "fp32", TrainConfig(steps=1, **CFG))  # the CPU default
    assert "master_weights" not in torch.load(
        tmp_path / "fp32" / "step-1" / TRAINER_STATE, weights_only=False
    )
    assert {t.dtype for t in _weights(tmp_path / "fp32" / "step-1").values()} == {torch.float32}
