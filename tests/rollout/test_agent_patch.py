"""The agent's changes as a diff (rollout/agent_patch.py): links and text without a last newline shown as
git shows them, and the text bounded with the files left over counted."""

from __future__ import annotations

import os
from pathlib import Path

from polarproxy.rollout.agent_changes import ChangeReport
from polarproxy.rollout.agent_patch import agent_patch


def test_links_missing_newlines_and_the_bound(tmp_path: Path) -> None:
    base, agent = tmp_path / "base", tmp_path / "agent"
    base.mkdir()
    agent.mkdir()
    (base / "a.txt").write_text("one\ntwo\n")
    (agent / "a.txt").write_text("one\nthree")
    os.symlink("/etc/passwd", agent / "link")  # named, never followed
    for i in range(5):
        (agent / f"n{i}.txt").write_text("x\n" * 50)
    report = ChangeReport(changed=["a.txt", "link", *(f"n{i}.txt" for i in range(5))])
    whole = agent_patch(base, agent, report)
    assert "-two\n+three\n\\ No newline at end of file\n" in whole
    assert "Binary files /dev/null and b/link differ (b: symbolic link to /etc/passwd)\n" in whole
    assert "root:" not in whole
    cut = agent_patch(base, agent, report, max_chars=400)
    assert len(cut) < 500 and cut.endswith("[patch cut at 400 characters: 5 of 7 files not shown]\n"), cut
