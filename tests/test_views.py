"""The terminal tables: what a user copies from them is never cut."""

from __future__ import annotations

from rich.console import Console

from polarproxy.store.records import Episode
from polarproxy.views import episodes_table


def test_ls_shows_whole_episode_ids_on_an_80_column_terminal():
    eps = [
        Episode(f"ep_01kbtv0q3sz2{i}", ["python", "agent.py", "--a-long-flag"], "codex", None, "greet",
                "ro_20261206133832_f34c40:greet", 1.0, "ok", 0, 1.7e9, 1.7e9, {}, 3, 1234)
        for i in range(3)
    ]  # fmt: skip
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(episodes_table(eps))
    text = console.export_text()
    assert all(e.id in text for e in eps), text
