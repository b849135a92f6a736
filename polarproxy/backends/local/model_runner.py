"""Token-level generation over a transformers causal LM: chunked prefill, KV cache, SGLang sampling.

`ModelRunner.generate` yields one `GenStep` per sampled token with its logprob at the sampling
temperature, as SGLang returns by default (``log_softmax(logits / T)`` in float32, T = 1 for a greedy
request; before top-k/top-p/min-p or min-new-tokens masking), and the SGLang finish reason on the last
step. `ModelRunner.score` is a teacher-forced pass that returns the same logprobs for given output tokens
and temperature. torch and transformers are imported lazily.
"""

from __future__ import annotations

import inspect
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarproxy.choices import GREEDY_TEMPERATURE

DEFAULT_PREFILL_CHUNK = 1024
# On CPU, models below this size decode faster on one thread (thread wake-ups dominate tiny kernels).
SINGLE_THREAD_DECODE_MAX_PARAMS = 200_000_000


class SamplingParamsError(ValueError):
    """A sampling parameter is unknown or out of range (the server answers 400)."""


@dataclass
class SamplingParams:
    """The SGLang 0.5 sampling parameters this backend implements (defaults are SGLang's)."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    n: int = 1

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SamplingParams:
        """Parse a request's ``sampling_params``; unknown keys and bad values raise SamplingParamsError."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise SamplingParamsError(f"sampling_params must be an object, got {type(data).__name__}.")
        allowed = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise SamplingParamsError(
                f"SamplingParams.__init__() got an unexpected keyword argument {unknown[0]!r}. "
                f"Allowed sampling params: {', '.join(sorted(allowed))}."
            )
        p = cls()
        for key, value in data.items():
            if value is None and key in ("stop", "stop_token_ids", "sampling_seed"):
                continue
            setattr(p, key, value)
        p._normalize()
        return p

    def _normalize(self) -> None:
        def integer(name: str) -> int:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    return int(value)
                raise SamplingParamsError(f"{name} must be an integer, got {value!r}.")
            return value

        def number(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SamplingParamsError(f"{name} must be a number, got {value!r}.")
            return float(value)

        def flag(name: str) -> bool:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise SamplingParamsError(f"{name} must be true or false, got {value!r}.")
            return value

        self.max_new_tokens = integer("max_new_tokens")
        self.min_new_tokens = integer("min_new_tokens")
        self.top_k = integer("top_k")
        self.n = integer("n")
        self.temperature = number("temperature")
        self.top_p = number("top_p")
        self.min_p = number("min_p")
        for name in ("ignore_eos", "skip_special_tokens", "no_stop_trim"):
            setattr(self, name, flag(name))
        if self.sampling_seed is not None:
            self.sampling_seed = integer("sampling_seed")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise SamplingParamsError(
                f"stop must be a non-empty string or a list of them, got {self.stop!r}."
            )
        if isinstance(self.stop_token_ids, int) and not isinstance(self.stop_token_ids, bool):
            self.stop_token_ids = [self.stop_token_ids]
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids
        ):
            raise SamplingParamsError(
                f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}."
            )
        if self.temperature < 0.0:
            raise SamplingParamsError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise SamplingParamsError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < 1 and self.top_k != -1:
            raise SamplingParamsError(f"top_k must be -1 (disable), or at least 1, got {self.top_k}.")
        if self.max_new_tokens < 0:
            raise SamplingParamsError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise SamplingParamsError(
                f"min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], got {self.min_new_tokens}."
            )
        if self.n != 1:
            raise SamplingParamsError(f"n must be 1 on the local backend, got {self.n}.")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def logprob_temperature(self) -> float:
        """The temperature the returned logprobs are at: SGLang's, which treats a temperature below 1e-6 as
        greedy at temperature 1."""
        return 1.0 if self.temperature < GREEDY_TEMPERATURE else self.temperature


@dataclass
class GenStep:
    """One sampled token. `finish_reason` is set on the last step only (SGLang's shape)."""

    token_id: int
    logprob: float
    finish_reason: dict[str, Any] | None = None


class ModelRunner:
    """A tokenizer and causal LM loaded from a folder, on CUDA when available, else CPU in float32.

    One generation or scoring pass runs at a time (an internal lock); `busy` says whether one runs.
    """

    def __init__(
        self,
        model_dir: Path | str,
        *,
        device: str | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ) -> None:
        import torch
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.prefill_chunk = prefill_chunk
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.lock = threading.Lock()
        self.busy = False
        self._load_model(self.model_dir)

    # -- loading ---------------------------------------------------------------------------------------

    def _load_model(self, path: Path) -> None:
        self._install(self._read_model(path), path)

    def _read_model(self, path: Path) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        dtype: Any = torch.float32 if self.device.type == "cpu" else "auto"
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        return model.to(self.device).eval()

    def _install(self, model: Any, path: Path) -> None:
        from transformers import GenerationConfig

        self.model = model
        self.model_dir = path
        config = model.config
        self.vocab_size = int(config.vocab_size)
        self.context_length = int(
            getattr(config, "max_position_embeddings", None) or self.tokenizer.model_max_length
        )
        eos: set[int] = set()
        try:
            gen_eos = GenerationConfig.from_pretrained(str(path)).eos_token_id
        except OSError:
            gen_eos = None
        for value in (gen_eos, config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, list | tuple):
                eos.update(int(v) for v in value)
        self.eos_token_ids = sorted(eos)
        n_params = sum(p.numel() for p in model.parameters())
        self._single_thread_decode = self.device.type == "cpu" and n_params <= SINGLE_THREAD_DECODE_MAX_PARAMS
        params = inspect.signature(type(model).forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def load_checkpoint(self, path: Path | str) -> Any:
        """Read the model in `path` without serving it yet. Raises ValueError unless `path` is a model
        folder (save_pretrained) with the served model's architecture and parameter shapes; the model
        that serves now is untouched either way."""
        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"Model folder '{path}' does not exist.")
        if not (path / "config.json").is_file():
            raise ValueError(
                f"'{path}' is not a model folder: it has no config.json (write it with save_pretrained)."
            )
        try:
            model = self._read_model(path)
        except Exception as e:  # transformers raises OSError, ValueError, KeyError, safetensors errors...
            raise ValueError(f"Cannot load the model in '{path}': {e}") from e
        if type(model) is not type(self.model):
            raise ValueError(
                f"'{path}' holds a {type(model).__name__}, but the backend serves a {type(self.model).__name__}: "
                "give a checkpoint of the served model."
            )
        new_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        old_shapes = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}
        if new_shapes != old_shapes:
            differ = sorted(
                k for k in new_shapes.keys() | old_shapes.keys() if new_shapes.get(k) != old_shapes.get(k)
            )
            raise ValueError(
                f"'{path}' is not a checkpoint of the served model: {len(differ)} parameter(s) differ in name "
                f"or shape (first: {differ[0]})."
            )
        return model

    def install_checkpoint(self, model: Any, path: Path | str, *, wait: bool = True) -> None:
        """Serve `model` (from `load_checkpoint(path)`) from now on. With `wait`, first wait for a running
        generation or scoring pass to end; without it the swap is immediate (a paused generation then
        continues on the new weights)."""
        if wait:
            with self.lock:
                self._install(model, Path(path))
        else:
            self._install(model, Path(path))

    def reload_weights(self, path: Path | str) -> None:
        """Load new weights (same tokenizer) from `path`, waiting for any running generation. The old
        weights keep serving when `path` cannot be loaded (ValueError)."""
        self.install_checkpoint(self.load_checkpoint(path), path)

    # -- helpers ---------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token IDs of `text` without special-token additions."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # transformers < 4.56
            return DynamicCache()

    def _forward(self, ids: list[int], cache: Any, keep: int) -> Any:
        """Run `ids` through the model on top of `cache`; float32 logits of the last `keep` positions."""
        import torch

        with torch.inference_mode():
            out = self.model(
                input_ids=torch.tensor([ids], dtype=torch.long, device=self.device),
                use_cache=True,
                logits_to_keep=keep,
                **{self._cache_kwarg: cache},
            )
            return out.logits[0].float()

    def _prefill(
        self, ids: list[int], cache: Any, keep: int, should_stop: Callable[[], bool] | None
    ) -> Any | None:
        """Chunked prefill of `ids`; logits of the last `keep` positions (None when stopped)."""
        import torch

        pieces = []
        for start in range(0, len(ids), self.prefill_chunk):
            if should_stop is not None and should_stop():
                return None
            chunk = ids[start : start + self.prefill_chunk]
            need = min(len(chunk), max(0, keep - (len(ids) - start - len(chunk))))
            logits = self._forward(chunk, cache, max(need, 1))
            if need:
                pieces.append(logits[-need:])
        return torch.cat(pieces) if pieces else None

    def _check_ids(self, ids: Sequence[int], what: str) -> None:
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise ValueError(f"{what} holds {t!r}, which is not a token ID in [0, {self.vocab_size}).")

    # -- scoring ---------------------------------------------------------------------------------------

    def score(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], *, temperature: float = 1.0
    ) -> list[float]:
        """Teacher-forced logprob (float32 ``log_softmax(logits / temperature)``) of each output token given
        the prompt and the output tokens before it."""
        import torch

        prompt_ids, output_ids = list(prompt_ids), list(output_ids)
        if not output_ids:
            return []
        if not prompt_ids:
            raise ValueError("score() needs at least one prompt token.")
        self._check_ids(prompt_ids, "prompt_ids")
        self._check_ids(output_ids, "output_ids")
        seq = prompt_ids + output_ids
        with self.lock:
            logits = self._prefill(seq[:-1], self._new_cache(), len(output_ids), None)
        assert logits is not None
        logprobs = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
        targets = torch.tensor(output_ids, device=logprobs.device)
        return logprobs.gather(1, targets[:, None])[:, 0].tolist()

    # -- generation ------------------------------------------------------------------------------------

    def generate(
        self,
        input_ids: Sequence[int],
        params: SamplingParams,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[GenStep]:
        """Sample tokens after `input_ids`, one `GenStep` at a time.

        Stops on the eos IDs of the generation config and `params.stop_token_ids` (unless
        `ignore_eos`), on a stop string, at `max_new_tokens` or at the context length; the last step
        carries the finish reason. When `should_stop()` turns true (checked between prefill chunks
        and before each token) the generator ends without a finish reason.
        """
        prompt = list(input_ids)
        self.check_prompt(prompt)
        return self._generate(prompt, params, should_stop)

    def check_prompt(self, prompt: Sequence[int]) -> None:
        """Raise ValueError unless `prompt` is a non-empty list of token IDs shorter than the context."""
        if not prompt:
            raise ValueError("The input is empty: give at least one token.")
        self._check_ids(prompt, "input_ids")
        if len(prompt) >= self.context_length:
            raise ValueError(
                f"The input ({len(prompt)} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )

    def _generate(
        self, prompt: list[int], params: SamplingParams, should_stop: Callable[[], bool] | None
    ) -> Iterator[GenStep]:
        import torch

        if params.max_new_tokens == 0:
            return
        stop_ids = set() if params.ignore_eos else set(params.stop_token_ids) | set(self.eos_token_ids)
        mask_ids = sorted(
            t for t in set(params.stop_token_ids) | set(self.eos_token_ids) if t < self.vocab_size
        )
        stop_window = max((len(s.encode("utf-8")) for s in params.stop), default=0) + 1
        seed = params.sampling_seed if params.sampling_seed is not None else secrets.randbits(63)
        generator = torch.Generator(device=self.device).manual_seed(seed)

        with self.lock:
            self.busy = True
            threads = torch.get_num_threads()
            try:
                cache = self._new_cache()
                logits = self._prefill(prompt, cache, 1, should_stop)
                if logits is None:
                    return
                last = logits[-1]
                if self._single_thread_decode:
                    torch.set_num_threads(1)
                output: list[int] = []
                temperature = params.logprob_temperature
                while True:
                    if should_stop is not None and should_stop():
                        return
                    logprobs = torch.log_softmax(last / temperature if temperature != 1.0 else last, dim=-1)
                    sample_logits = last
                    if mask_ids and len(output) < params.min_new_tokens:
                        sample_logits = last.clone()
                        sample_logits[mask_ids] = float("-inf")
                    token = _sample(sample_logits, params, generator)
                    output.append(token)
                    finish = self._finish_reason(prompt, output, params, stop_ids, stop_window)
                    yield GenStep(token, float(logprobs[token]), finish)
                    if finish is not None:
                        return
                    last = self._forward([token], cache, 1)[-1]
            finally:
                torch.set_num_threads(threads)
                self.busy = False

    def _finish_reason(
        self,
        prompt: list[int],
        output: list[int],
        params: SamplingParams,
        stop_ids: set[int],
        stop_window: int,
    ) -> dict[str, Any] | None:
        # Same order as SGLang's Req.check_finished: length, then stop token, then stop string.
        if len(output) >= params.max_new_tokens:
            return {"type": "length", "length": params.max_new_tokens}
        if len(prompt) + len(output) >= self.context_length:
            return {"type": "length", "length": len(output)}
        if output[-1] in stop_ids:
            return {"type": "stop", "matched": output[-1]}
        if params.stop:
            tail = self.decode(output[-stop_window:], skip_special_tokens=False)
            for s in params.stop:
                if s in tail:
                    return {"type": "stop", "matched": s}
        return None


def _sample(logits: Any, params: SamplingParams, generator: Any) -> int:
    """Pick a token from float32 `logits` (1-D) with SGLang's temperature/top-k/top-p/min-p rules."""
    import torch

    if params.greedy:
        return int(torch.argmax(logits))
    x = logits / params.temperature
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        sorted_probs = sorted_probs.masked_fill(cumulative - sorted_probs > params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return int(torch.multinomial(probs, 1, generator=generator))
