"""A vLLM worker extension for exact in-place weight reloads on the CPU (loaded by vLLM, not polarproxy).

Start vLLM with it, the polarproxy checkout on its path, and the dev routes on:

    VLLM_SERVER_DEV_MODE=1 PYTHONPATH=/path/to/polarproxy python -m vllm.entrypoints.openai.api_server \\
        --model DIR --worker-extension-cls polarproxy.backends.vllm_worker.PolarproxyWeightReload ...

Then `POST /collective_rpc {"method": "polarproxy_reload_weights", "kwargs": {"weights_path": DIR}}`
(what `polarproxy.train.sync` sends to vLLM) reloads the checkpoint in DIR on every worker.

Why: vLLM 0.32's `reload_weights` reprocesses only the layers the checkpoint gave weights to. On the CPU
each linear layer keeps a packed copy of its weight for the GEMM kernels (`dispatch_cpu_unquantized_gemm`);
a language-model head tied to the input embedding (`tie_word_embeddings`, as in small Qwen3 models) gets
no weights of its own, so it kept multiplying by the old embedding and the logprobs after a sync were
wrong (measured: 0.3 nats off on the tiny model; every other layer reloaded exactly). This re-ties such a
head to the reloaded embedding and packs it again.

Imports only vLLM (lazily) and the standard library: it runs in vLLM's interpreter, which may be older
than polarproxy's.
"""

from typing import Any


class PolarproxyWeightReload:
    """Mixed into vLLM's worker class by `--worker-extension-cls`; `self` is the worker."""

    def polarproxy_reload_weights(self, weights_path: str) -> dict:
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        model = worker.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        if not (tied and head is not None and embed is not None):
            return {"weights_path": weights_path, "retied_head": False}
        if head.weight is not embed.weight:
            head.weight = embed.weight
        from vllm.platforms import current_platform

        if current_platform.is_cpu() and hasattr(head, "cpu_linear"):
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            dispatch_cpu_unquantized_gemm(head, remove_weight=False)
        return {"weights_path": weights_path, "retied_head": True}
