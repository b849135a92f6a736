"""The snippets of docs/trainers.md, read from the page itself so the two cannot drift: each fenced block runs
as written, in page order, in one folder holding a small recorded store (`$POLARPROXY_DB`: two groups of
two episodes of examples/tool_agent.py, recorded as test_trainer_formats.py records them), bash blocks by
bash and Python blocks by this Python, with this checkout's `polarproxy` and `python` first on PATH;
`path/to/model` in the folder is the tiny model. A block whose first line is `# not run here: WHY` is only
parsed (bash -n, compile, YAML), and must say why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docblocks import NOT_RUN, code_blocks
from factories import TWO_GROUPS, record_groups

from polarproxy.integrations.verl_replay import AGENT_NAME

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "trainers.md"
RUNNERS = ("bash", "python")  # the languages a block may be run in; others must say why they are not


def test_each_block_of_the_trainer_docs_runs_here_or_says_why_not_and_parses() -> None:
    blocks = code_blocks(DOC)
    for block in blocks:
        where = block.where
        reason = block.skipped_because
        if reason is None:
            assert block.lang in RUNNERS, f"{where}: runs in none of {RUNNERS}; label it `{NOT_RUN} WHY`."
        else:
            assert len(reason) > 10, f"{where}: `{NOT_RUN}` says no reason."
        if block.lang == "bash":
            res = subprocess.run(
                ["bash", "-n", "-c", block.code], capture_output=True, text=True, check=False
            )
            assert res.returncode == 0, f"{where}: {res.stderr}"
        elif block.lang == "python":
            compile(block.code, where, "exec")
        elif block.lang == "yaml":
            loops = yaml.safe_load(block.code)  # verl's agent loop list: the name the dataset rows ask for
            assert [loop["name"] for loop in loops] == [AGENT_NAME], where
    runnable = [b for b in blocks if b.skipped_because is None]
    assert len(runnable) >= 5, runnable  # each trainer's export at least


@pytest.mark.integration
def test_the_runnable_snippets_of_the_trainer_docs_run_as_written(backend, tiny_model_dir, tmp_path) -> None:
    db = record_groups(backend.url, tiny_model_dir, tmp_path, TWO_GROUPS)
    here = tmp_path / "docs"
    (here / "path" / "to").mkdir(parents=True)
    (here / "path" / "to" / "model").symlink_to(tiny_model_dir)
    env = {
        **os.environ,
        "POLARPROXY_DB": str(db),
        "PYTHONPATH": str(REPO),  # this checkout's polarproxy, run from the folder
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HF_HUB_OFFLINE": "1",
    }
    ran = []
    for block in code_blocks(DOC):
        if block.skipped_because is not None:
            continue
        argv = ["bash", "-euo", "pipefail", "-c"] if block.lang == "bash" else [sys.executable, "-c"]
        res = subprocess.run(
            [*argv, block.code], cwd=here, env=env, capture_output=True, text=True, timeout=300
        )
        assert res.returncode == 0, f"{DOC.name}:{block.line}:\n{block.code}\n{res.stderr[-3000:]}"
        ran.append(block.line)
    made = {"rollouts.parquet", "train.parquet", "steps", "episodes.trl.jsonl", "episodes.nemo-rl.jsonl"}
    assert made | {"episodes.openrlhf.jsonl"} <= {p.name for p in here.iterdir()}, ran
    assert [p.name for p in (here / "steps").iterdir()] == ["0.pt"]  # two groups: one step of up to 8
