"""How an audit looks on a terminal: one table per episode, then the totals. Used by the CLI only."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from polarproxy.audit.episodes import SKIP_REASONS, AuditReport, CallAudit, EpisodeAudit, Summary
from polarproxy.printable import printable

RESULT_STYLE = {"identical": "green", "drifted": "yellow", "skipped": "dim"}


def _short(text: str | None, limit: int = 40) -> str:
    if not text:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _prompt(c: CallAudit, seq_of: dict[str, int]) -> str:
    if c.render_mode == "extended":
        return f"extends #{seq_of.get(c.extended_from or '', '?')}"
    return c.render_mode


def _result(c: CallAudit) -> Text:
    if c.result == "skipped":
        return Text(f"skipped: {c.skip_reason}", style="dim")
    out = Text(c.result, style="bold red" if c.unexpected else RESULT_STYLE[c.result])
    if c.unexpected:
        out.append(" (unexpected)", style="bold red")
    if c.prefix_exact is False:
        out.append(" prefix broken", style="bold red")
    return out


def episode_table(ep: EpisodeAudit) -> Table:
    s = ep.summary
    title = (
        f"episode {ep.episode_id}: {s.drifted} of {s.audited} audited calls drift, "
        f"{s.drifted_tokens} of {s.prompt_tokens} prompt tokens after the first drift "
        f"({s.drifted_share:.1%})"
    )
    table = Table(title=title, title_justify="left")
    for col in ("#", "prompt", "recorded", "fresh", "result", "first diff", "drifted", "changed"):
        left = col in ("prompt", "result")
        table.add_column(col, justify="left" if left else "right", no_wrap=col != "result")
    seq_of = {c.call_id: c.seq for c in ep.calls}
    for c in ep.calls:
        d = c.diff
        table.add_row(
            str(c.seq),
            _prompt(c, seq_of),
            "-" if d is None else str(d.recorded_tokens),
            "-" if d is None else str(d.fresh_tokens),
            _result(c),
            "-" if d is None or d.first_diff is None else str(d.first_diff),
            "-" if d is None else str(d.drifted_tokens),
            "-" if d is None or d.identical else f"-{d.changed_recorded}/+{d.changed_fresh}",
        )
    return table


def drift_lines(ep: EpisodeAudit) -> list[Text]:
    """For each drifted call: what the model saw at the first difference, and what a re-render has."""
    lines = []
    for c in ep.calls:
        if c.diff is None or c.diff.first_diff is None:
            continue
        lines.append(
            Text.assemble(
                (f"#{c.seq} at {c.diff.first_diff}: ", "bold"),
                ("model saw ", "dim"),
                (repr(_short(c.recorded_at_diff)), "green"),
                ("  re-render has ", "dim"),
                (repr(_short(c.fresh_at_diff)), "yellow"),
            )
        )
    return lines


def totals_table(total: Summary, episodes: int) -> Table:
    table = Table(title="total", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("episodes", str(episodes)),
        ("calls", str(total.calls)),
        ("audited", str(total.audited)),
        ("identical", str(total.identical)),
        ("drifted", str(total.drifted)),
        ("skipped", str(total.skipped_total)),
        ("prompt tokens (audited)", str(total.prompt_tokens)),
        ("tokens after the first drift", f"{total.drifted_tokens} ({total.drifted_share:.1%})"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def print_report(console: Console, report: AuditReport) -> None:
    empty = 0
    for ep in report.episodes:
        if ep.skipped:
            console.print(Text(f"episode {ep.episode_id} skipped: {ep.skipped}", style="yellow"))
            continue
        if not ep.calls:  # nothing to show but an empty table
            empty += 1
            continue
        console.print(episode_table(ep))
        for line in drift_lines(ep):
            console.print(line, soft_wrap=True)
    console.print(totals_table(report.total, len(report.episodes)))
    if empty:
        console.print(Text(f"{empty} episode(s) without calls left out", style="dim"))
    for reason, n in sorted(report.total.skipped.items()):
        console.print(Text(f"skipped {n} call(s): {SKIP_REASONS.get(reason, reason)}", style="dim"))
    for ep in report.episodes:
        for c in ep.calls:
            if c.error:
                console.print(Text(f"#{c.seq} {c.call_id}: {printable(c.error)}", style="dim"))
    if report.total.unexpected:
        console.print(
            Text(
                f"{report.total.unexpected} call(s) polarproxy rendered fresh do not re-render identically: "
                "the model folder's tokenizer or chat template differs from the recording's, or this is a "
                "bug (please report it).",
                style="bold red",
            )
        )
    if report.total.prefix_breaks:
        console.print(
            Text(
                f"{report.total.prefix_breaks} extended call(s) do not start with the earlier call's prompt "
                "+ output (T2 broken): the store is inconsistent, or this is a bug (please report it).",
                style="bold red",
            )
        )
