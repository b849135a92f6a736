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


def _grade_copy(tmp_path: Path, make_agent) -> tuple[Path, Path, str, ChangeReport]:
    """The evaluate stage's steps on a baseline with pkg/sub/settings.py and src/__init__.py: the agent's
    workspace (made by `make_agent(ws)`) copied safely, its changes applied to a clean copy, its diff made."""
    from polarproxy.rollout.agent_changes import apply_agent_changes
    from polarproxy.rollout.copying import copy_workspace

    base = tmp_path / "base"
    (base / "pkg" / "sub").mkdir(parents=True)
    (base / "pkg" / "sub" / "settings.py").write_text("DEBUG = False\n")
    (base / "src").mkdir()
    (base / "src" / "__init__.py").write_text("x = 1\n")
    ws = tmp_path / "ws"
    copy_workspace(base, ws, max_bytes=None)
    make_agent(ws)
    agent, fresh = tmp_path / "agent-copy", tmp_path / "fresh"
    copy_workspace(ws, agent, max_bytes=None)
    copy_workspace(base, fresh, max_bytes=None)
    report = apply_agent_changes(base, agent, fresh)
    return agent, fresh, agent_patch(base, agent, report), report


def test_links_in_the_agents_workspace_lead_neither_grading_nor_the_diff_to_the_host(tmp_path: Path) -> None:
    """The agent replaces pkg with an absolute link to a folder of its workspace whose `sub` links to a host
    folder: grading deletes nothing there, and the diff shows none of it."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "settings.py").write_text("API_KEY = 'host-secret'\n")

    def agent(ws: Path) -> None:
        import shutil

        shutil.rmtree(ws / "pkg")
        (ws / "X").mkdir()
        (ws / "X" / "sub").symlink_to(host)
        (ws / "pkg").symlink_to(ws / "X")  # absolute, inside the workspace

    agent_copy, fresh, patch, _ = _grade_copy(tmp_path, agent)
    assert (host / "settings.py").read_text() == "API_KEY = 'host-secret'\n"  # nothing deleted on the host
    assert "host-secret" not in patch and os.readlink(agent_copy / "pkg") == "X"  # relative in the copy
    assert not (fresh / "pkg" / "sub").exists()  # the link out was not copied: nothing leads out of the copy


def test_a_fifo_behind_a_link_neither_hangs_the_diff_nor_is_read(tmp_path: Path) -> None:
    import threading

    def agent(ws: Path) -> None:
        import shutil

        shutil.rmtree(ws / "src")
        (ws / "Y").mkdir()
        os.mkfifo(ws / "Y" / "__init__.py")
        (ws / "src").symlink_to(ws / "Y")

    done: list[str] = []
    worker = threading.Thread(target=lambda: done.append(_grade_copy(tmp_path, agent)[2]), daemon=True)
    worker.start()
    worker.join(30)
    assert done, "making the diff hung"
    assert "diff --git a/src" in done[0]


def test_a_folder_replaced_by_a_file_is_named_not_read(tmp_path: Path) -> None:
    def agent(ws: Path) -> None:
        import shutil

        shutil.rmtree(ws / "src")
        (ws / "src").write_text("now a file\n")

    _, fresh, patch, report = _grade_copy(tmp_path, agent)
    assert (fresh / "src").read_text() == "now a file\n" and "src" in report.changed
    assert "Binary files a/src and b/src differ (a: a folder)" in patch
