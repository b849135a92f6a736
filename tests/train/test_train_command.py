"""`polarproxy train`: a run end to end from a JSONL file, and its error messages (exit 1) and usage errors
(exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from factories import QWEN3_4B
from typer.testing import CliRunner

from polarproxy.commands.train import train_command

pytest.importorskip("torch")


def _app() -> typer.Typer:
    import polarproxy.cli as cli

    if "train" in {c.name for c in cli.app.registered_commands}:
        return cli.app
    app = typer.Typer(pretty_exceptions_show_locals=False)
    app.command("train")(train_command)
    app.command("noop", hidden=True)(lambda: None)  # keep `train` a named subcommand
    return app


def _run(*args: str):
    return CliRunner().invoke(_app(), ["train", *args])


def test_train_from_a_jsonl_file_writes_a_checkpoint_and_metrics(
    tmp_path: Path, random_model_dir: Path, scored_rows, jsonl
) -> None:
    data = jsonl(tmp_path / "rows.jsonl", scored_rows)
    out = tmp_path / "run"
    args = ["--model", str(random_model_dir), "--data", str(data), "--out", str(out)]
    res = _run(*args, "--steps", "1", "--lr", "1e-4", "--device", "cpu", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{") :])
    assert summary["weight_version"] == "1" and Path(summary["checkpoint"]) == out / "step-1"
    assert summary["rows_assumed_temperature"] == 0  # v3 rows say their logprob temperature
    assert (out / "step-1" / "polarproxy.json").is_file()
    # the same rows as v2 (no logprob temperature): trained at T = 1, counted in the summary
    v2 = jsonl(
        tmp_path / "v2.jsonl",
        [{k: v for k, v in r.items() if k != "logprob_temperatures"} for r in scored_rows],
    )
    res = _run(
        *args[:2],
        "--data",
        str(v2),
        "--out",
        str(out),
        "--steps",
        "1",
        "--device",
        "cpu",
        "--resume",
        "--json",
    )
    assert res.exit_code == 0, res.output
    resumed = json.loads(res.stdout[res.stdout.index("{") :])
    assert resumed["step"] == 2 and resumed["rows_assumed_temperature"] == len(scored_rows)


def test_missing_data_file_is_an_error(tmp_path: Path, random_model_dir: Path) -> None:
    res = _run(
        "--data", str(tmp_path / "nope.jsonl"), "--model", str(random_model_dir), "--out", str(tmp_path / "o")
    )
    assert res.exit_code == 1
    assert "Error:" in res.output and "nope.jsonl" in res.output


def test_rows_without_advantages_are_an_error_naming_the_export_flag(
    tmp_path: Path, random_model_dir: Path, scored_rows, jsonl
) -> None:
    rows = [{k: v for k, v in r.items() if k != "advantage"} for r in scored_rows]
    data = jsonl(tmp_path / "rows.jsonl", rows)
    res = _run("--data", str(data), "--model", str(random_model_dir), "--out", str(tmp_path / "o"))
    assert res.exit_code == 1
    assert "Error:" in res.output and "--advantages grpo" in res.output
    assert not (tmp_path / "o").exists()


def test_unknown_loss_aggregation_is_a_usage_error(tmp_path: Path, random_model_dir: Path, jsonl) -> None:
    data = jsonl(tmp_path / "rows.jsonl", [])
    res = _run(
        "--data",
        str(data),
        "--model",
        str(random_model_dir),
        "--out",
        str(tmp_path / "o"),
        "--loss-agg",
        "sum",
    )
    assert res.exit_code == 2  # a closed choice (train/config.py), refused by the CLI with the allowed values
    assert "'sum'" in res.output and "episode-token-mean" in res.output


def test_missing_required_option_is_a_usage_error(tmp_path: Path) -> None:
    res = _run("--out", str(tmp_path / "o"))
    assert res.exit_code == 2


def test_two_data_files_with_the_same_calls_train_each_call_once(tmp_path: Path, scored_rows, jsonl) -> None:
    """A per-request and a prefix-merge export of the same episodes hold the same calls: the later file's
    overlapping rows are left out, with a warning that counts them."""
    from polarproxy.train.data import load_samples

    first = jsonl(tmp_path / "a.jsonl", scored_rows)
    again = jsonl(tmp_path / "b.jsonl", scored_rows)
    told: list[str] = []
    samples = load_samples([first, again], warn=told.append)
    assert len(samples) == len(load_samples([first]))
    assert sorted(c for s in samples for c in s.call_ids) == sorted({c for s in samples for c in s.call_ids})
    assert len(told) == 1 and f"{len(samples)} rows of {again}" in told[0]


def test_the_plan_for_qwen3_4b_counts_its_parameters_and_fits_an_80_gb_card(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B))
    res = _run("--plan", "--model", str(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["params"] == 4_022_468_096 and plan["device"] == "cuda" and plan["gradient_checkpointing"]
    assert plan["fits"] and plan["peak_gib"] <= 78  # the documented recipe (docs/rl.md)
    terms = ("weights", "gradients", "optimizer_state", "reference_model", "autocast_weight_copies")
    assert plan["peak_bytes"] >= sum(plan[f"{t}_bytes"] for t in terms) + plan["activations_bytes"]
    assert plan["optimizer_state_bytes"] == 8 * plan["params"] and plan["optimizer_temporary_bytes"] == 0
    # without gradient checkpointing the activations of 8,192 tokens no longer fit
    res = _run("--plan", "--model", str(tmp_path), "--no-gradient-checkpointing", "--json")
    assert json.loads(res.stdout)["fits"] is False
    # --kl-coef adds a bf16 reference model: at 4,096 tokens per micro-batch it fits again
    res = _run("--plan", "--model", str(tmp_path), "--kl-coef", "0.001", "--token-budget", "4096", "--json")
    kl = json.loads(res.stdout)
    assert kl["reference_model_bytes"] == 2 * kl["params"] and kl["fits"]
