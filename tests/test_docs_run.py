"""The command blocks of docs/, run as written: read from each page (so the two cannot drift), in page order,
one page at a time in a folder of its own, the way a reader would paste them into one terminal.

Each block is one of:
- run here: `bash`/`sh` (by `bash -euo pipefail`) and `python` blocks. The folder holds what the pages
  start from: `./tiny` (the tests' cached tiny model), `examples/` (the checkout's), `./Qwen3-4B/config.json`
  (`train --plan` reads nothing else), and `$POLARPROXY_DB`, a store with two groups of two recorded
  episodes of examples/tool_agent.py with rewards (the README's "By hand" steps make the same). Port
  30000 is the tests' local backend, 8000 a free port (a page's own `serve`); `export` and `cd` carry to
  the next block, as in one terminal; what a block starts with `&` must listen on its ports before the
  next block runs, and is stopped when the page ends. Each block must exit 0 and write something (a file
  in the folder, a row in the store, or its output); `--out FILE` must be a non-empty file.
- labelled: its first line is `# not run here: WHY` (a GPU, Docker, Apptainer, a harness CLI with a
  real model, a server that runs until Ctrl-C); it is only parsed (`bash -n`, compile).
- shown: `text` (diagrams, synopses, formulas), `json` (must parse), `yaml` (must parse; a scripted
  policy or a harness file must load as the backend or `record --harness-file` would load it).
A block with no language is refused: a reader cannot tell whether to run it.

The README's "By hand" block has its own test (tests/test_readme.py), docs/trainers.md its own
(tests/export/test_trainer_docs.py); both use the same `# not run here:` label.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from docblocks import NOT_RUN, Block, code_blocks
from factories import QWEN3_4B, TWO_GROUPS, free_port, record_groups

from polarproxy.backends.local.script import Script
from polarproxy.harness.presets import parse_preset
from polarproxy.store.store import Store

REPO = Path(__file__).resolve().parents[1]
OWN_TESTS = {
    "trainers.md": "tests/export/test_trainer_docs.py",
    "benchmarks-history.md": "a journal of past rounds: its commands are `make bench`'s, run by tests/bench",
}
PAGES = sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in OWN_TESTS)
RUN = ("bash", "sh", "python")
SHOWN = ("text", "json", "yaml")
SAMPLED = ("--temperature", "1", "--sampling-policy", "override")  # samples that differ: a gradient to train


def kind_of(block: Block) -> str:
    """'run', 'labelled' or 'shown'; an AssertionError that says what to do for any other block."""
    if block.skipped_because is not None:
        assert len(block.skipped_because) > 10, f"{block.where}: `{NOT_RUN}` says no reason."
        return "labelled"
    if block.lang in RUN:
        return "run"
    assert block.lang in SHOWN, (
        f"{block.where}: give the block a language: one of {RUN} (run here), or one of {SHOWN} (shown only), "
        f"or label it `{NOT_RUN} WHY`."
    )
    return "shown"


def check_shown(block: Block) -> None:
    if block.lang == "json":
        json.loads(block.code)
    elif block.lang == "yaml":
        data = yaml.safe_load(block.code)
        if isinstance(data, dict) and ("steps" in data or "cases" in data):  # a scripted policy
            Script.from_data(data, source=block.where)
        elif isinstance(data, dict) and "env" in data and "on" not in data and True not in data:
            parse_preset(data, source=block.where, default_name="doc")  # a harness file (not a CI workflow)


def check_parses(block: Block) -> None:
    if block.lang == "python":
        compile(block.code, block.where, "exec")
    elif block.lang in SHOWN:
        check_shown(block)
    else:
        res = subprocess.run(["bash", "-n", "-c", block.code], capture_output=True, text=True, check=False)
        assert res.returncode == 0, f"{block.where}: {res.stderr}"


BLOCKS = [b for page in PAGES for b in code_blocks(page)]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where.split(" ")[0] for b in BLOCKS])
def test_each_block_runs_here_or_is_labelled_or_shown_and_parses(block: Block) -> None:
    kind_of(block)
    check_parses(block)


def test_the_pages_run_blocks_of_each_kind() -> None:
    kinds = [kind_of(b) for b in BLOCKS]
    assert kinds.count("run") >= 8 and kinds.count("labelled") >= 8 and kinds.count("shown") >= 5, kinds


@pytest.fixture(scope="module")
def recorded_store(backend, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two groups of two episodes of examples/tool_agent.py sampled at temperature 1, each group one solved
    (reward 1) of two."""
    where = tmp_path_factory.mktemp("docs-store")
    return record_groups(backend.url, tiny_model_dir, where, TWO_GROUPS, *SAMPLED, exit_codes=(0, 1))


class Terminal:
    """One page's terminal: the folder, the environment `export` changes, and what ran in the background."""

    def __init__(self, here: Path, env: dict[str, str], ports: dict[str, str]) -> None:
        self.here, self.env, self.ports = here, env, ports
        self.cwd = here
        self.servers: list[int] = []  # process groups of the blocks that started servers, stopped at the end
        self.blocks = 0

    def substitute(self, code: str) -> str:
        for written, port in self.ports.items():
            code = re.sub(rf"(?<![\d]){written}(?![\d])", port, code)
        return code

    def run(self, block: Block) -> str:
        code = self.substitute(block.code)
        state = self.here / ".block-state"
        self.blocks += 1
        out = self.here / f".block-output-{self.blocks}"  # its own: a server it starts goes on writing there
        if block.lang == "python":
            argv = [sys.executable, "-c", code]
        else:  # the block, then the environment and folder it leaves, for the next block
            argv = ["bash", "-euo", "pipefail", "-c", f'{code}\nenv -0 > "{state}"; pwd > "{state}.cwd"']
        with out.open("w") as sink:
            proc = subprocess.Popen(
                argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # what it starts with `&` stays in its group, stopped at the end
            )
            try:
                code_ = proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                code_ = None
            background = [
                line
                for line in code.splitlines()
                if re.search(r"&\s*(#.*)?$", line) and not re.search(r"&&\s*(#.*)?$", line)
            ]
            if background or code_ is None:  # (a process started mid-line, `a & b`, is not tracked)
                self.servers.append(proc.pid)
        assert code_ == 0, f"{block.where} exited {code_}:\n{code}\n--- output\n{out.read_text()[-4000:]}"
        if block.lang != "python":
            pairs = [item.split("=", 1) for item in state.read_text().split("\0") if "=" in item]
            self.env = {k: v for k, v in pairs if not k.startswith("BASH_FUNC_") and k not in ("_", "SHLVL")}
            self.cwd = Path((state.with_suffix(".cwd")).read_text().strip())
        served = ""
        for line in background:  # a server it started: listening before the next block
            port = re.search(r"--port (\d+)", line)
            assert port, f"{block.where}: a line run in the background names no --port: {line}"
            assert port.group(1) != self.ports["30000"], f"{block.where}: the tests' backend's port: {line}"
            self.wait_for(int(port.group(1)), proc.pid, block, out)
            served += f"listening on {port.group(1)}\n"
        return out.read_text(errors="replace") + served

    def wait_for(self, port: int, group: int, block: Block, out: Path, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            try:
                os.killpg(group, 0)  # the server is still there
            except ProcessLookupError:
                raise AssertionError(f"{block.where}: its server ended:\n{out.read_text()}") from None
            time.sleep(0.2)
        raise AssertionError(
            f"{block.where}: nothing listens on {port} after {timeout:g} s:\n{out.read_text()}"
        )

    def stop(self) -> None:
        for sig in (signal.SIGINT, signal.SIGKILL):
            for pgid in self.servers:
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    pass
            if sig == signal.SIGINT:
                time.sleep(1)


def counts(db: Path) -> tuple[int, int]:
    """(episodes, calls) in a SQLite store, (0, 0) where there is none yet."""
    if not db.exists():
        return (0, 0)
    s = Store.open(str(db))
    try:
        episodes = s.list_episodes(limit=None)
        return (len(episodes), sum(e.calls or 0 for e in episodes))
    finally:
        s.close()


def files_of(here: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(here)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in here.rglob("*")
        if p.is_file() and not p.name.startswith(".block-") and "cache" not in p.parts
    }


def stores_of(term: Terminal, block: Block) -> list[Path]:
    """The SQLite stores a block may write: `$POLARPROXY_DB` and each `--db FILE` it names."""
    named = re.findall(r"--db (\S+)", block.code)
    return [Path(term.env["POLARPROXY_DB"]), *(term.cwd / n for n in named if "://" not in n)]


def runs_here(block: Block) -> bool:
    return block.lang in RUN and block.skipped_because is None


RUNNABLE_PAGES = [p for p in PAGES if any(runs_here(b) for b in code_blocks(p))]


@pytest.fixture
def terminal(recorded_store: Path, backend, tiny_model_dir: Path, tmp_path: Path) -> Iterator[Terminal]:
    here = tmp_path / "here"
    here.mkdir()
    (here / "tiny").symlink_to(tiny_model_dir)
    (here / "examples").symlink_to(REPO / "examples")
    (here / "Qwen3-4B").mkdir()
    (here / "Qwen3-4B" / "config.json").write_text(json.dumps(QWEN3_4B))
    db = tmp_path / "polarproxy.db"
    with sqlite3.connect(recorded_store) as src, sqlite3.connect(db) as dst:
        src.backup(dst)
    env = {
        **os.environ,
        "POLARPROXY_DB": str(db),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),  # venv activated
        "HF_HUB_OFFLINE": "1",
        "BROWSER": "true",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    for key in ("POLARPROXY_BACKEND", "POLARPROXY_MODEL", "POLARPROXY_CONTROL_TOKEN"):
        env.pop(key, None)
    ports = {"30000": backend.url.rsplit(":", 1)[1], "8000": str(free_port())}
    term = Terminal(here, env, ports)
    yield term
    term.stop()


@pytest.mark.integration
@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=[p.name for p in RUNNABLE_PAGES])
def test_the_runnable_blocks_of_each_page_run_as_written(page: Path, terminal: Terminal) -> None:
    for block in code_blocks(page):
        if not runs_here(block):
            continue
        stores = stores_of(terminal, block)
        before = ([counts(s) for s in stores], files_of(terminal.here))
        printed = terminal.run(block)
        after = ([counts(s) for s in stores_of(terminal, block)], files_of(terminal.here))
        assert after != before or printed.strip(), f"{block.where} wrote nothing:\n{block.code}"
        for out in re.findall(r"--out (\S+)", terminal.substitute(block.code)):
            made = terminal.cwd / out
            assert made.exists() and (made.is_dir() or made.stat().st_size > 0), f"{block.where}: {out}"
