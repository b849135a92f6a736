"""Run with verl's own Python (`make verl-venv`): verl 0.9.1's policy loss on polarproxy's `--format verl`
rows, through the replay agent loop's outputs (verl's `AgentLoopOutput` checks them) and the batch verl
pads them into (polarproxy/integrations/verl_replay.py `pad_batch`). Prints the loss and the shapes as JSON.

    .cache/verl-venv/bin/python tests/export/verl_policy_loss.py ROWS.parquet MODEL_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's polarproxy, not installed here

import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

from polarproxy.integrations.verl_replay import Replay, output_fields, pad_batch


def main(rows_path: str, model_dir: str) -> None:
    replay = Replay(rows_path)
    rows = [replay.next(group) for group, members in replay.groups.items() for _ in members]
    outputs = [AgentLoopOutput(**output_fields(r), metrics=AgentLoopMetrics()) for r in rows]
    fields = [
        {name: getattr(o, name) for name in output_fields(r)} for o, r in zip(outputs, rows, strict=True)
    ]
    prompt_len = max(len(f["prompt_ids"]) for f in fields) + 2  # padding on both sides is exercised
    response_len = max(len(f["response_ids"]) for f in fields) + 3
    batch = {k: torch.from_numpy(v) for k, v in pad_batch(fields, prompt_len, response_len).items()}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    # response token t sits at prompt_len + t and is predicted by the logits one position before it
    logps = torch.log_softmax(logits[:, prompt_len - 1 : prompt_len + response_len - 1].float(), dim=-1)
    log_prob = logps.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = batch["response_mask"].float()
    advantages = torch.tensor([[r["advantage"]] for r in rows], dtype=torch.float32) * mask
    config = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": None,
            "clip_ratio_high": None,
            "clip_ratio_c": 3.0,
            "global_batch_info": {},
        }
    )
    loss, _metrics = compute_policy_loss_vanilla(
        old_log_prob=batch["rollout_log_probs"].float(),
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode="token-mean",
        config=config,
    )
    print(
        json.dumps(
            {
                "loss": float(loss),
                "rows": len(rows),
                "input_ids": list(batch["input_ids"].shape),
                "trainable_tokens": int(mask.sum()),
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:3])
