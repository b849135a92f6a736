"""verl trained on `export --format verl` rows: an agent loop that answers each prompt with the next recorded
trajectory of that prompt's group, as verl's `AgentLoopOutput`, and the padded batch verl builds from such
outputs, for a user who builds a `DataProto` by hand.

verl has no command that trains on pre-generated rollouts; an agent loop is its way in. `write_dataset`
writes the train file verl reads: one row per group, naming the loop (`agent_name`) and the group
(`polarproxy_group`); with `actor_rollout_ref.rollout.n` the groups' size, verl asks for each group's
samples and `ReplayAgentLoop` returns its recorded rows in order, with the recorded `reward_score` (so no
reward model runs). Register the loop through `actor_rollout_ref.rollout.agent.agent_loop_config_path`, a
YAML list holding `{name: polarproxy_replay, _target_: polarproxy.integrations.verl_replay.ReplayAgentLoop,
rows: PATH}` (docs/trainers.md). One agent-loop worker (`agent.num_workers=1`): each worker replays from
its own cursor.

verl is imported only when `ReplayAgentLoop` is looked up (module `__getattr__`), in verl's own process.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from polarproxy.integrations.replay import GroupReplay

AGENT_NAME = "polarproxy_replay"
GROUP_FIELD = "polarproxy_group"
OUTPUT_FIELDS = (
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "reward_score",
    "num_turns",
)


def load_groups(path: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """The rows of a `--format verl` file by `uid` (their group), in file order."""
    import pyarrow.parquet as pq

    groups: dict[str, list[dict[str, Any]]] = {}
    for row in pq.read_table(path).to_pylist():
        groups.setdefault(row["uid"], []).append(row)
    if not groups:
        raise ValueError(f"{path} holds no rows; export some with polarproxy export --format verl.")
    return groups


def write_dataset(rows_path: str | os.PathLike[str], out: str | os.PathLike[str]) -> int:
    """verl's train file for replaying `rows_path`: one row per group; returns the groups' largest size,
    the `actor_rollout_ref.rollout.n` to run with."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    groups = load_groups(rows_path)
    table = pa.Table.from_pylist(
        [
            {
                "data_source": "polarproxy",
                "prompt": [{"role": "user", "content": group}],
                "agent_name": AGENT_NAME,
                GROUP_FIELD: group,
            }
            for group in groups
        ]
    )
    pq.write_table(table, out)
    return max(len(rows) for rows in groups.values())


def output_fields(row: dict[str, Any]) -> dict[str, Any]:
    """`AgentLoopOutput`'s fields of one `--format verl` row (all but `metrics`)."""
    return {name: row[name] for name in OUTPUT_FIELDS}


class Replay(GroupReplay):
    """The rows of a `--format verl` file by `uid`, replayed in order (replay.py)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(load_groups(path), "build the dataset with write_dataset")


def pad_batch(
    rows: list[dict[str, Any]], prompt_length: int, response_length: int, pad_token_id: int = 0
) -> dict[str, np.ndarray]:
    """The tensors verl's agent loop makes of these outputs (`_agent_loop_postprocess`): `prompts` left-padded
    to `prompt_length`, `responses`, `response_mask` and `rollout_log_probs` right-padded to
    `response_length` (logprobs with 0.0), `input_ids` = prompts + responses, `attention_mask`,
    `position_ids` (counting real tokens from 0), and `rm_scores` with the reward on the last response token.
    ValueError for a row longer than its side."""
    n = len(rows)
    prompts = np.full((n, prompt_length), pad_token_id, dtype=np.int64)
    prompt_mask = np.zeros((n, prompt_length), dtype=np.int64)
    responses = np.full((n, response_length), pad_token_id, dtype=np.int64)
    response_attention = np.zeros((n, response_length), dtype=np.int64)
    response_mask = np.zeros((n, response_length), dtype=np.int64)
    logprobs = np.zeros((n, response_length), dtype=np.float32)
    rm_scores = np.zeros((n, response_length), dtype=np.float32)
    for i, row in enumerate(rows):
        p, r = row["prompt_ids"], row["response_ids"]
        if len(p) > prompt_length or len(r) > response_length:
            raise ValueError(
                f"row {i} has a {len(p)}-token prompt and a {len(r)}-token response; the batch holds "
                f"{prompt_length} and {response_length}. Raise data.max_prompt_length / max_response_length."
            )
        prompts[i, prompt_length - len(p) :] = p
        prompt_mask[i, prompt_length - len(p) :] = 1
        responses[i, : len(r)] = r
        response_attention[i, : len(r)] = 1
        response_mask[i, : len(r)] = row["response_mask"]
        logprobs[i, : len(r)] = row["response_logprobs"]
        if row.get("reward_score") is not None and len(r):
            rm_scores[i, len(r) - 1] = row["reward_score"]
    attention = np.concatenate([prompt_mask, response_attention], axis=1)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask * response_attention,
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention,
        "position_ids": np.clip(np.cumsum(attention, axis=1) - 1, 0, None),
        "rollout_log_probs": logprobs,
        "rm_scores": rm_scores,
    }


@functools.cache
def _replay_agent_loop() -> type:
    from verl.experimental.agent_loop.agent_loop import (  # type: ignore[import-not-found]
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )

    @register(AGENT_NAME)
    class ReplayAgentLoop(AgentLoopBase):  # type: ignore[misc,valid-type]
        """Each call: the next recorded row of the prompt's group (`polarproxy_group`)."""

        def __init__(self, *args: Any, rows: str | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            path = rows or os.environ.get("POLARPROXY_VERL_ROWS")
            if not path:
                raise ValueError(
                    "ReplayAgentLoop needs rows: PATH in its agent loop config (a --format verl file)"
                )
            self.replay = Replay(path)

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            row = self.replay.next(kwargs[GROUP_FIELD])
            return AgentLoopOutput(**output_fields(row), metrics=AgentLoopMetrics())

    return ReplayAgentLoop


def __getattr__(name: str) -> Any:
    if name == "ReplayAgentLoop":
        return _replay_agent_loop()
    raise AttributeError(name)
