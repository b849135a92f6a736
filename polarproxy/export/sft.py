"""SFT export: one row per trajectory as chat messages (schemas/sft-row.v1.json), for text-level datasets.

Trajectories are built from messages, not tokens, so they work for intercept records (`fidelity="text"`,
no token IDs from a closed provider) as well as for gateway records. Within an episode a call continues an
earlier one when its request's messages begin with the earlier call's messages plus the earlier call's
answer (compared on role, text and tool calls; reasoning and call IDs are left out, since harnesses drop or
rename them). Each call continues the longest such earlier call; a call that no later call continues is a
leaf, and each leaf is one row: the leaf's messages and answer, with every earlier answer taken from its
own record, so reasoning is kept wherever the provider returned it. Only complete (`ok`) calls are used.

Rows are in the OpenAI messages shape that TRL reads (`messages`, `tools`; assistant turns may carry
`reasoning_content` and `tool_calls`). With a `Tokenization` they also get `input_ids` and `loss_mask`
(1 on the assistant turns), marked `retokenized`: the text was tokenized here, not sampled as these IDs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from polarproxy.errors import UsageError
from polarproxy.export.filters import ExportFilters
from polarproxy.reconstruct.messages import assistant_message, chat_message, chat_tools
from polarproxy.store.records import Call, Episode

SCHEMA = "sft-row.v1"
SCHEMA_VERSION = 1


# -- filters ------------------------------------------------------------------------------------------


SFTFilters = ExportFilters  # the filters of every export format (export/filters.py)


# -- trajectories -------------------------------------------------------------------------------------


def _args_key(arguments: str) -> Any:
    try:
        return orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONDecodeError:
        return arguments.strip()


def _key(m: dict[str, Any]) -> tuple[Any, ...]:
    """What two turns must share to be the same turn (neutral message dicts)."""
    calls = tuple((t["name"], _args_key(t["arguments"])) for t in m.get("tool_calls") or [])
    return (m["role"], (m.get("content") or "").strip(), calls)


def _answer(call: Call) -> dict[str, Any]:
    c = call.completion or {}
    return {"role": "assistant", "content": c.get("text") or "", "tool_calls": c.get("tool_calls") or []}


@dataclass(slots=True)
class SFTTrajectory:
    episode: Episode
    calls: list[Call]  # root first, the leaf last

    @property
    def leaf(self) -> Call:
        return self.calls[-1]


def usable(call: Call) -> bool:
    return call.status == "ok" and call.conversation is not None and call.completion is not None


def trajectories(calls: Sequence[Call], episode: Episode) -> list[SFTTrajectory]:
    """One episode's usable calls (in sequence order) chained into root-to-leaf trajectories."""
    calls = [c for c in calls if usable(c)]
    keys = [[_key(m) for m in (c.conversation or {})["messages"]] for c in calls]
    full = [[*k, _key(_answer(c))] for k, c in zip(keys, calls, strict=True)]
    parent: list[int | None] = []
    for i in range(len(calls)):
        best: int | None = None
        for j in range(i):
            n = len(full[j])
            if n <= len(keys[i]) and keys[i][:n] == full[j] and (best is None or n >= len(full[best])):
                best = j
        parent.append(best)
    continued = {p for p in parent if p is not None}
    out = []
    for i in range(len(calls)):
        if i in continued:
            continue
        chain = [i]
        while (p := parent[chain[-1]]) is not None:
            chain.append(p)
        out.append(SFTTrajectory(episode, [calls[k] for k in reversed(chain)]))
    return out


def row_messages(traj: SFTTrajectory) -> list[dict[str, Any]]:
    """The leaf's messages and answer, with each earlier call's answer taken from that call's record."""
    leaf = traj.leaf
    neutral = list((leaf.conversation or {})["messages"])
    messages = [chat_message(m) for m in neutral]
    for call in traj.calls[:-1]:
        messages[len((call.conversation or {})["messages"])] = assistant_message(call.completion or {})
    messages.append(assistant_message(leaf.completion or {}))
    return messages


# -- tokenization -------------------------------------------------------------------------------------


Segment = tuple[str, bool]  # (text, trainable)


class Tokenization(Protocol):
    name: str
    kind: str

    def segments(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[Segment]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class TemplateTokenization:
    """An open model's chat template (transformers, through polarproxy's Renderer).

    The whole conversation is rendered once; each assistant turn is found in that text as the template's
    generation prompt followed by the turn as the template renders it (with its reasoning, or without it
    where the template drops old reasoning); the trainable part ends with the turn's end-of-turn token (the
    model's stop token), so separators the template writes after it stay masked. Each segment is tokenized on its own, so the IDs decode back
    to the rendered text exactly and the mask boundaries fall between tokens.
    """

    kind = "chat-template"

    def __init__(self, model_dir: str | os.PathLike[str]) -> None:
        from polarproxy.render.renderer import Renderer

        self.renderer = Renderer(model_dir)
        self.name = str(model_dir)
        self._stops = [self.renderer.token_text(i) for i in self.renderer.stop_token_ids]

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], gen: bool) -> str:
        return self.renderer.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=gen
        )

    def segments(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[Segment]:
        text = self._render(messages, tools, False)
        out: list[Segment] = []
        cursor = 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = self._render(messages[:i], tools, False) if i else ""
            prompt = self._render(messages[:i], tools, True)
            gen = prompt[len(before) :] if prompt.startswith(before) else ""
            variants = [m] + (
                [{k: v for k, v in m.items() if k != "reasoning_content"}] if "reasoning_content" in m else []
            )
            found = None
            for v in variants:
                turn = self._render([*messages[:i], v], tools, False)
                body = turn[len(prompt) :] if turn.startswith(prompt) else None
                if not body:
                    continue
                at = text.find(gen + body, cursor)
                if at >= 0:
                    found = (at + len(gen), at + len(gen) + len(body))
                    break
            if found is None:
                raise ValueError(
                    f"assistant turn {i} is not where the chat template of {self.name} puts it in the "
                    "rendered conversation"
                )
            start, end = found
            # up to the turn's end-of-turn token; what the template writes after it stays masked
            stops = [i + len(s) for s in self._stops if (i := text.rfind(s, start, end)) >= 0]
            end = max(stops, default=end)
            out.append((text[cursor:start], False))
            out.append((text[start:end], True))
            cursor = end
        out.append((text[cursor:], False))
        return [s for s in out if s[0]]

    def encode(self, text: str) -> list[int]:
        return self.renderer.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.renderer.decode(ids)


class TiktokenTokenization:
    """An OpenAI encoding (tiktoken). These encodings come without a chat template, so messages are written
    in a ChatML-style text: `<|im_start|>ROLE\\n` + text + `<|im_end|>\\n`, tool calls as `<tool_call>`
    JSON lines, reasoning in `<think>` before the text, tools in a first `tools` block. The markers are
    tokenized as ordinary text (these encodings have no such special tokens)."""

    kind = "tiktoken"

    def __init__(self, encoding: Any, name: str | None = None) -> None:
        self.encoding = encoding
        self.name = name or encoding.name

    @staticmethod
    def load(spec: str) -> TiktokenTokenization:
        """`spec`: an encoding name (`o200k_base`, from tiktoken's cache or download) or a `.tiktoken`
        ranks file (base64 token, rank per line; text split with GPT-2's pattern)."""
        import tiktoken

        path = Path(spec)
        if path.is_file():
            from tiktoken.load import load_tiktoken_bpe

            ranks = load_tiktoken_bpe(str(path))
            from tiktoken_ext.openai_public import r50k_pat_str

            enc = tiktoken.Encoding(
                name=path.stem, pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={}
            )
            return TiktokenTokenization(enc, str(path))
        try:
            return TiktokenTokenization(tiktoken.get_encoding(spec), spec)
        except ValueError as e:
            raise UsageError(
                f"Unknown --encoding {spec!r}: {e}",
                hint="Use an OpenAI encoding name such as o200k_base or cl100k_base, or a .tiktoken ranks file.",
            ) from e
        except Exception as e:  # download failures
            raise UsageError(
                f"Cannot load the tiktoken encoding {spec!r}: {e}",
                hint="Offline, set TIKTOKEN_CACHE_DIR to a folder holding the encoding file, or pass a "
                ".tiktoken file.",
            ) from e

    def segments(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[Segment]:
        out: list[Segment] = []
        if tools:
            out.append((f"<|im_start|>tools\n{orjson.dumps(tools).decode()}<|im_end|>\n", False))
        for m in messages:
            if m["role"] != "assistant":
                out.append((f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n", False))
                continue
            body = ""
            if m.get("reasoning_content"):
                body += f"<think>\n{m['reasoning_content']}\n</think>\n"
            body += m.get("content") or ""
            for t in m.get("tool_calls") or []:
                fn = t["function"]
                call = orjson.dumps({"name": fn["name"], "arguments": fn["arguments"]}).decode()
                body += f"\n<tool_call>{call}</tool_call>"
            out.append(("<|im_start|>assistant\n", False))
            out.append((body + "<|im_end|>", True))
            out.append(("\n", False))
        return out

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)


def tokenize(
    tok: Tokenization, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    ids: list[int] = []
    mask: list[int] = []
    for text, trainable in tok.segments(messages, tools):
        seg = tok.encode(text)
        ids += seg
        mask += [1 if trainable else 0] * len(seg)
    return {
        "input_ids": ids,
        "loss_mask": mask,
        "tokenization": {"retokenized": True, "kind": tok.kind, "tokenizer": tok.name},
    }


# -- rows ---------------------------------------------------------------------------------------------


def sft_row(traj: SFTTrajectory, tok: Tokenization | None = None) -> dict[str, Any]:
    leaf = traj.leaf
    ep = traj.episode
    messages = row_messages(traj)
    tools = chat_tools(leaf.conversation)
    reward = leaf.reward if leaf.reward is not None else ep.reward
    row: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "messages": messages,
        "tools": tools,
        "episode_id": ep.id,
        "call_ids": [c.id for c in traj.calls],
        "model": leaf.model,
        "harness": ep.harness,
        "task": ep.task,
        "group_id": ep.group_id,
        "reward": reward if reward is None or math.isfinite(reward) else None,
        "fidelity": sorted({c.fidelity for c in traj.calls}),
        "metadata": {
            "dialects": sorted({c.dialect for c in traj.calls}),
            "episode_status": ep.status,
            "started_at": min(c.started_at for c in traj.calls),
        },
    }
    if tok is not None:
        row.update(tokenize(tok, messages, tools))
    return row


@dataclass(slots=True)
class SFTStats:
    rows: int = 0
    calls: int = 0
    episodes: int = 0
    skipped: list[str] = field(default_factory=list)  # why a trajectory was left out (tokenization)

    def summary(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "calls": self.calls,
            "episodes": self.episodes,
            "skipped": len(self.skipped),
        }


def sft_rows(
    calls: Iterable[Call],
    episodes: dict[str, Episode],
    *,
    filters: SFTFilters | None = None,
    tokenization: Tokenization | None = None,
    stats: SFTStats | None = None,
) -> Iterator[dict[str, Any]]:
    """Rows for `calls` (in episode, sequence order, as Store.iter_calls yields them)."""
    filters = filters or SFTFilters()
    stats = stats if stats is not None else SFTStats()

    def flush(batch: list[Call]) -> Iterator[dict[str, Any]]:
        ep = episodes.get(batch[0].episode_id)
        if ep is None or not filters.episode(ep):
            return
        batch = [c for c in batch if filters.call(c)]  # the model-name glob, before trajectories are built
        made = False
        for traj in trajectories(batch, ep):
            try:
                row = sft_row(traj, tokenization)
            except ValueError as e:
                stats.skipped.append(f"{traj.leaf.id}: {e}")
                continue
            stats.rows += 1
            stats.calls += len(traj.calls)
            made = True
            yield row

        stats.episodes += made

    batch: list[Call] = []
    for call in calls:
        if batch and call.episode_id != batch[0].episode_id:
            yield from flush(batch)
            batch = []
        batch.append(call)
    if batch:
        yield from flush(batch)


def write_sft(rows: Iterable[dict[str, Any]], out: str | os.PathLike[str]) -> int:
    """Write rows as JSONL, atomically (the old file stays until every row is written)."""
    from polarproxy.export.atomic import atomic_file

    n = 0
    with atomic_file(out) as f:
        for row in rows:
            f.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
            n += 1
    return n


def export_sft(
    store: Any,
    out: str | os.PathLike[str],
    *,
    episode_ids: Sequence[str] | None = None,
    filters: ExportFilters | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    encoding: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> SFTStats:
    """`polarproxy export --format sft`: read the store (only the episodes that pass `filters`), write rows
    to `out`."""
    if tokenizer is not None and encoding is not None:
        raise UsageError("--tokenizer and --encoding both given.", hint="Pass one of them.")
    tok: Tokenization | None = None
    if tokenizer is not None:
        tok = TemplateTokenization(tokenizer)
    elif encoding is not None:
        tok = TiktokenTokenization.load(encoding)
    filters = filters or ExportFilters()
    if episode_ids is not None:
        from dataclasses import replace

        filters = replace(filters, episode_ids=list(episode_ids))
    query = filters.query()
    episodes = {e.id: e for e in store.list_episodes(limit=None, where=query, counts=False)}
    stats = SFTStats()
    rows = sft_rows(store.iter_calls(where=query), episodes, filters=filters, tokenization=tok, stats=stats)
    if progress is not None:
        rows = _counting(rows, progress)
    write_sft(rows, out)
    return stats


def _counting(rows: Iterator[dict[str, Any]], progress: Callable[[int], None]) -> Iterator[dict[str, Any]]:
    for i, row in enumerate(rows, 1):
        progress(i)
        yield row
