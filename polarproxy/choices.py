"""Every closed choice polarproxy offers, declared once: a `Literal` type and the tuple of its values.

The library checks values against these tuples, the CLI builds its enums from them (`commands/enums.py`),
the addon's options and the control API's parameters name them in their errors, and a test walks every CLI
enum against its tuple. A new choice goes here first. This module imports nothing of polarproxy.
"""

from __future__ import annotations

from typing import Literal, get_args

# --- the proxy path -------------------------------------------------------------------------------------
BackendKind = Literal["sglang", "vllm", "local"]  # what serves --backend
BACKEND_KINDS: tuple[BackendKind, ...] = get_args(BackendKind)
BackendMode = Literal["tokens", "chat"]  # tokens: polarproxy renders; chat: the server does
BACKEND_MODES: tuple[BackendMode, ...] = get_args(BackendMode)
PrefixPolicy = Literal["extend", "fresh"]  # extend: T2; fresh: every call rendered as the template does
PREFIX_POLICIES: tuple[PrefixPolicy, ...] = get_args(PrefixPolicy)
ToolFormat = Literal["hermes", "qwen-xml", "llama-json", "deepseek", "mistral", "harmony"]
TOOL_FORMATS: tuple[ToolFormat, ...] = get_args(ToolFormat)
BackendLogprobs = Literal["scaled", "raw"]  # scaled: log_softmax(logits / T); raw: log_softmax(logits)
BACKEND_LOGPROBS: tuple[BackendLogprobs, ...] = get_args(BackendLogprobs)
# What each backend kind returns by default: SGLang its sampler's scaled logprobs (unless the server runs
# with SGLANG_RETURN_ORIGINAL_LOGPROB=1), vLLM raw ones (its default `logprobs_mode`), the local backend
# SGLang's.
DEFAULT_BACKEND_LOGPROBS: dict[str, BackendLogprobs] = {"sglang": "scaled", "local": "scaled", "vllm": "raw"}
GREEDY_TEMPERATURE = 1e-6  # SGLang's _SAMPLING_EPS: a temperature below it is greedy, its logprobs at T = 1
SamplingPolicy = Literal["harness", "override"]  # whose sampling value wins: the harness's, or the flag's
SAMPLING_POLICIES: tuple[SamplingPolicy, ...] = get_args(SamplingPolicy)
ReasoningFormat = Literal["think", "none"]
REASONING_FORMATS: tuple[ReasoningFormat, ...] = get_args(ReasoningFormat)

# --- rewards and rollout --------------------------------------------------------------------------------
RewardFrom = Literal["exit", "stdout"]  # how a verifier command gives its reward
REWARD_FROM: tuple[RewardFrom, ...] = get_args(RewardFrom)
Isolation = Literal["none", "bwrap", "docker", "apptainer"]  # what each rollout episode runs in
ISOLATIONS: tuple[Isolation, ...] = get_args(Isolation)
GradeFrom = Literal["workspace", "patch"]  # what a rollout task's verifier grades (rollout/agent_changes.py)
GRADE_FROM: tuple[GradeFrom, ...] = get_args(GradeFrom)

# --- reconstruction and export --------------------------------------------------------------------------
Strategy = Literal["per-request", "prefix-merge"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
ExportFormat = Literal["jsonl", "parquet", "sft", "slime", "verl", "trl", "nemo-rl", "openrlhf"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = get_args(ExportFormat)
TokenFormat = Literal["jsonl", "parquet"]  # polarproxy's own token rows (schemas/export-row.v3.json)
TOKEN_FORMATS: tuple[TokenFormat, ...] = get_args(TokenFormat)
TrainerFormat = Literal["slime", "verl", "trl", "nemo-rl", "openrlhf"]  # each trainer's own rows
TRAINER_FORMATS: tuple[TrainerFormat, ...] = get_args(TrainerFormat)
Estimator = Literal["none", "grpo", "rloo"]  # advantages
ESTIMATORS: tuple[Estimator, ...] = get_args(Estimator)
RewardScale = Literal["group", "batch", "none"]  # what GRPO divides rewards by
REWARD_SCALES: tuple[RewardScale, ...] = get_args(RewardScale)
StdEstimator = Literal["sample", "population"]  # GRPO's std: n - 1 (verl, slime, TRL) or n
STD_ESTIMATORS: tuple[StdEstimator, ...] = get_args(StdEstimator)
GroupsMode = Literal["any", "complete"]  # the trajectory stream: any finished episode, or whole groups only
GROUPS_MODES: tuple[GroupsMode, ...] = get_args(GroupsMode)

# --- training and weight sync ---------------------------------------------------------------------------
LossAgg = Literal["token-mean", "seq-mean-token-mean", "episode-token-mean", "dr-grpo"]
LOSS_AGGS: tuple[LossAgg, ...] = get_args(LossAgg)
ImportanceLevel = Literal["token", "sequence"]
IMPORTANCE_LEVELS: tuple[ImportanceLevel, ...] = get_args(ImportanceLevel)
Schedule = Literal["constant", "linear", "cosine"]
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
FusedLoss = Literal["auto", "liger", "off"]
FUSED_LOSS: tuple[FusedLoss, ...] = get_args(FusedLoss)
Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[Device, ...] = get_args(Device)
SaveDtype = Literal["auto", "bfloat16", "float32"]  # a checkpoint's model weights (what the backend loads)
SAVE_DTYPES: tuple[SaveDtype, ...] = get_args(SaveDtype)
SyncKind = Literal["sglang", "local", "vllm"]  # what takes `train --sync`'s checkpoints
SYNC_KINDS: tuple[SyncKind, ...] = get_args(SyncKind)
PauseMode = Literal["abort", "retract", "in_place"]  # how generation pauses around a weight update
PAUSE_MODES: tuple[PauseMode, ...] = get_args(PauseMode)


def one_of(allowed: tuple[str, ...]) -> str:
    """`'a', 'b', 'c'`: the allowed values as an error message lists them."""
    return ", ".join(repr(a) for a in allowed)


def check_choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    """`value` when it is one of `allowed`; else ValueError naming it, `what` it is, and the allowed values."""
    if value not in allowed:
        raise ValueError(f"Unknown {what} {value!r}. Must be one of {one_of(allowed)}.")
    return value
