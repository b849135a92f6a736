"""Shared fixtures: the captured harness traffic in ../shared, and paths."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TRAFFIC = SHARED / "fixtures" / "harness-traffic"
# Tokenizer snapshots (render/snapshot.py) of the tests' model folders go under .cache/, never the user's
# ~/.cache; the processes the tests start inherit it.
os.environ.setdefault("POLARPROXY_CACHE_DIR", str(REPO / ".cache" / "polarproxy"))


def load_traffic(name: str) -> list[dict[str, Any]]:
    """The captured requests of one harness (../shared/fixtures/harness-traffic/NAME.jsonl)."""
    path = TRAFFIC / f"{name}.jsonl"
    if not path.is_file():
        pytest.skip(
            f"{path} is absent: the harness captures live in ../shared beside the checkout (CI has them)"
        )
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def traffic():
    return load_traffic


def _tiny_cache_key() -> str:
    """Hash of the tiny-model kit's sources: the cached model is rebuilt when they change."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted((REPO / "polarproxy" / "tiny").glob("*.py")):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def build_cached_tiny(train_steps: int | None) -> Path:
    """A tiny model folder, built once per kit version under .cache/ (safe across parallel runs)."""
    import shutil
    import tempfile

    from polarproxy.tiny import DEFAULT_TRAIN_STEPS, build_tiny_model

    steps = DEFAULT_TRAIN_STEPS if train_steps is None else train_steps
    target = REPO / ".cache" / f"tiny-{_tiny_cache_key()}-{steps}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".building-"))
    build_tiny_model(tmp / "m", train_steps=steps)
    try:
        os.rename(tmp / "m", target)
    except OSError:
        pass  # another run got there first
    shutil.rmtree(tmp, ignore_errors=True)
    return target


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The trained tiny model (it follows the example agent's script under greedy decoding)."""
    return build_cached_tiny(None)


@pytest.fixture(scope="session")
def random_model_dir() -> Path:
    """The tiny model with random weights."""
    return build_cached_tiny(0)


@dataclass
class BackendProcess:
    proc: subprocess.Popen[str]
    url: str

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def start_backend(model_dir: Path, *extra: str) -> BackendProcess:
    """`polarproxy backend` on a free port, as a real subprocess."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "polarproxy", "backend", "--model", str(model_dir), "--port", "0", *extra],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        m = re.search(r"on (http://[\d.]+:\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
            return BackendProcess(proc, m.group(1))
    raise RuntimeError("backend did not start:\n" + "".join(lines))


@pytest.fixture(scope="session")
def backend(tiny_model_dir: Path) -> Iterator[BackendProcess]:
    b = start_backend(tiny_model_dir, "--max-new-tokens-limit", "256")
    yield b
    b.kill()


@pytest.fixture
def make_backend():
    """make_backend(model_dir, *flags) -> a `polarproxy backend` subprocess, killed at teardown."""
    started: list[BackendProcess] = []

    def make(model_dir: Path, *extra: str) -> BackendProcess:
        b = start_backend(model_dir, *extra)
        started.append(b)
        return b

    yield make
    for b in started:
        if b.proc.poll() is None:
            b.kill()


@dataclass
class PgServer:
    """A PostgreSQL server for tests: `url` of a database on it, and fresh databases on demand."""

    url: str
    data: Path | None = None  # the data folder of a throwaway cluster this session started

    def create_database(self, prefix: str = "t") -> str:
        """A new, empty database; returns its URL."""
        import uuid

        import psycopg
        from sqlalchemy.engine import make_url

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One PostgreSQL for the session: $POLARPROXY_TEST_PG (a database URL on a server where the tests may
    create databases) if set, else a throwaway PostgreSQL 15 cluster (tests/pgcluster.py). In CI (CI set) a
    cluster that does not start fails the tests; elsewhere they skip with the reason."""

    env = os.environ.get("POLARPROXY_TEST_PG")
    if env:
        yield PgServer(env)
        return
    from pgcluster import pg_cluster_or_skip

    cluster = pg_cluster_or_skip()
    try:
        yield PgServer(cluster.url, cluster.data)
    finally:
        cluster.destroy()


class StubThread:
    """The fixed-time backend double on its own loop, for fault tests."""

    def __init__(self, cfg) -> None:
        from polarproxy.backends.stub import StubBackend

        self.cfg = cfg
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stub = StubBackend(cfg)
        port = asyncio.run_coroutine_threadsafe(self.stub.start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.stub.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def make_stub(tiny_model_dir: Path):
    """make_stub(reply_text, **StubConfig fields) -> a running stub that answers with that text's tokens."""
    from polarproxy.backends.stub import StubConfig
    from polarproxy.render.renderer import Renderer

    renderer = Renderer(tiny_model_dir)
    stubs: list[StubThread] = []

    def make(reply: str = "Hello there.", **kw) -> StubThread:
        ids = [*renderer.encode(reply), renderer.stop_token_ids[0]]
        s = StubThread(StubConfig(output_ids=ids, **kw))
        stubs.append(s)
        return s

    yield make
    for s in stubs:
        s.stop()
