"""Scripted training data and a short Adam loop that teaches the tiny model the script.

Each sample is built the way the proxy builds prompts (prefix-preserving): the prompt rendered by the
chat template with a generation prompt, the assistant's reply tokenized on its own, then only the new
part of the next rendered prompt, and so on. Loss is on the reply tokens (``<|im_end|>`` included).
Samples that share a system turn (the tools block is most of each sample) are batched together and the
system turn runs once per batch through the KV cache, which roughly halves the cost of a step.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polarproxy.tiny import corpus, script

SCRIPTED_SHARE = 0.7
TITLE_SHARE = 0.1
POOL_SIZE = 384
BATCH_SIZE = 8
LEARNING_RATE = 3e-3
WARMUP_STEPS = 15
SHORT_ANSWER = "OK."


@dataclass
class ScriptSample:
    ids: list[int]
    targets: list[bool]  # True where the token is part of an assistant reply
    prefix_len: int = 0  # leading tokens of the system turn (shared by samples with the same system turn)


def build_sample(
    render: Callable[..., str],
    encode: Callable[[str], list[int]],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    thinking: bool,
) -> ScriptSample:
    """Tokenize a conversation prefix-preservingly; every assistant message is a target."""
    full = render(messages, tools=tools, add_generation_prompt=False, enable_thinking=thinking)
    ids: list[int] = []
    targets: list[bool] = []
    prefix_len = 0
    done = 0  # characters of `full` tokenized so far
    for i, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prompt = render(messages[:i], tools=tools, add_generation_prompt=True, enable_thinking=thinking)
        if not full.startswith(prompt) or len(prompt) < done:
            raise AssertionError("chat template is not prefix-preserving for the scripted conversation")
        delta = prompt[done:]
        if done == 0 and delta.startswith("<|im_start|>system\n"):
            # The system turn ends at a special token, so tokenizing it apart changes nothing.
            cut = delta.index(script.END_OF_TURN) + len(script.END_OF_TURN) + 1
            ids += encode(delta[:cut])
            prefix_len = len(ids)
            delta = delta[cut:]
        ids += encode(delta)
        targets += [False] * (len(ids) - len(targets))
        reply_end = full.index(script.END_OF_TURN, len(prompt)) + len(script.END_OF_TURN)
        ids += encode(full[len(prompt) : reply_end])
        targets += [True] * (len(ids) - len(targets))
        done = reply_end
    return ScriptSample(ids, targets, prefix_len)


def _with_thinking_flag(messages: list[dict[str, Any]], thinking: bool) -> list[dict[str, Any]]:
    if thinking:
        return messages
    return [dict(m, reasoning_content="") if m["role"] == "assistant" else m for m in messages]


def random_sample(
    rng: random.Random, render: Callable[..., str], encode: Callable[[str], list[int]]
) -> ScriptSample:
    thinking = rng.random() < 0.75
    kind = rng.random()
    if kind < SCRIPTED_SHARE:
        system = script.SYSTEM_PROMPT if rng.random() < 0.8 else None
        messages = script.scripted_conversation(
            rng.choice(script.USER_PROMPTS), script.random_workspace(rng), system_prompt=system
        )
        tools: list[dict[str, Any]] | None = list(script.TOOLS)
    elif kind < SCRIPTED_SHARE + TITLE_SHARE:
        user = rng.choice(script.TITLE_PROMPTS)
        if rng.random() < 0.5:
            user += "\n\n" + rng.choice((*script.USER_PROMPTS, corpus.prose(rng)))
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": script.TITLE_ANSWER}]
        if rng.random() < 0.6:
            messages.insert(0, {"role": "system", "content": script.TITLE_SYSTEM_PROMPT})
        tools = None
    else:
        doc = rng.choice(
            (corpus.prose, corpus.python_code, corpus.json_doc, corpus.shell_code, corpus.markdown)
        )
        messages = [
            {"role": "user", "content": doc(rng)[:600]},
            {"role": "assistant", "content": SHORT_ANSWER},
        ]
        if rng.random() < 0.5:
            messages.insert(0, {"role": "system", "content": corpus.prose(rng)[:400]})
        tools = list(script.TOOLS) if rng.random() < 0.5 else None
    return build_sample(render, encode, _with_thinking_flag(messages, thinking), tools, thinking=thinking)


def train(
    model: Any,
    render: Callable[..., str],
    encode: Callable[[str], list[int]],
    *,
    steps: int,
    seed: int,
    pad_id: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Train `model` in place for `steps` Adam steps; returns the loss of each step."""
    import torch

    rng = random.Random(seed)
    pool = [random_sample(rng, render, encode) for _ in range(POOL_SIZE)]
    batches = make_batches(pool)
    generator = torch.Generator().manual_seed(seed)
    # One thread: deterministic across runs, and much faster than two on a shared 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_loop(model, batches, steps, generator, pad_id, progress)
    finally:
        torch.set_num_threads(threads)


def make_batches(pool: list[ScriptSample]) -> list[list[ScriptSample]]:
    """Batches whose samples share their system turn (computed once per batch) and have similar
    lengths (little padding)."""
    groups: dict[tuple[int, ...], list[ScriptSample]] = {}
    for s in pool:
        groups.setdefault(tuple(s.ids[: s.prefix_len]), []).append(s)
    loose: list[ScriptSample] = []  # samples whose system turn is too rare to share
    batches = []
    for key in sorted(groups, key=lambda k: (len(k), k)):
        members = groups[key]
        if len(members) < BATCH_SIZE:
            loose += [ScriptSample(m.ids, m.targets, 0) for m in members]
            continue
        batches += _chunks(sorted(members, key=lambda s: len(s.ids)))
    batches += _chunks(sorted(loose, key=lambda s: len(s.ids)))
    return batches


def _chunks(samples: list[ScriptSample]) -> list[list[ScriptSample]]:
    """Consecutive batches of near-equal size, none larger than BATCH_SIZE."""
    k = -(-len(samples) // BATCH_SIZE)
    return [samples[i * len(samples) // k : (i + 1) * len(samples) // k] for i in range(k)]


def _forward_batch(model: Any, batch: list[ScriptSample], pad_id: int) -> Any:
    """Cross-entropy over the reply tokens of `batch`; a shared system turn is computed once."""
    import torch

    first = batch[0].ids[: batch[0].prefix_len]
    prefix = len(first) if all(s.ids[: s.prefix_len] == first for s in batch) else 0
    width = max(len(s.ids) for s in batch) - prefix
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    predict = torch.zeros((len(batch), width), dtype=torch.bool)  # position p predicts token p + 1
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, s in enumerate(batch):
        rest = s.ids[prefix:]
        input_ids[row, : len(rest)] = torch.tensor(rest)
        for p in range(len(rest) - 1):
            if s.targets[prefix + p + 1]:
                predict[row, p] = True
                labels[row, p] = rest[p + 1]
    kwargs: dict[str, Any] = {"use_cache": False}
    if prefix:  # run the shared system turn once, then let every row attend to its cached keys/values
        out = model.model(input_ids=torch.tensor([first]), use_cache=True)
        cache = getattr(out, "cache", None) or out.past_key_values
        cache.batch_repeat_interleave(len(batch))
        params = inspect.signature(type(model.model).forward).parameters
        kwargs = {"cache" if "cache" in params else "past_key_values": cache, "use_cache": True}
    # Right padding needs no attention mask under causal attention; logits only where a loss is taken.
    hidden = model.model(input_ids=input_ids, **kwargs).last_hidden_state
    logits = model.lm_head(hidden[predict])
    return torch.nn.functional.cross_entropy(logits.float(), labels[predict])


def _train_loop(model, batches, steps, generator, pad_id, progress) -> list[float]:
    import torch

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.98), weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < WARMUP_STEPS:
            return (step + 1) / WARMUP_STEPS
        progress_ = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress_))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    losses: list[float] = []
    for step in range(steps):
        batch = batches[int(torch.randint(len(batches), (1,), generator=generator))]
        loss = _forward_batch(model, batch, pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if progress is not None:
            progress(step + 1, steps)
    model.eval()
    return losses
