"""The README's "By hand" block, run as written: parsed from README.md (so the two cannot drift), line by
line in order, in a fresh folder that sees the checkout's `examples/` as the repository root does.

Each line's exit code is checked, and that it recorded or wrote what it says. What the test changes, and
why: `polarproxy` is this interpreter's (`python -m polarproxy`), whose folder leads PATH (as in an
activated venv); port 30000 is a free port; `tiny-model ./tiny` links the tests' cached build of the same
`build_tiny_model` (built once per machine: tests/tiny checks the command itself; building it again costs a
minute); a line ending in `&` (the backend) runs in the background until the end; the last line (`view`,
a server until Ctrl-C) runs on a free port, is fetched once and stopped. The database is a temporary
`POLARPROXY_DB`.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from factories import free_port

from polarproxy.store.store import Store

REPO = Path(__file__).resolve().parents[1]
README_PORT = "30000"


def by_hand_block() -> list[str]:
    """The command lines of the README's "By hand" fenced block."""
    text = (REPO / "README.md").read_text()
    m = re.search(r"^## By hand\n+```\n(.*?)^```", text, re.S | re.M)
    assert m, "README.md has no '## By hand' fenced block"
    return [line for line in m.group(1).splitlines() if line.strip()]


def argv_of(line: str, port: str) -> tuple[list[str], bool]:
    """The line as an argv for this interpreter, and whether it runs in the background (`&`)."""
    words = shlex.split(line, comments=True)
    background = words[-1] == "&"
    words = [
        port if w == README_PORT else w.replace(f":{README_PORT}", f":{port}")
        for w in (words[:-1] if background else words)
    ]
    assert words[0] == "polarproxy", f"README line does not start with polarproxy: {line}"
    return [sys.executable, "-m", "polarproxy", *words[1:]], background


def url_on_stderr(proc: subprocess.Popen[str], pattern: str, lines: list[str], timeout: float = 120) -> str:
    """The first match of `pattern` on the process's stderr (which is drained from then on); an
    AssertionError with what it printed when none comes within `timeout` seconds or the process ends."""
    assert proc.stderr is not None
    found: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = re.search(pattern, line)
            if m:
                found.put(m.group(1))
        found.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        url = found.get(timeout=timeout)
    except queue.Empty:
        url = None
    if url is None:
        raise AssertionError(f"no URL on stderr within {timeout:g} s:\n" + "".join(lines))
    return url


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    """A folder that looks like the checkout's root to the README's lines (`examples/` linked)."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    yield tmp_path


def test_the_readme_by_hand_block_runs_as_written(here: Path, tiny_model_dir: Path) -> None:
    lines = by_hand_block()
    port = str(free_port())
    db = here / "polarproxy.db"
    env = {
        **os.environ,
        "POLARPROXY_DB": str(db),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),  # venv activated
        "BROWSER": "true",  # `view` opens a browser: here a command that does nothing
        "XDG_CACHE_HOME": str(here / "cache"),
    }
    for key in ("POLARPROXY_BACKEND", "POLARPROXY_MODEL"):
        env.pop(key, None)
    background: list[subprocess.Popen[str]] = []

    def episodes() -> list:
        s = Store.open(str(db))
        try:
            return s.list_episodes(limit=None)
        finally:
            s.close()

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=here, env=env, capture_output=True, text=True, timeout=300)

    try:
        for number, line in enumerate(lines):
            argv, in_background = argv_of(line, port)
            command = argv[3]
            before = episodes() if db.exists() else []
            if command == "tiny-model":
                assert argv[4:] == ["./tiny"], line
                (here / "tiny").symlink_to(tiny_model_dir)
                continue
            if in_background:
                assert command == "backend", f"only the backend runs in the background: {line}"
                proc = subprocess.Popen(
                    argv, cwd=here, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                )
                background.append(proc)
                url = url_on_stderr(proc, r"on (http://[\d.]+:\d+)", [])
                assert url == f"http://127.0.0.1:{port}", line
                continue
            if number == len(lines) - 1:
                assert command == "view", f"the block's last line is the viewer: {line}"
                view_and_stop(argv, here, env, episodes())
                continue
            done = run(argv)
            after = episodes()
            detail = f"{line}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
            if command == "record":
                # The agent's own exit code: 1 when a sample at temperature 1 did not finish in six turns.
                assert done.returncode in (0, 1), detail
                new = [e for e in after if e.id not in {b.id for b in before}]
                assert len(new) == 1 and new[0].group_id == "hello" and (new[0].calls or 0) >= 1, detail
                assert new[0].exit_code == done.returncode, detail
            else:
                assert done.returncode == 0, detail
            check = CHECKS.get(command)
            if check:
                check(argv, done, before, after, here)
    finally:
        for proc in background:
            proc.send_signal(signal.SIGINT)
        for proc in background:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def view_and_stop(argv: list[str], here: Path, env: dict[str, str], episodes: list) -> None:
    """`polarproxy view` serves until Ctrl-C: its page lists the recorded episodes; SIGINT ends it cleanly."""
    proc = subprocess.Popen(
        [*argv, "--port", "0"],
        cwd=here,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = url_on_stderr(proc, r"serving (http://\S+)", [])
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "<html" in page.text.lower()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) in (0, -signal.SIGINT, 130)
    assert episodes


def _ls(argv, done, before, after, here) -> None:
    assert all(e.id in done.stdout for e in after), done.stdout


def _show(argv, done, before, after, here) -> None:
    assert argv[-1] == "@1" and after[0].id in done.stdout, done.stdout


def _export(argv, done, before, after, here) -> None:
    out = here / argv[argv.index("--out") + 1]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    calls = sum(e.calls or 0 for e in after)
    assert len(rows) == calls >= 2  # per-request: a row per call
    if "--advantages" in argv:  # the group of two samples, rewards 1 (@1) and 0 (@2): + and - advantages
        assert {r["group_id"] for r in rows} == {"hello"}, rows
        sign = {r["episode_id"]: r["advantage"] > 0 for r in rows}
        assert sign == {after[0].id: True, after[1].id: False}, rows


def _reward(argv, done, before, after, here) -> None:
    which = int(argv[-2].removeprefix("@")) - 1
    assert after[which].reward == float(argv[-1])


def _train(argv, done, before, after, here) -> None:
    out = here / argv[argv.index("--out") + 1]
    assert any(out.iterdir()), f"train wrote nothing in {out}"
    synced = httpx.get(argv[argv.index("--sync") + 1] + "/get_weight_version", timeout=30).json()
    assert synced["weight_version"] == "1", synced  # the backend now samples from the trained weights


def _rollout(argv, done, before, after, here) -> None:
    tasks = (here / argv[argv.index("rollout") + 1]).read_text().splitlines()
    samples = int(argv[argv.index("--samples") + 1])
    new = [e for e in after if e.id not in {b.id for b in before}]
    assert len(new) == len(tasks) * samples and all((e.calls or 0) >= 1 for e in new), new


def _db(argv, done, before, after, here) -> None:
    assert (done.stdout + done.stderr).strip()


CHECKS: dict[str, Callable[..., None]] = {
    "ls": _ls,
    "show": _show,
    "export": _export,
    "reward": _reward,
    "train": _train,
    "rollout": _rollout,
    "db": _db,
}
