"""A throwaway PostgreSQL cluster for tests: `initdb` + `pg_ctl` in a temporary folder, on a free port.

The cluster runs as the `postgres` OS user when the tests run as root (initdb refuses root), listens on
127.0.0.1 only, trusts local connections, and is deleted on `stop()`. `.ci/run` relies on the PostgreSQL
binaries that the image ships (PostgreSQL 15: `/usr/lib/postgresql/15/bin`); tests that need the cluster
fail in CI when it cannot start and skip with the reason elsewhere (see `pg_cluster_or_skip`).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest


def _bin_dir() -> Path | None:
    """The PostgreSQL bin folder: $POLARPROXY_PG_BIN, else the newest /usr/lib/postgresql/N/bin, else PATH."""
    env = os.environ.get("POLARPROXY_PG_BIN")
    if env:
        return Path(env)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """One throwaway cluster. `url` is a SQLAlchemy/psycopg URL for its `postgres` database."""

    def __init__(self) -> None:
        bindir = _bin_dir()
        if bindir is None or not (bindir / "initdb").exists():
            raise RuntimeError(
                "PostgreSQL binaries (initdb, pg_ctl) not found. Install PostgreSQL 15 "
                "(apt-get install postgresql-15) or set POLARPROXY_PG_BIN to its bin folder."
            )
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="polarproxy-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.log = self.root / "server.log"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, user="postgres", group="postgres")
            os.chmod(self.root, 0o755)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def init(self) -> PgCluster:
        r = self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
        return self

    def start(self) -> PgCluster:
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root} "
            "-c fsync=on -c max_connections=200 -c shared_buffers=64MB"
        )
        r = self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60", "start"
        )
        if r.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed ({r.returncode}): {r.stderr.strip()}\n{log}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL did not accept connections on port {self.port} within 30 s")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (mode: smart|fast|immediate); the data stays, so `start()` brings it back."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """Create database `name`; return its URL."""
        r = self._run(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-c",
            f'CREATE DATABASE "{name}"',
        )
        if r.returncode != 0:
            raise RuntimeError(f"CREATE DATABASE {name} failed: {r.stderr.strip()}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"


def start_cluster() -> PgCluster:
    cluster = PgCluster().init()
    try:
        return cluster.start()
    except Exception:
        shutil.rmtree(cluster.root, ignore_errors=True)
        raise


def pg_cluster_or_skip() -> PgCluster:
    """Start a cluster; in CI (CI set) a failure fails the test run, elsewhere it skips with the reason."""
    try:
        return start_cluster()
    except Exception as exc:
        if os.environ.get("CI"):
            raise RuntimeError(f"PostgreSQL is required in CI and did not start: {exc}") from exc
        pytest.skip(f"no PostgreSQL here: {exc}")
