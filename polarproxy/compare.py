"""`polarproxy compare`: the same tasks under several harnesses, side by side, from one store.

Per harness (an episode's `harness`): episodes, resolved rate (reward 1.0, over the episodes with a
reward) with a 95 % Wilson interval, pass@k for the samples run (the unbiased estimator 1 - C(n-c, k) /
C(n, k) per task, averaged over tasks, for k = 1 and k = the fewest samples any task has), mean reward,
model calls, prompt and sampled tokens per episode, the T2 extension rate (the share of calls after an
episode's first that extended an earlier call's tokens), failures by class (export/failures.py's
taxonomy), and the mean seconds of each rollout stage (prewarm, execute, evaluate: stored when a rollout
episode ends; over the episodes that have them); per task, which harnesses solved it. Versioned JSON
(`compare.v1`) and Markdown.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from polarproxy.export.failures import failure_class
from polarproxy.printable import printable
from polarproxy.store.records import Episode

SCHEMA = "compare.v1"
Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion; None for n = 0."""
    if n == 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a task with `n` samples, `c` of them solved."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class HarnessFigures:
    episodes: int = 0
    rewarded: int = 0
    resolved: int = 0
    reward_sum: float = 0.0
    calls: int = 0
    prompt_tokens: int = 0
    sampled_tokens: int = 0
    follow_ups: int = 0  # calls after an episode's first
    extended: int = 0  # of those, rendered as an extension (T2)
    failures: dict[str, int] = field(default_factory=dict)
    per_task: dict[str, list[bool]] = field(default_factory=lambda: defaultdict(list))
    stage_seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def summary(self) -> dict[str, Any]:
        interval = wilson(self.resolved, self.rewarded)
        counts = [len(v) for v in self.per_task.values()]
        ks = sorted({1, min(counts)}) if counts else []
        n = max(self.episodes, 1)
        return {
            "episodes": self.episodes,
            "rewarded": self.rewarded,
            "resolved": self.resolved,
            "resolved_rate": self.resolved / self.rewarded if self.rewarded else None,
            "resolved_rate_wilson95": list(interval) if interval else None,
            "pass_at_k": {
                str(k): sum(pass_at_k(len(v), sum(v), k) for v in self.per_task.values()) / len(self.per_task)
                for k in ks
            },
            "mean_reward": self.reward_sum / self.rewarded if self.rewarded else None,
            "calls_per_episode": self.calls / n,
            "prompt_tokens_per_episode": self.prompt_tokens / n,
            "sampled_tokens_per_episode": self.sampled_tokens / n,
            "t2_extension_rate": self.extended / self.follow_ups if self.follow_ups else None,
            "failures": dict(sorted(self.failures.items())),
            "stage_s": {st: sum(v) / len(v) for st, v in self.stage_seconds.items()},  # means, stage order
        }


def compare(store: Any, episodes: list[Episode]) -> dict[str, Any]:
    """The figures of `episodes` (read with their calls from `store`) per harness, and per task."""
    from polarproxy.store.token_calls import iter_token_calls

    by_harness: dict[str, HarnessFigures] = defaultdict(HarnessFigures)
    solved_by: dict[str, set[str]] = defaultdict(set)
    # per call only what is counted, from the stored lengths: no prompt is rebuilt to be counted
    calls_of: dict[str, list[tuple[int, str, int, int, str]]] = defaultdict(list)
    for c in iter_token_calls(store, [ep.id for ep in episodes]) if episodes else ():
        calls_of[c.episode_id].append((c.seq, c.status, c.prompt_len, c.output_len, c.render_mode))
    for ep in episodes:
        name = ep.harness or "(none)"
        f = by_harness[name]
        f.episodes += 1
        calls = sorted(calls_of.pop(ep.id, []))
        f.calls += len(calls)
        f.prompt_tokens += sum(c[2] for c in calls)  # the tokens the model saw, as recorded
        f.sampled_tokens += sum(c[3] for c in calls)
        f.follow_ups += max(0, len(calls) - 1)
        f.extended += sum(1 for c in calls[1:] if c[4] == "extended")
        answered = sum(1 for c in calls if c[1] == "ok")
        kind = failure_class(ep, answered)
        if kind is not None:
            f.failures[kind] = f.failures.get(kind, 0) + 1
        for stage, seconds in (ep.stages or {}).items():
            f.stage_seconds[stage].append(seconds)
        task = ep.task or ep.id
        solved_by.setdefault(task, set())
        if ep.reward is not None:
            f.rewarded += 1
            f.reward_sum += ep.reward
            solved = ep.reward >= 1.0
            f.resolved += solved
            f.per_task[task].append(solved)
            if solved:
                solved_by[task].add(name)
    return {
        "schema": SCHEMA,
        "harnesses": {name: by_harness[name].summary() for name in sorted(by_harness)},
        "tasks": {task: sorted(names) for task, names in sorted(solved_by.items())},
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _md(name: str) -> str:
    """A name as one Markdown table cell: printable, its `|` escaped (not a column)."""
    return printable(name).replace("|", "\\|")


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: one table per harness figure, one of tasks by the harnesses that solved them."""
    names = list(report["harnesses"])
    shown = [_md(n) for n in names]  # harness and task names come from presets and task files
    lines = [
        "| harness | episodes | resolved | 95% interval | pass@k | mean reward | calls/ep | prompt tok/ep | sampled tok/ep | T2 extended | failures | stage s/ep |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        h = report["harnesses"][name]
        lo_hi = h["resolved_rate_wilson95"]
        interval = f"{_pct(lo_hi[0])}-{_pct(lo_hi[1])}" if lo_hi else "-"
        passes = ", ".join(f"@{k} {_pct(v)}" for k, v in h["pass_at_k"].items()) or "-"
        failures = ", ".join(f"{k} {v}" for k, v in h["failures"].items()) or "-"
        mean = "-" if h["mean_reward"] is None else f"{h['mean_reward']:.3f}"
        stages = ", ".join(f"{st} {s:.1f}" for st, s in h["stage_s"].items()) or "-"
        lines.append(
            f"| {_md(name)} | {h['episodes']} | {h['resolved']}/{h['rewarded']} ({_pct(h['resolved_rate'])}) | "
            f"{interval} | {passes} | {mean} | {h['calls_per_episode']:.1f} | "
            f"{h['prompt_tokens_per_episode']:.0f} | {h['sampled_tokens_per_episode']:.0f} | "
            f"{_pct(h['t2_extension_rate'])} | {failures} | {stages} |"
        )
    lines += ["", "| task | " + " | ".join(shown) + " |", "|---|" + "---|" * len(names)]
    for task, solved in report["tasks"].items():
        lines.append(f"| {_md(task)} | " + " | ".join("solved" if n in solved else "-" for n in names) + " |")
    return "\n".join(lines) + "\n"
