"""The viewer's payloads: JSON-able dicts, one per API path, built from the store with the code the CLI
and the export use, so that the page shows the same figures:

- episodes and calls: `views.episode_rows` / `views.call_rows` (what `ls --json` and `show --json` print),
  plus the call fields `show` prints in text (why a prompt was rendered fresh, fidelity, times);
- trajectories: `reconstruct.prefix_merge` and `export.rows.trajectory_to_row` (what `export` writes), and
  the merge tree from `prefix_merge.find_parent`;
- the drift audit: `audit.audit_store` (what `audit --json` prints), and for a drifted call the recorded
  prompt beside a fresh render around the first differing position (`audit.compare`);
- group tables: `export.advantages.compute_advantages` with `grpo` (what `export --advantages grpo` uses);
- training curves: `train.metrics.read_metrics` (a `train` output folder's metrics.jsonl).

Token text comes from the episode's model folder (`Renderer.token_text`), or the `--model` folder; without
one the page shows token IDs only and says why.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from polarproxy.store.records import Call, Episode

CONTEXT_BEFORE = 24  # tokens shown before an audit's first differing position
CONTEXT_AFTER = 48  # and from it on


# The API paths the page asks for (app.js builds the same ones; a report inlines them under these keys).
INFO_PATH = "/api/info"
EPISODES_PATH = "/api/episodes"
GROUPS_PATH = "/api/groups"
METRICS_PATH = "/api/metrics"


def episode_path(episode_id: str) -> str:
    return f"/api/episode/{episode_id}"


def call_path(call_id: str) -> str:
    return f"/api/call/{call_id}"


def trajectory_path(episode_id: str, index: int) -> str:
    return f"/api/trajectory/{episode_id}/{index}"


def tree_path(episode_id: str) -> str:
    return f"/api/tree/{episode_id}"


def audit_path(episode_id: str) -> str:
    return f"/api/audit/{episode_id}"


class NotFound(Exception):
    """What the page asked for does not exist (HTTP 404); `message` names it, `hint` the next step."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def call_extras(call: Call) -> dict[str, Any]:
    """The call fields the page shows beside `call_rows`' (which `show` prints as text, not in --json)."""
    return {
        "method": call.method,
        "render_note": call.render_note,
        "fidelity": call.fidelity,
        "backend": call.backend,
        "backend_kind": call.backend_kind,
        "started_at": call.started_at,
        "ended_at": call.ended_at,
        "reward": call.reward,
        "temperature": call.temperature,
        "mixed_weight_versions": call.mixed_weight_versions,
    }


def _reward_record(r: Any) -> dict[str, Any]:
    o = r.origin
    return {
        "call_seq": r.call_seq,
        "reward": r.reward,
        "source": o.source,
        "command": o.command,
        "exit_code": o.exit_code,
        "output_tail": o.output_tail,
        "note": o.note,
        "created_at": r.created_at,
        "patch": o.patch,
        "grading": o.grading,
    }


def _finite_or_none(values: list[float | None]) -> list[float | None]:
    return [v if v is None or math.isfinite(v) else None for v in values]


class ViewData:
    """The payloads of one store. `model`: the folder for token text (default: each episode's own);
    `metrics_dir`: a `train` output folder for the curves. Safe to use from several threads."""

    def __init__(
        self,
        store: Any,
        *,
        model: Path | None = None,
        metrics_dir: Path | None = None,
        episode_limit: int = 10_000,
        report: bool = False,
    ) -> None:
        self.store = store
        self.model = model
        self.metrics_dir = metrics_dir
        self.episode_limit = episode_limit
        self.report = report
        self._renderers: dict[Path, Any] = {}  # folder -> Renderer
        self._lock = threading.Lock()

    # ---- helpers ----------------------------------------------------------------------------------------

    def _episode(self, episode_id: str) -> Episode:
        from polarproxy.store.errors import StoreError

        try:
            return self.store.get_episode(episode_id)
        except StoreError as e:
            raise NotFound(str(e), "Go back to the episode list.") from None

    def model_dir(self, ep: Episode) -> tuple[Path | None, str | None]:
        """The folder for token text and the audit, or None and why there is none."""
        if self.model is not None:
            return (
                (self.model, None) if self.model.is_dir() else (None, f"--model {self.model} is not a folder")
            )
        recorded = ep.metadata.get("model_dir")
        if not recorded:
            return None, "the episode records no model folder; pass --model DIR for token text"
        path = Path(recorded)
        if not path.is_dir():
            return None, f"the episode's model folder {recorded} no longer exists; pass --model DIR"
        return path, None

    def renderer(self, ep: Episode) -> tuple[Any, str | None]:
        """The episode's Renderer (loaded once per folder), or None and why there is none."""
        folder, why = self.model_dir(ep)
        if folder is None:
            return None, why
        with self._lock:  # one import of transformers at a time: concurrent first imports break it
            if folder not in self._renderers:
                try:
                    from polarproxy.render.renderer import Renderer

                    self._renderers[folder] = Renderer(folder)
                except Exception as e:  # a broken folder: show IDs, say why (and try again next time)
                    return None, f"cannot load the tokenizer in {folder}: {e}"
            return self._renderers[folder], None

    def warm(self, limit: int = 20) -> None:
        """Load the tokenizers of the newest episodes' model folders (the server does this at start, in a
        thread, so that the first token view does not wait for transformers to import)."""
        try:
            for ep in self.store.list_episodes(limit=limit):
                self.renderer(ep)
        except Exception:  # only a head start: a page that needs the tokenizer loads it itself
            pass

    def _text(self, ep: Episode, ids: list[int]) -> dict[str, Any]:
        """{'text': {id: how it reads} | None, 'text_note': why there is no text}."""
        renderer, why = self.renderer(ep)
        if renderer is None:
            return {"text": None, "text_note": why}
        return {"text": {str(i): renderer.token_text(i) for i in set(ids)}, "text_note": None}

    def _merged(self, ep: Episode, calls: list[Call]) -> list[Any]:
        from polarproxy.reconstruct.prefix_merge import prefix_merge

        return list(prefix_merge(calls, episodes={ep.id: ep}))

    # ---- payloads ---------------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {
            "db": self.store.url,
            "report": self.report,
            "metrics": self.metrics_dir is not None,
            "metrics_dir": None if self.metrics_dir is None else str(self.metrics_dir),
        }

    def episodes(self, episode_ids: list[str] | None = None) -> dict[str, Any]:
        """Every episode (newest first, up to `episode_limit`) as `ls --json` rows; the page filters and
        sorts them. `episode_ids`: only these (a report)."""
        from polarproxy.store.query import EpisodeQuery
        from polarproxy.views import episode_rows

        where = None if episode_ids is None else EpisodeQuery(episode_ids=episode_ids)
        eps = self.store.list_episodes(limit=self.episode_limit + 1, where=where)
        truncated = len(eps) > self.episode_limit
        return {"episodes": episode_rows(eps[: self.episode_limit]), "truncated": truncated}

    def episode(self, episode_id: str) -> dict[str, Any]:
        """The episode (as `show --json`), its calls (`call_rows` + extras), rewards and their origins, and
        its prefix-merge trajectories."""
        from polarproxy.views import call_rows

        ep = self._episode(episode_id)
        calls = self.store.list_calls(ep.id)
        rows = call_rows(calls)
        for row, c in zip(rows, calls, strict=True):
            row.update(call_extras(c))
        seq_of = {c.id: c.seq for c in calls}
        trajectories = []
        for i, t in enumerate(self._merged(ep, calls)):
            trajectories.append(
                {
                    "index": i,
                    "call_ids": t.call_ids,
                    "call_seqs": [seq_of[c] for c in t.call_ids],
                    "tokens": len(t.input_ids),
                    "trainable_tokens": t.trainable_tokens,
                    "reward": t.reward,
                }
            )
        folder, why = self.model_dir(ep)
        return {
            "episode": asdict(ep),
            "calls": rows,
            "rewards": [_reward_record(r) for r in self.store.list_rewards(ep.id)],
            "trajectories": trajectories,
            "model_dir": None if folder is None else str(folder),
            "text_note": why,
        }

    def call(self, call_id: str) -> dict[str, Any]:
        """One call with its tokens (`call_rows(with_tokens=True)`: prompt masked, output trainable), its
        conversation, and token text."""
        from polarproxy.store.errors import StoreError
        from polarproxy.views import call_rows

        try:
            c = self.store.get_call(call_id)
        except StoreError as e:
            raise NotFound(str(e), "Open the call from its episode's page.") from None
        ep = self._episode(c.episode_id)
        row = call_rows([c], with_tokens=True)[0]
        row.update(call_extras(c))
        row["output_logprobs"] = _finite_or_none(row["output_logprobs"])
        return {
            "episode_id": ep.id,
            "call": row,
            "messages": (c.conversation or {}).get("messages", []),
            **self._text(ep, c.prompt_ids + c.output_ids),
        }

    def trajectory(self, episode_id: str, index: int) -> dict[str, Any]:
        """Trajectory `index` of the episode's prefix-merge reconstruction, as the export row."""
        from polarproxy.export.rows import trajectory_to_row

        ep = self._episode(episode_id)
        calls = self.store.list_calls(ep.id)
        trajs = self._merged(ep, calls)
        if not 0 <= index < len(trajs):
            raise NotFound(
                f"Episode {ep.id} has no trajectory {index}; it has {len(trajs)} (0..{len(trajs) - 1}).",
                "Open a trajectory from the episode's page.",
            )
        t = trajs[index]
        try:
            row = trajectory_to_row(t)
        except ValueError as e:  # a logprob JSON cannot hold: show the tokens, and say so
            row = {
                "input_ids": t.input_ids,
                "loss_mask": t.loss_mask,
                "logprobs": _finite_or_none(t.logprobs),
                "call_ids": t.call_ids,
                "reward": t.reward,
                "metadata": t.metadata,
                "error": str(e),
            }
        seq_of = {c.id: c.seq for c in calls}
        return {
            "episode_id": ep.id,
            "index": index,
            "count": len(trajs),
            "row": row,
            "call_seqs": [seq_of[c] for c in t.call_ids],
            "call_spans": [list(s) for s in t.call_spans],
            **self._text(ep, t.input_ids),
        }

    def tree(self, episode_id: str) -> dict[str, Any]:
        """The prefix-merge forest of the episode's exported calls: each call's parent (the earlier call
        whose prompt + output its prompt extends) and the trajectory that owns it (T3: exactly one)."""
        from polarproxy.reconstruct.per_request import is_exported
        from polarproxy.reconstruct.prefix_merge import find_parent

        ep = self._episode(episode_id)
        calls = self.store.list_calls(ep.id)
        selected = sorted((c for c in calls if is_exported(c, False)), key=lambda c: c.seq)
        by_id = {c.id: c for c in selected}
        owner: dict[str, int] = {}
        leaves: dict[str, int] = {}
        trajectories = []
        for i, t in enumerate(self._merged(ep, calls)):
            for cid in t.call_ids:
                owner[cid] = i
            leaves[t.call_ids[-1]] = i
            trajectories.append(
                {"index": i, "call_ids": t.call_ids, "tokens": len(t.input_ids), "leaf": t.call_ids[-1]}
            )
        nodes = []
        for i, c in enumerate(selected):
            parent = find_parent(c, selected[:i], by_id)
            nodes.append(
                {
                    "call_id": c.id,
                    "seq": c.seq,
                    "parent": None if parent is None else parent.id,
                    "status": c.status,
                    "render_mode": c.render_mode,
                    "extended_from": c.extended_from,
                    "prompt_tokens": len(c.prompt_ids),
                    "output_tokens": len(c.output_ids),
                    "has_tools": c.has_tools,
                    "trajectory": owner.get(c.id),
                    "leaf_of": leaves.get(c.id),
                }
            )
        excluded = [{"call_id": c.id, "seq": c.seq, "status": c.status} for c in calls if c.id not in by_id]
        return {"episode_id": ep.id, "nodes": nodes, "trajectories": trajectories, "excluded": excluded}

    def audit(self, episode_id: str) -> dict[str, Any]:
        """`audit --json` for the episode, and for each drifted call the recorded prompt beside a fresh
        render from CONTEXT_BEFORE tokens before the first differing position."""
        from polarproxy.audit import audit_store, compare
        from polarproxy.conversation import Conversation
        from polarproxy.errors import PolarproxyError

        ep = self._episode(episode_id)
        renderer, _ = self.renderer(ep)  # transformers imported (under the lock) before the audit loads
        try:
            with self._lock:  # its own tokenizer: one load at a time
                report = audit_store(self.store, [ep.id], self.model)
        except PolarproxyError as e:
            return {"episode_id": ep.id, "error": e.message, "hint": e.hint}
        audited = report.episodes[0].to_dict()
        by_id = {c.id: c for c in self.store.list_calls(ep.id)}
        windows: dict[str, Any] = {}
        for item in audited["per_call"]:
            if item["result"] != "drifted" or renderer is None:
                continue
            call = by_id[item["call_id"]]
            fresh = renderer.render(Conversation.from_dict(call.conversation or {})).ids
            at = compare(call.prompt_ids, fresh).first_diff
            assert at is not None
            lo = max(0, at - CONTEXT_BEFORE)
            rec, new = call.prompt_ids[lo : at + CONTEXT_AFTER], fresh[lo : at + CONTEXT_AFTER]
            windows[call.id] = {
                "start": lo,
                "first_diff": at,
                "recorded": rec,
                "fresh": new,
                "text": {str(i): renderer.token_text(i) for i in set(rec) | set(new)},
            }
        return {"episode_id": ep.id, "audit": audited, "windows": windows}

    def groups(self, keys: set[str] | None = None) -> dict[str, Any]:
        """Episodes by advantage group (group ID, else task), with rewards and the GRPO advantages
        `export --advantages grpo` gives them over the whole store. `keys`: only these groups (a report)."""
        from polarproxy.export.advantages import AdvantageOptions, compute_advantages, group_key

        eps = self.store.list_episodes(limit=None)
        report = compute_advantages(
            eps, AdvantageOptions("grpo"), self.store.answered_calls([e.id for e in eps])
        )
        zero = set(report.zero_variance_groups)
        grouped: dict[str, list[Episode]] = {}
        for ep in eps:
            grouped.setdefault(group_key(ep), []).append(ep)
        groups = []
        for key in sorted(grouped):
            if key.startswith("episode:") or (keys is not None and key not in keys):
                continue
            members = sorted(grouped[key], key=lambda e: e.id)
            rewards = [e.reward for e in members if e.reward is not None and math.isfinite(e.reward)]
            groups.append(
                {
                    "key": key,
                    "episodes": [
                        {
                            "id": e.id,
                            "task": e.task,
                            "status": e.status,
                            "reward": e.reward,
                            "advantage": report.advantages.get(e.id),
                        }
                        for e in members
                    ],
                    "rewarded": len(rewards),
                    "reward_mean": math.fsum(rewards) / len(rewards) if rewards else None,
                    "zero_variance": key in zero,
                }
            )
        ungrouped = sum(len(v) for k, v in grouped.items() if k.startswith("episode:"))
        return {"estimator": "grpo", "summary": report.summary(), "groups": groups, "ungrouped": ungrouped}

    def group_key_of(self, episode_id: str) -> str:
        from polarproxy.export.advantages import group_key

        return group_key(self._episode(episode_id))

    def metrics(self) -> dict[str, Any]:
        """The rows of the `--metrics` folder's metrics.jsonl (re-read on every request: a running `train`
        appends to it)."""
        if self.metrics_dir is None:
            raise NotFound(
                "No training metrics: the viewer was started without --metrics DIR.",
                "Restart it with --metrics OUT (a `polarproxy train` output folder).",
            )
        from polarproxy.train.metrics import METRICS_FILE, read_metrics

        path = self.metrics_dir / METRICS_FILE
        try:
            rows, error = read_metrics(self.metrics_dir), None
        except ValueError as e:  # a line cut short (a `train` writing it) or not JSON
            rows, error = [], f"{path} holds a line that is not JSON ({e}); reload once the step is written"
        return {"dir": str(self.metrics_dir), "file": str(path), "rows": rows, "error": error}
