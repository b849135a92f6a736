"""The current tables, as SQLAlchemy Core objects. Migrations (migrations.py) create and evolve them.

Conventions:
- times are Unix seconds (float); `*_json` columns hold JSON text;
- token arrays are packed blobs (arrays.py); a call's prompt is stored as
  `full_sequence(prompt_base_call_id)[:prompt_base_len] + prompt_tail_ids`, where
  full_sequence(c) = prompt(c) + output(c). A call with no base stores its whole prompt in the tail, so a call
  that extends an earlier one needs to store only its new tokens and storage grows linearly per episode;
- `prompt_len` and `output_len` are the rebuilt lengths, kept so counts need no blob decoding;
- `episodes.next_seq` hands out call sequence numbers (0, 1, 2, ...) atomically.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

episodes = Table(
    "episodes",
    metadata,
    Column("id", String, primary_key=True),
    Column("command_json", Text, nullable=False),
    Column("harness", String),
    Column("cwd", Text),
    Column("task", Text),
    Column("group_id", String),
    Column("reward", Float),
    Column("status", String, nullable=False),
    Column("exit_code", Integer),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("metadata_json", Text, nullable=False),
    Column("next_seq", Integer, nullable=False, server_default="0"),
    # m002_writers (store/owners.py): the process recording the episode (the migrations append after it)
    Column("writer_id", String),
    Column("stages_json", Text),  # m010: seconds per rollout stage, set when the episode ends
    Index("ix_episodes_started_at", "started_at"),
    Index("ix_episodes_status", "status"),
)

# m002_writers: one row per recording process (host, pid, process start) and the heartbeat it refreshes,
# so `polarproxy db repair` can tell a crashed proxy's running episodes from a live one's (store/owners.py).
writers = Table(
    "writers",
    metadata,
    Column("id", String, primary_key=True),
    Column("host", String, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("machine", String),
    Column("proc_start", String),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
)

calls = Table(
    "calls",
    metadata,
    Column("id", String, primary_key=True),
    Column("episode_id", String, ForeignKey("episodes.id"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("dialect", String, nullable=False),
    Column("method", String, nullable=False),
    Column("path", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("stream", Boolean, nullable=False),
    Column("status", String, nullable=False),
    Column("error", Text),
    Column("http_status", Integer),
    Column("request_headers_json", Text, nullable=False),
    Column("request_body", Text, nullable=False),
    Column("response_body", Text),
    Column("conversation_json", Text),
    Column("completion_json", Text),
    Column("prompt_base_call_id", String, ForeignKey("calls.id")),
    Column("prompt_base_len", Integer, nullable=False, server_default="0"),
    Column("prompt_tail_ids", LargeBinary, nullable=False),
    Column("prompt_len", Integer, nullable=False),
    Column("output_ids", LargeBinary, nullable=False),
    Column("output_logprobs", LargeBinary, nullable=False),
    Column("output_len", Integer, nullable=False, server_default="0"),
    Column("finish_reason", String),
    Column("weight_version", String),
    Column("backend", Text, nullable=False),
    Column("backend_kind", String, nullable=False),
    Column("fidelity", String, nullable=False),
    Column("render_mode", String, nullable=False),
    Column("extended_from", String),
    Column("render_note", Text),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("latency_ms", Float),
    Column("ttft_ms", Float),
    Column("prompt_tokens", Integer),
    Column("completion_tokens", Integer),
    Column("reward", Float),
    # m004: request_body and conversation_json as compressed edits of the prompt base's (textdelta.py);
    # then request_body is '' and conversation_json NULL. NULL: both are stored whole.
    Column("bodies_delta", LargeBinary),
    # m005: the sampling temperature the backend was asked for (NULL: the backend's default), and
    # the weight versions of a call's first and last answer chunks, which differ when weights changed mid-call
    Column("temperature", Float),
    Column("weight_version_first", String),
    Column("weight_version_last", String),
    # m007: the temperature the backend's logprobs are at (logprob_semantics.py); NULL: recorded before
    Column("logprob_temperature", Float),
    # m008: the top_p and top_k sent (top_k -1: off); NULL: recorded before, or not sent
    Column("top_p", Float),
    Column("top_k", Integer),
    Index("ix_calls_episode_seq", "episode_id", "seq", unique=True),
    Index("ix_calls_status", "status"),
    Index("ix_calls_prompt_base", "prompt_base_call_id"),  # m003: the calls that use a call as their base
)

# m005: where every reward came from, one row per reward set (the current values are
# episodes.reward and calls.reward). `call_seq` NULL: the episode's reward. `source`: command (a verifier run
# by `record --reward-cmd`), cli (`polarproxy reward`), http (POST /polarproxy/v1/episodes/ID/reward).
rewards = Table(
    "rewards",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("episode_id", String, ForeignKey("episodes.id"), nullable=False),
    Column("call_seq", Integer),
    Column("call_id", String),
    Column("reward", Float),
    Column("source", String, nullable=False),
    Column("command_json", Text),
    Column("exit_code", Integer),
    Column("output_tail", Text),
    Column("note", Text),
    Column("created_at", Float, nullable=False),
    Column("patch", Text),  # m009: the agent's changes as a diff (graded tasks)
    Column("grading_json", Text),  # m009: the grader's per-test results
    Index("ix_rewards_episode", "episode_id"),
)

# m006: episodes created through `serve`'s control API. `key_hash` is the SHA-256 of the API key the
# episode was given (the key itself is never stored); `finished_at` is set by the control API's finish.
episode_keys = Table(
    "episode_keys",
    metadata,
    Column("episode_id", String, ForeignKey("episodes.id"), primary_key=True),
    Column("key_hash", String, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("finished_at", Float),
    Index("ix_episode_keys_key_hash", "key_hash", unique=True),
)

# m006: one row per episode finished through the control API, in commit order; `seq` is the trajectory
# stream's cursor (GET /polarproxy/v1/trajectories).
episode_finishes = Table(
    "episode_finishes",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("episode_id", String, ForeignKey("episodes.id"), nullable=False),
    Column("finished_at", Float, nullable=False),
    Index("ix_episode_finishes_episode", "episode_id"),
)
