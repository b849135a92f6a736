"""The sampling parameters the gateway owns: what it sends the backend for a call (the harness's values,
its episode's, the flags' or the full distribution, by policy), and the checks of those values for the CLI
and the control API. The proxy's per-call path calls `sent_sampling` once per call."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from polarproxy.choices import SAMPLING_POLICIES

if TYPE_CHECKING:
    from polarproxy.capture.gateway import GatewayOptions


# What the backend is sent when neither the harness nor a flag sets a value: the full distribution, never
# the server's hidden defaults (SGLang fills unset values from generation_config.json: 0.6 / 0.95 / 20 for
# Qwen3), so that what the model sampled under is known and recorded.
FULL_DISTRIBUTION = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "policy")  # an episode's `sampling` object


def check_sampling(
    temperature: float | None, top_p: float | None, top_k: int | None, *, flags: bool = True
) -> None:
    """Raise ValueError naming a sampling value out of range (`flags`: named as the CLI's flags, else as
    the control API's keys)."""
    t_name, p_name, k_name = ("--temperature", "--top-p", "--top-k") if flags else SAMPLING_KEYS[:3]
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"{t_name} {temperature} must be >= 0.")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"{p_name} {top_p} must be in (0, 1].")
    if top_k is not None and top_k < 1 and top_k != -1:
        raise ValueError(f"{k_name} {top_k} must be -1 (off) or at least 1.")


def episode_sampling(value: Any) -> dict[str, Any] | None:
    """The `sampling` object of POST /polarproxy/v1/episodes, checked: `temperature`, `top_p`, `top_k` and
    `policy` (harness | override), each optional. ValueError names the bad key or value."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(
            f"'sampling' must be a JSON object with keys {', '.join(SAMPLING_KEYS)}, got {value!r}."
        )
    unknown = sorted(set(value) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"Unknown 'sampling' keys {unknown}. Allowed: {', '.join(SAMPLING_KEYS)}.")
    numbers = {"temperature": (int, float), "top_p": (int, float), "top_k": (int,)}
    for key, types in numbers.items():
        v = value.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, types)):
            kind = "an integer" if key == "top_k" else "a number"
            raise ValueError(f"'sampling.{key}' must be {kind} or null, got {v!r}.")
    check_sampling(value.get("temperature"), value.get("top_p"), value.get("top_k"), flags=False)
    policy = value.get("policy")
    if policy is not None and policy not in SAMPLING_POLICIES:
        raise ValueError(f"'sampling.policy' {policy!r} is not one of {', '.join(SAMPLING_POLICIES)}.")
    return {k: value[k] for k in SAMPLING_KEYS if value.get(k) is not None} or None


def sent_sampling(
    conv_sampling: Any, options: GatewayOptions, episode: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The temperature, top_p and top_k sent to the backend for a call, the seed if one was sent, and who
    chose each (`chosen_by`: harness, episode (its `sampling`, over the flags), flag or default)."""
    episode = episode or {}
    policy = episode.get("policy") or options.sampling_policy
    sent: dict[str, Any] = {"chosen_by": {}}
    for name, default in FULL_DISTRIBUTION.items():
        asked = getattr(conv_sampling, name)
        given, by = (
            (episode[name], "episode") if episode.get(name) is not None else (getattr(options, name), "flag")
        )
        if given is not None and (policy == "override" or asked is None):
            value, who = given, by
        elif asked is not None:
            value, who = asked, "harness"
        else:
            value, who = default, "default"
        sent[name] = value
        sent["chosen_by"][name] = who
    if conv_sampling.seed is not None:
        sent["seed"] = conv_sampling.seed
    return sent
