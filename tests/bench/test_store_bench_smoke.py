"""Smoke run of the store benchmark: it runs end to end on both backends and reports every figure (no
timing checks; the storage figures are exact counts, so they are checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration  # starts writer processes and a PostgreSQL cluster


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x and x >= 0


def test_quick_store_bench_reports_every_figure_for_both_backends(tmp_path: Path, pg_server) -> None:
    out = tmp_path / "store.json"
    env = {**__import__("os").environ, "POLARPROXY_BENCH_PG": pg_server.url}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "store_write.py"), "--quick", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "write throughput" in proc.stdout and "whole/linear token arrays" in proc.stdout
    r = json.loads(out.read_text())
    for backend in ("sqlite", "postgresql"):
        assert set(r["write"][backend]) == {"1x1", "4x8", "4x32", "1x32"}
        for shape, w in r["write"][backend].items():
            assert shape == f"{w['writers']}x{w['episodes_per_writer']}"
            assert w["concurrent_episodes"] == w["writers"] * w["episodes_per_writer"]
            figures = ("calls_per_s", "tokens_per_s", "seconds", "writer_cpu_ms_per_call")
            assert all(_number(w[k]) and w[k] > 0 for k in figures)
            assert _number(w["writer_thread_cpu_ms_per_call"])
            assert w["server_cpu_ms_per_call"] is None  # a shared server's CPU is not this run's alone
        lin, whole = r["storage"][backend]["linear"], r["storage"][backend]["whole"]
        assert lin["distinct_tokens"] == whole["distinct_tokens"] > 0
        # linear: every distinct token ID stored once (4 bytes), plus a float32 logprob per output token
        assert lin["token_ids_per_distinct_token_bytes"] == 4.0
        assert whole["token_array_bytes"] > 3 * lin["token_array_bytes"]
        assert all(_number(s[k]) for s in (lin, whole) for k in ("read_calls_per_s", "database_bytes"))


def test_the_server_cpu_count_sees_a_query_s_work(pg_server) -> None:
    """`server_cpu_s` sums the CPU of a PostgreSQL server's processes (the bench's "server" figure)."""
    if pg_server.data is None:
        pytest.skip("the tests use $POLARPROXY_TEST_PG, whose processes this machine may not see")
    import psycopg

    sys.path.insert(0, str(REPO / "bench"))
    from store_write import server_cpu_s

    before = server_cpu_s(pg_server.data)
    with psycopg.connect(pg_server.url, autocommit=True) as conn:  # ~0.3-1 s of one backend's CPU
        conn.execute("SELECT sum(g) FROM generate_series(1, 6000000) AS g").fetchone()
    used = server_cpu_s(pg_server.data) - before  # the backend has ended: counted through the postmaster
    assert 0.05 < used < 60
