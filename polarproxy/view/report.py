"""`polarproxy view --export EPISODE --out FILE.html`: one episode's pages as a single self-contained HTML
file (its data, the JS and the CSS inlined; nothing is fetched: its Content-Security-Policy forbids any
request), for CI artifacts.

The file holds the payloads the live page would fetch, under the same API paths: the episode list (this
episode), the episode, each call's tokens, each prefix-merge trajectory, the merge tree, the drift audit,
the episode's group table and, with `metrics_dir`, the training curves. Calls repeat their episode's
earlier tokens (each prompt holds the conversation so far), so their tokens are inlined up to
`max_call_tokens` in all; the trajectories always are (every token of the episode is in one of them), and
the page says which calls were left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polarproxy.view import data as paths
from polarproxy.view.data import ViewData
from polarproxy.view.server import static_text

MAX_CALL_TOKENS = 2_000_000
REPORT_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'"
)
CSS_TAG = '<link rel="stylesheet" href="static/app.css">'
JS_TAG = '<script src="static/app.js"></script>'
HEAD_TAG = '<meta charset="utf-8">'


@dataclass(slots=True)
class ReportStats:
    path: Path
    episode_id: str
    calls: int
    calls_inlined: int
    trajectories: int
    bytes: int


def report_payloads(
    data: ViewData, episode_id: str, *, max_call_tokens: int = MAX_CALL_TOKENS
) -> dict[str, Any]:
    """Every payload of the episode's pages, keyed by API path."""
    from polarproxy.view.data import NotFound

    episode = data.episode(episode_id)
    eid = episode["episode"]["id"]
    out: dict[str, Any] = {
        paths.INFO_PATH: {**data.info(), "report": True, "report_episode": eid},
        paths.EPISODES_PATH: data.episodes([eid]),
        paths.episode_path(eid): episode,
        paths.tree_path(eid): data.tree(eid),
        paths.audit_path(eid): data.audit(eid),
        paths.GROUPS_PATH: data.groups({data.group_key_of(eid)}),
    }
    budget = max_call_tokens
    left_out = []
    for row in episode["calls"]:
        n = row["prompt_tokens"] + row["output_tokens"]
        if n > budget:
            left_out.append(row["id"])
            continue
        budget -= n
        out[paths.call_path(row["id"])] = data.call(row["id"])
    for t in episode["trajectories"]:
        out[paths.trajectory_path(eid, t["index"])] = data.trajectory(eid, t["index"])
    if data.metrics_dir is not None:
        try:
            out[paths.METRICS_PATH] = data.metrics()
        except NotFound:
            pass
    out[paths.INFO_PATH]["calls_left_out"] = left_out
    return out


def render_report(payloads: dict[str, Any], *, title: str) -> str:
    """The page with its CSS, JS and `payloads` inlined."""
    import html

    import orjson

    page = static_text("index.html")
    css = static_text("app.css")
    js = static_text("app.js")
    for tag in (CSS_TAG, JS_TAG, HEAD_TAG):
        if tag not in page:
            raise RuntimeError(f"static/index.html lacks {tag!r}; the report cannot inline the page.")
    if "</script" in js.lower() or "</style" in css.lower():
        raise RuntimeError("app.js or app.css contains a closing tag; it cannot be inlined.")
    blob = orjson.dumps(payloads, option=orjson.OPT_NON_STR_KEYS).decode()
    blob = blob.replace("<", "\\u003c")  # no '</script>' (nor any tag) inside the data
    head = f'{HEAD_TAG}\n<meta http-equiv="Content-Security-Policy" content="{REPORT_CSP}">'
    page = page.replace(HEAD_TAG, head, 1)
    page = page.replace("<title>polarproxy view</title>", f"<title>{html.escape(title)}</title>", 1)
    page = page.replace(CSS_TAG, f"<style>\n{css}\n</style>", 1)
    data_tag = f'<script id="polarproxy-data" type="application/json">{blob}</script>'
    return page.replace(JS_TAG, f"{data_tag}\n<script>\n{js}\n</script>", 1)


def write_report(
    data: ViewData, episode_id: str, out: Path, *, max_call_tokens: int = MAX_CALL_TOKENS
) -> ReportStats:
    """Write the episode's report to `out` (atomically: `out` is the old file or the complete new one)."""
    from polarproxy.export.atomic import atomic_file

    payloads = report_payloads(data, episode_id, max_call_tokens=max_call_tokens)
    info = payloads[paths.INFO_PATH]
    eid = info["report_episode"]
    text = render_report(payloads, title=f"polarproxy report {eid}").encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as f:
        f.write(text)
    episode = payloads[paths.episode_path(eid)]
    return ReportStats(
        path=out,
        episode_id=eid,
        calls=len(episode["calls"]),
        calls_inlined=len(episode["calls"]) - len(info["calls_left_out"]),
        trajectories=len(episode["trajectories"]),
        bytes=len(text),
    )
