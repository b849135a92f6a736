"""Which temperature a backend's logprobs are at: SGLang (and the local backend) return its sampler's
log_softmax(logits / T), vLLM raw log_softmax(logits), unless a server is configured otherwise
(`--backend-logprobs`). The trainer scores each token at the same temperature (train/logprobs.py)."""

from __future__ import annotations

from polarproxy.choices import BACKEND_LOGPROBS, DEFAULT_BACKEND_LOGPROBS, GREEDY_TEMPERATURE


def default_semantics(backend_kind: str) -> str | None:
    """`scaled` or `raw` for a backend kind (chat mode, `vllm-chat`, like its server's), None for one that
    returns no logprobs (a provider)."""
    return DEFAULT_BACKEND_LOGPROBS.get(backend_kind.removesuffix("-chat"))


def logprob_temperature(
    backend_kind: str, temperature: float | None, semantics: str | None = None
) -> float | None:
    """The temperature a call's logprobs are at: its sampling temperature where the backend returns scaled
    logprobs (1 for a greedy call, as SGLang treats it), 1 where it returns raw ones; None where unknown (a
    scaling backend sent no temperature, whose server's default applied; a provider). `semantics`: the
    server's (`--backend-logprobs`), else the kind's default."""
    semantics = semantics or default_semantics(backend_kind)
    if semantics is not None and semantics not in BACKEND_LOGPROBS:
        raise ValueError(
            f"Unknown backend logprobs {semantics!r}. Must be one of {', '.join(BACKEND_LOGPROBS)}."
        )
    if semantics == "raw":
        return 1.0
    if semantics is None or temperature is None:
        return None
    return 1.0 if temperature < GREEDY_TEMPERATURE else float(temperature)
