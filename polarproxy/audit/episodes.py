"""Audit recorded calls: re-render each call's conversation fresh with the chat template and compare
the result with the prompt IDs the model consumed (see `compare` for the figures).

Calls that polarproxy rendered fresh must audit identical (a difference there means the template or
tokenizer differs from the recording's, or a bug: it is reported as `unexpected`). Calls that extended
an earlier call (T2) drift wherever the template does not reproduce what the model sampled: reasoning it
drops, tool arguments it re-serializes. For those, the audit also checks the recorded prompt starts with
the earlier call's prompt + output token for token (`prefix_exact`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from polarproxy.audit.compare import TokenDiff, compare
from polarproxy.conversation import Conversation
from polarproxy.errors import UsageError
from polarproxy.render.renderer import Renderer
from polarproxy.store.errors import NotFoundError
from polarproxy.store.records import Call, Episode

CallResultKind = Literal["identical", "drifted", "skipped"]

# Stable keys of `skipped` (JSON) and what each means.
SKIP_REASONS: dict[str, str] = {
    "server-rendered": "the server applied the chat template (chat mode): no polarproxy prompt to compare",
    "text": "text-only record (intercept mode): no token IDs came back",
    "no-prompt-ids": "no prompt IDs were recorded (the request failed before it was rendered)",
    "no-conversation": "the request did not parse into a conversation",
    "render-error": "the chat template cannot render the recorded conversation",
}
CONTEXT_TOKENS = 12  # decoded tokens shown from the first differing position


@dataclass(slots=True)
class CallAudit:
    call_id: str
    seq: int
    render_mode: str
    extended_from: str | None
    result: CallResultKind
    skip_reason: str | None = None
    error: str | None = None
    diff: TokenDiff | None = None
    prefix_exact: bool | None = None  # extended calls: prompt starts with the earlier prompt + output
    recorded_at_diff: str | None = None
    fresh_at_diff: str | None = None

    @property
    def unexpected(self) -> bool:
        """A call polarproxy rendered fresh that does not re-render identically."""
        return self.render_mode == "fresh" and self.result == "drifted"

    def to_dict(self) -> dict[str, Any]:
        d = self.diff
        return {
            "call_id": self.call_id,
            "seq": self.seq,
            "render_mode": self.render_mode,
            "extended_from": self.extended_from,
            "result": self.result,
            "skip_reason": self.skip_reason,
            "error": self.error,
            "recorded_tokens": None if d is None else d.recorded_tokens,
            "fresh_tokens": None if d is None else d.fresh_tokens,
            "first_diff": None if d is None else d.first_diff,
            "drifted_tokens": 0 if d is None else d.drifted_tokens,
            "changed_recorded": 0 if d is None else d.changed_recorded,
            "changed_fresh": 0 if d is None else d.changed_fresh,
            "prefix_exact": self.prefix_exact,
            "unexpected": self.unexpected,
            "recorded_at_diff": self.recorded_at_diff,
            "fresh_at_diff": self.fresh_at_diff,
        }


@dataclass(slots=True)
class Summary:
    """Counts over calls (one episode, or all of them)."""

    calls: int = 0
    audited: int = 0
    identical: int = 0
    drifted: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    unexpected: int = 0
    prefix_breaks: int = 0
    prompt_tokens: int = 0  # recorded prompt tokens of the audited calls
    drifted_tokens: int = 0

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    @property
    def drifted_share(self) -> float:
        return self.drifted_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def add(self, c: CallAudit) -> None:
        self.calls += 1
        if c.result == "skipped":
            assert c.skip_reason is not None
            self.skipped[c.skip_reason] = self.skipped.get(c.skip_reason, 0) + 1
            return
        assert c.diff is not None
        self.audited += 1
        self.prompt_tokens += c.diff.recorded_tokens
        self.drifted_tokens += c.diff.drifted_tokens
        if c.result == "identical":
            self.identical += 1
        else:
            self.drifted += 1
        self.unexpected += c.unexpected
        self.prefix_breaks += c.prefix_exact is False

    def merge(self, other: Summary) -> None:
        for name in (
            "calls",
            "audited",
            "identical",
            "drifted",
            "unexpected",
            "prefix_breaks",
            "prompt_tokens",
            "drifted_tokens",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for reason, n in other.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + n

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "audited": self.audited,
            "identical": self.identical,
            "drifted": self.drifted,
            "skipped": self.skipped_total,
            "skipped_by_reason": dict(sorted(self.skipped.items())),
            "unexpected": self.unexpected,
            "prefix_breaks": self.prefix_breaks,
            "prompt_tokens": self.prompt_tokens,
            "drifted_tokens": self.drifted_tokens,
            "drifted_share": round(self.drifted_share, 6),
        }


@dataclass(slots=True)
class EpisodeAudit:
    episode_id: str
    model_dir: str | None  # None for an episode without calls
    calls: list[CallAudit]
    summary: Summary
    skipped: str | None = None  # why the whole episode was not audited (no model folder to render with)

    def to_dict(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "model_dir": self.model_dir,
            "skipped": self.skipped,
            **self.summary.to_dict(),
            "per_call": [c.to_dict() for c in self.calls],
        }


@dataclass(slots=True)
class AuditReport:
    episodes: list[EpisodeAudit]
    total: Summary

    def to_dict(self) -> dict[str, Any]:
        return {
            "episodes": [e.to_dict() for e in self.episodes],
            "total": {"episodes": len(self.episodes), **self.total.to_dict()},
        }


def audit_call(call: Call, renderer: Renderer, earlier: dict[str, Call]) -> CallAudit:
    """One call against a fresh render of its conversation. `earlier`: the episode's calls before it."""
    out = CallAudit(call.id, call.seq, call.render_mode, call.extended_from, "skipped")
    if call.fidelity != "tokens":
        out.skip_reason = "server-rendered" if call.fidelity == "server-rendered" else "text"
        return out
    if not call.prompt_ids:
        out.skip_reason = "no-prompt-ids"
        return out
    if call.conversation is None:
        out.skip_reason = "no-conversation"
        return out
    try:
        fresh = renderer.render(Conversation.from_dict(call.conversation)).ids
    except Exception as e:  # jinja and the tokenizer raise many types for what they cannot render
        out.skip_reason, out.error = "render-error", f"{type(e).__name__}: {e}"
        return out
    diff = compare(call.prompt_ids, fresh)
    out.diff = diff
    out.result = "identical" if diff.identical else "drifted"
    if diff.first_diff is not None:
        at = diff.first_diff
        out.recorded_at_diff = renderer.decode(call.prompt_ids[at : at + CONTEXT_TOKENS])
        out.fresh_at_diff = renderer.decode(fresh[at : at + CONTEXT_TOKENS])
    parent = earlier.get(call.extended_from or "")
    if call.render_mode == "extended" and parent is not None:
        n = len(parent.prompt_ids)
        m = n + len(parent.output_ids)
        out.prefix_exact = (
            call.prompt_ids[:n] == parent.prompt_ids and call.prompt_ids[n:m] == parent.output_ids
        )
    elif call.render_mode == "extended":
        out.prefix_exact = False  # it names an earlier call the episode does not hold
    return out


def audit_episode(episode_id: str, calls: Iterable[Call], renderer: Renderer) -> EpisodeAudit:
    earlier: dict[str, Call] = {}
    audits: list[CallAudit] = []
    summary = Summary()
    for call in calls:
        a = audit_call(call, renderer, earlier)
        audits.append(a)
        summary.add(a)
        earlier[call.id] = call
    return EpisodeAudit(episode_id, str(renderer.model_dir), audits, summary)


def model_dir_for(episode: Episode, model: Path | None) -> Path:
    """--model when given, else the model folder the episode was recorded with."""
    if model is not None:
        return model
    recorded = episode.metadata.get("model_dir")
    if not recorded:
        raise UsageError(
            f"Episode {episode.id} does not record its model folder.",
            hint="Pass --model DIR (or set POLARPROXY_MODEL): the folder with the tokenizer and chat "
            "template the episode was recorded with.",
        )
    path = Path(recorded)
    if not path.is_dir():
        raise UsageError(
            f"Episode {episode.id} was recorded with the model folder '{recorded}', which no longer exists.",
            hint="Pass --model DIR with the same tokenizer and chat template.",
        )
    return path


def _group(calls: Iterable[Call]) -> Iterator[tuple[str, list[Call]]]:
    current: str | None = None
    batch: list[Call] = []
    for c in calls:
        if c.episode_id != current and batch:
            yield batch[0].episode_id, batch
            batch = []
        current = c.episode_id
        batch.append(c)
    if batch:
        yield batch[0].episode_id, batch


def audit_store(
    store: Any, episode_ids: list[str] | None = None, model: Path | None = None, *, named: bool | None = None
) -> AuditReport:
    """Audit the given episodes (exact IDs, in that order; all of them, oldest first, when None). Every
    model folder is resolved before any rendering, so a missing one fails fast when episodes are `named`
    (default: when IDs are given); otherwise an episode without a model folder is skipped with the reason."""
    named = episode_ids is not None if named is None else named
    episodes = {e.id: e for e in store.list_episodes(limit=None)}
    unknown = [eid for eid in episode_ids or [] if eid not in episodes]
    if unknown:
        raise NotFoundError(f"No episode {', '.join(map(repr, unknown))}. Run `polarproxy ls` to list them.")
    wanted = (
        list(episode_ids)
        if episode_ids is not None
        else sorted(episodes, key=lambda i: (episodes[i].started_at, i))
    )
    # episodes without calls need no model folder
    folders: dict[str, Path] = {}
    by_id: dict[str, EpisodeAudit] = {}
    for eid in wanted:
        if not episodes[eid].calls:
            continue
        try:
            folders[eid] = model_dir_for(episodes[eid], model)
        except UsageError as e:
            if named:
                raise
            by_id[eid] = EpisodeAudit(eid, None, [], Summary(), skipped=f"{e.message} {e.hint or ''}".strip())
    renderers: dict[Path, Renderer] = {}
    for eid, calls in _group(store.iter_calls([e for e in wanted if e in folders])):
        folder = folders[eid]
        if folder not in renderers:
            renderers[folder] = Renderer(folder)
        by_id[eid] = audit_episode(eid, calls, renderers[folder])
    total = Summary()
    report: list[EpisodeAudit] = []
    for eid in wanted:
        ep = by_id.get(eid) or EpisodeAudit(eid, None, [], Summary())
        report.append(ep)
        total.merge(ep.summary)
    return AuditReport(report, total)
