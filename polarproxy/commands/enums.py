"""The CLI's enums, each built from its tuple in `polarproxy/choices.py` (so `--help` lists what the library
accepts, and a test walks every enum against its tuple)."""

from __future__ import annotations

from enum import StrEnum

from polarproxy import choices


def choice_enum(name: str, values: tuple[str, ...]) -> type[StrEnum]:
    """A StrEnum whose values are `values` (member names with `_` for `-`: `Strategy.prefix_merge`)."""
    return StrEnum(name, [(v.replace("-", "_"), v) for v in values])  # type: ignore[return-value]


BackendKind = choice_enum("BackendKind", choices.BACKEND_KINDS)
BackendMode = choice_enum("BackendMode", choices.BACKEND_MODES)
BackendLogprobs = choice_enum("BackendLogprobs", choices.BACKEND_LOGPROBS)
PrefixPolicy = choice_enum("PrefixPolicy", choices.PREFIX_POLICIES)
ToolFormat = choice_enum("ToolFormat", choices.TOOL_FORMATS)
ReasoningFormat = choice_enum("ReasoningFormat", choices.REASONING_FORMATS)
SamplingPolicy = choice_enum("SamplingPolicy", choices.SAMPLING_POLICIES)
RewardFrom = choice_enum("RewardFrom", choices.REWARD_FROM)
Isolation = choice_enum("Isolation", choices.ISOLATIONS)
Strategy = choice_enum("Strategy", choices.STRATEGIES)
Format = choice_enum("Format", choices.EXPORT_FORMATS)
Advantages = choice_enum("Advantages", choices.ESTIMATORS)
ScaleRewards = choice_enum("ScaleRewards", choices.REWARD_SCALES)
StdEstimator = choice_enum("StdEstimator", choices.STD_ESTIMATORS)
LossAgg = choice_enum("LossAgg", choices.LOSS_AGGS)
ImportanceLevel = choice_enum("ImportanceLevel", choices.IMPORTANCE_LEVELS)
Schedule = choice_enum("Schedule", choices.SCHEDULES)
FusedLoss = choice_enum("FusedLoss", choices.FUSED_LOSS)
Device = choice_enum("Device", choices.DEVICES)
SaveDtype = choice_enum("SaveDtype", choices.SAVE_DTYPES)
SyncKind = choice_enum("SyncKind", choices.SYNC_KINDS)
PauseMode = choice_enum("PauseMode", choices.PAUSE_MODES)

# every enum above with the tuple it is built from (the test that ties them reads this)
SOURCES: dict[type[StrEnum], tuple[str, ...]] = {
    BackendKind: choices.BACKEND_KINDS,
    BackendMode: choices.BACKEND_MODES,
    BackendLogprobs: choices.BACKEND_LOGPROBS,
    PrefixPolicy: choices.PREFIX_POLICIES,
    ToolFormat: choices.TOOL_FORMATS,
    ReasoningFormat: choices.REASONING_FORMATS,
    SamplingPolicy: choices.SAMPLING_POLICIES,
    RewardFrom: choices.REWARD_FROM,
    Isolation: choices.ISOLATIONS,
    Strategy: choices.STRATEGIES,
    Format: choices.EXPORT_FORMATS,
    Advantages: choices.ESTIMATORS,
    ScaleRewards: choices.REWARD_SCALES,
    StdEstimator: choices.STD_ESTIMATORS,
    LossAgg: choices.LOSS_AGGS,
    ImportanceLevel: choices.IMPORTANCE_LEVELS,
    Schedule: choices.SCHEDULES,
    FusedLoss: choices.FUSED_LOSS,
    Device: choices.DEVICES,
    SaveDtype: choices.SAVE_DTYPES,
    SyncKind: choices.SYNC_KINDS,
    PauseMode: choices.PAUSE_MODES,
}
