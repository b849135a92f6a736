"""How episodes and calls look on a terminal (rich) and in `--json` output. Used by the CLI only."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from polarproxy.printable import printable
from polarproxy.store.records import Call, Episode, RewardRecord

STATUS_STYLE = {
    "ok": "green",
    "running": "yellow",
    "in_flight": "yellow",
    "failed": "red",
    "aborted": "red",
    "interrupted": "red",
}


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def episode_rows(episodes: list[Episode]) -> list[dict[str, Any]]:
    return [
        {
            "id": e.id,
            "command": e.command,
            "exit_code": e.exit_code,
            "calls": e.calls,
            "tokens": e.tokens,
            "status": e.status,
            "started_at": e.started_at,
            "ended_at": e.ended_at,
            "harness": e.harness,
            "task": e.task,
            "group_id": e.group_id,
            "reward": e.reward,
        }
        for e in episodes
    ]


_NUMERIC = ("exit", "calls", "tokens", "reward")


def episodes_table(episodes: list[Episode], total: int | None = None) -> Table:
    """The episodes as a table that fits a narrow terminal: IDs are never cut (they are what `show`,
    `reward` and `delete` take), the command comes last and is what gives way."""
    shown = (
        f"{len(episodes)} of {total}" if total is not None and total != len(episodes) else str(len(episodes))
    )
    table = Table(
        title=f"{shown} episodes",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in ("id", "task", "group", "exit", "calls", "tokens", "reward", "status", "started", "command"):
        table.add_column(
            col,
            no_wrap=col not in ("group", "command"),
            min_width=max((len(e.id) for e in episodes), default=2) if col == "id" else None,
            overflow="fold" if col == "group" else "ellipsis",
            justify="right" if col in _NUMERIC else "left",
            ratio=1 if col == "command" else None,
        )
    for e in episodes:
        table.add_row(
            Text(printable(e.id)),  # IDs made here follow the ID rule; one a harness named is checked too
            Text(printable(e.task or "-")),  # Text, not str: a recorded "[...]" is not rich markup
            Text(printable(e.group_id or "-")),
            "-" if e.exit_code is None else str(e.exit_code),
            str(e.calls),
            str(e.tokens),
            _reward(e.reward),
            Text(e.status, style=STATUS_STYLE.get(e.status, "")),
            _short_when(e.started_at),
            Text(printable(" ".join(e.command))),
        )
    return table


def _short_when(ts: float | None) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def _cell(text: str) -> str:
    """A recorded value as one tab-separated cell: printable, and a tab in it shown as \\x09 (not a column)."""
    return printable(text).replace("\t", "\\x09")


def episodes_plain(episodes: list[Episode]) -> list[str]:
    """The table as tab-separated lines (a header, then one line per episode), for pipes."""
    lines = ["id\tcommand\ttask\tgroup\texit\tcalls\ttokens\treward\tstatus\tstarted"]
    for e in episodes:
        exit_code = "-" if e.exit_code is None else str(e.exit_code)
        cells = [
            _cell(e.id),
            _cell(" ".join(e.command)),
            _cell(e.task or "-"),
            _cell(e.group_id or "-"),
            exit_code,
            str(e.calls),
            str(e.tokens),
            _reward(e.reward),
            e.status,
            _when(e.started_at),
        ]
        lines.append("\t".join(cells))
    return lines


def call_rows(calls: list[Call], *, with_tokens: bool = False) -> list[dict[str, Any]]:
    rows = []
    for c in calls:
        row: dict[str, Any] = {
            "id": c.id,
            "seq": c.seq,
            "dialect": c.dialect,
            "path": c.path,
            "model": c.model,
            "stream": c.stream,
            "status": c.status,
            "error": c.error,
            "http_status": c.http_status,
            "finish_reason": c.finish_reason,
            "prompt_tokens": len(c.prompt_ids),
            "output_tokens": len(c.output_ids),
            "latency_ms": c.latency_ms,
            "ttft_ms": c.ttft_ms,
            "weight_version": c.weight_version,
            "render_mode": c.render_mode,
            "extended_from": c.extended_from,
            "render_note": c.render_note,
            "has_tools": c.has_tools,
            "completion": c.completion,
        }
        if with_tokens:
            row.update(prompt_ids=c.prompt_ids, output_ids=c.output_ids, output_logprobs=c.output_logprobs)
        rows.append(row)
    return rows


def _messages(call: Call) -> list[tuple[str, str]]:
    out = []
    for m in (call.conversation or {}).get("messages", []):
        content = m.get("content") or ""
        text = content if isinstance(content, str) else str(content)
        for t in m.get("tool_calls") or []:
            text += f"\n→ {t.get('name')}({t.get('arguments')})"
        out.append((printable(str(m.get("role"))), printable(text, lines=True)))
    return out


def _short(text: str, limit: int = 300) -> str:
    text = text.strip()
    text = text if len(text) <= limit else text[:limit] + f"… (+{len(text) - limit} chars)"
    return text.replace("\n", "\n    ")


def render_episode(
    console: Console,
    ep: Episode,
    calls: list[Call],
    *,
    show_tokens: bool,
    decode: Callable[[int], str] | None,
    only_call: int | None = None,
    full_prompts: bool = False,
    marks: bool = False,
    rewards: list[RewardRecord] | None = None,
) -> None:
    """An episode for people: its calls (or call `only_call`), with tokens when asked. A call's tokens are
    shown from where the call it extends ends (`full_prompts`: every prompt token); `marks` brackets the
    trainable tokens in text (for pipes, where colour is lost)."""
    console.print(
        Text.assemble(
            ("episode ", "bold"),
            (printable(ep.id), "bold cyan"),
            "  ",
            (ep.status, STATUS_STYLE.get(ep.status, "")),
            f"  exit {ep.exit_code}  {ep.calls} calls  {ep.tokens} tokens  {_when(ep.started_at)}",
        )
    )
    console.print(Text("$ " + printable(" ".join(ep.command)), style="dim"))
    if ep.stages:
        console.print(
            Text("stages: " + ", ".join(f"{st} {s:.2f} s" for st, s in ep.stages.items()), style="dim")
        )
    if rewards:
        render_reward(console, rewards, full=full_prompts)
    seq_of = {c.id: c.seq for c in calls}
    by_id = {c.id: c for c in calls}
    for c in calls:
        if only_call is not None and c.seq != only_call:
            continue
        if c.render_mode == "extended":
            render = f"extends #{seq_of.get(c.extended_from or '', '?')}"
        else:
            render = c.render_mode
        head = Text.assemble(
            (f"\n#{c.seq} ", "bold"),
            (c.status, STATUS_STYLE.get(c.status, "")),
            f"  {printable(c.method)} {printable(c.path)}  {c.dialect}{' stream' if c.stream else ''}  "
            f"prompt {len(c.prompt_ids)} + output {len(c.output_ids)} tokens  finish {c.finish_reason}  "
            f"{(c.latency_ms or 0):.0f} ms  prompt {render}{'' if c.has_tools else '  no tools (side request)'}",
        )
        console.print(head)
        if c.error:
            console.print(Text(f"  error: {printable(c.error)}", style="red"))
        if c.render_note:
            console.print(Text(f"  rendered fresh: {printable(c.render_note)}", style="yellow"))
        msgs = _messages(c)
        if len(msgs) > 3:
            console.print(Text(f"  ({len(msgs) - 3} earlier messages)", style="dim"))
        for role, text in msgs[-3:]:
            console.print(Text.assemble((f"  {role}: ", "bold magenta"), _short(text)))
        if c.completion:
            comp = c.completion
            reply = comp.get("text") or ""
            for t in comp.get("tool_calls") or []:
                reply += f"\n→ {t.get('name')}({t.get('arguments')})"
            console.print(
                Text.assemble(("  assistant: ", "bold green"), _short(printable(reply, lines=True)))
            )
        if show_tokens:
            base = by_id.get(c.extended_from or "") if c.render_mode == "extended" else None
            skip = 0 if full_prompts or base is None else len(base.prompt_ids) + len(base.output_ids)
            if skip:
                console.print(
                    Text(f"  ({skip} tokens of #{base.seq}'s prompt and output not shown)", style="dim")
                )  # type: ignore[union-attr]
            console.print(token_text(c, decode, skip=skip, marks=marks))


PASSING_TESTS = ("PASSED", "XFAIL")
PATCH_LINES_SHOWN = 60  # of the agent's diff; `show --full` prints it all


def render_reward(console: Console, rewards: list[RewardRecord], *, full: bool = False) -> None:
    """The episode's reward as last set: where it came from, a grader's per-test results (the tests that did
    not pass named), and the agent's changes as a diff (its head unless `full`)."""
    mine = [r for r in rewards if r.call_seq is None]
    if not mine:
        return
    r = mine[-1]
    o = r.origin
    origin = o.source + (f" `{' '.join(o.command)}`" if o.command else "")
    origin += f" (exit {o.exit_code})" if o.exit_code is not None else ""
    console.print(Text.assemble(("reward ", "bold"), _reward(r.reward), f"  from {origin}"))
    if o.note:
        console.print(Text(f"  {printable(o.note)}", style="dim"))
    if o.grading:
        tests: dict[str, str] = o.grading.get("tests") or {}
        failing = {t: s for t, s in tests.items() if s not in PASSING_TESTS}
        resolved = o.grading.get("resolved")
        verdict = "resolved" if resolved else "not resolved" if resolved is False else ""
        console.print(
            Text(
                f"  tests: {len(tests) - len(failing)} of {len(tests)} passed"
                f"{', ' + verdict if verdict else ''} (parser: {printable(str(o.grading.get('parser') or 'unknown'))})",
                style="green" if resolved else "yellow",
            )
        )
        for test, status in list(failing.items())[:10]:
            console.print(Text(f"    {printable(status)} {printable(test)}", style="red"))
        if len(failing) > 10:
            console.print(Text(f"    ... and {len(failing) - 10} more", style="dim"))
    if o.patch:
        lines = o.patch.splitlines()
        shown = lines if full else lines[:PATCH_LINES_SHOWN]
        console.print(Text(f"  the agent's changes ({len(lines)} diff lines):", style="bold"))
        for line in shown:
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
            console.print(Text("    " + printable(line), style=style))
        if len(shown) < len(lines):
            console.print(
                Text(f"    ... {len(lines) - len(shown)} more lines (--full shows them)", style="dim")
            )


def reward_rows(rewards: list[RewardRecord]) -> list[dict[str, Any]]:
    """Rewards as `show --json` prints them."""
    return [
        {
            "call_seq": r.call_seq,
            "reward": r.reward,
            "created_at": r.created_at,
            **{
                k: getattr(r.origin, k)
                for k in ("source", "command", "exit_code", "note", "patch", "grading")
            },
        }
        for r in rewards
    ]


TRAINABLE_OPEN, TRAINABLE_CLOSE = "⟦", "⟧"  # around sampled tokens when colour is lost (pipes)


def token_text(
    call: Call, decode: Callable[[int], str] | None, *, skip: int = 0, marks: bool = False
) -> Text:
    """Prompt tokens dim (masked), sampled tokens green (trainable); IDs when there is no tokenizer.
    `skip`: leave off the first prompt tokens; `marks`: also bracket the sampled tokens with ⟦ ⟧."""
    out = Text("  ")
    alt = False
    for ids, styles, trainable in (
        (call.prompt_ids[skip:], ("grey50", "grey35"), False),
        (call.output_ids, ("green", "bright_green"), True),
    ):
        if trainable and marks and ids:
            out.append(TRAINABLE_OPEN)
        for tid in ids:
            piece = printable(decode(tid), lines=True) if decode else f"[{tid}]"
            out.append(piece, style=styles[alt])
            alt = not alt
        if trainable and marks and ids:
            out.append(TRAINABLE_CLOSE)
    return out
