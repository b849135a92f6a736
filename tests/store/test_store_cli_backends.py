"""The real CLI (`record`, `ls`, `show`, `export`) gives the same results on SQLite and PostgreSQL, and never
prints a database password (T5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from factories import record_summary
from sqlalchemy.engine import make_url
from store_procs import start_stub

pytestmark = pytest.mark.integration
CLI = [sys.executable, "-m", "polarproxy"]
PASSWORD = "pg-S3CRET-never-printed"
REPLY = "All good."

AGENT = """
import os, httpx
url = os.environ['OPENAI_BASE_URL'] + '/chat/completions'
messages = [{'role': 'system', 'content': 'Be brief.'}]
for turn in range(3):
    messages.append({'role': 'user', 'content': f'step {turn}'})
    r = httpx.post(url, json={'model': 'tiny', 'messages': messages}, timeout=60)
    messages.append({'role': 'assistant', 'content': r.json()['choices'][0]['message']['content']})
print('done')
"""


@pytest.fixture(scope="module")
def stub(tiny_model_dir: Path):
    from polarproxy.render.renderer import Renderer

    renderer = Renderer(tiny_model_dir)
    s = start_stub([*renderer.encode(REPLY), renderer.stop_token_ids[0]], REPLY)
    yield s
    s.stop()


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    return r


def _record_and_read(stub_url: str, model: Path, db: str, out: Path) -> dict:
    r = cli(
        "record",
        "--backend",
        stub_url,
        "--model",
        str(model),
        "--db",
        db,
        "--json",
        "--",
        sys.executable,
        "-c",
        AGENT,
    )
    summary = record_summary(r.stderr)
    ls = cli("ls", "--db", db, "--json")
    show = cli("show", summary["episode_id"], "--db", db, "--json", "--tokens")
    cli("export", "--db", db, "--out", str(out), "--strategy", "prefix-merge")
    return {
        "printed": r.stdout + r.stderr + ls.stdout + ls.stderr + show.stdout + show.stderr,
        "summary": summary,
        "ls": json.loads(ls.stdout),
        "show": json.loads(show.stdout),
        "rows": [json.loads(line) for line in out.read_text().splitlines()],
    }


_VOLATILE = {
    "id",
    "episode_id",
    "started_at",
    "ended_at",
    "latency_ms",
    "ttft_ms",
    "extended_from",
    "call_ids",
    "db",
    "time",
    "created_at",
    "prompt_base_call_id",
    "signature",  # an answer's opaque signature is random per call
}


def _stable(value):
    """The value without IDs and times (they differ between two recordings of the same episode)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE and not k.endswith("_at")}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _differences(a, b, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d for k in sorted(a.keys() | b.keys()) for d in _differences(a.get(k), b.get(k), f"{path}.{k}")
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {str(a)[:80]} != {str(b)[:80]}"]


def test_record_ls_show_export_agree_on_sqlite_and_postgresql(stub, tiny_model_dir, tmp_path, pg_server):
    pg = (
        make_url(pg_server.create_database("cli"))
        .set(password=PASSWORD)
        .render_as_string(hide_password=False)
    )
    sqlite = _record_and_read(stub.url, tiny_model_dir, str(tmp_path / "cli.db"), tmp_path / "s.jsonl")
    postgres = _record_and_read(stub.url, tiny_model_dir, pg, tmp_path / "p.jsonl")
    assert postgres["summary"]["calls"] == 3 and postgres["summary"]["statuses"] == {"ok": 3}
    for key in ("summary", "ls", "show", "rows"):
        assert _differences(_stable(postgres[key]), _stable(sqlite[key]), key) == []
    assert len(postgres["rows"]) == 1  # three turns merge into one trajectory on both
    # T5: the password is in the URL we passed, and nowhere in what the CLI printed
    assert PASSWORD in pg and PASSWORD not in postgres["printed"]
    assert "***" in postgres["summary"]["db"]


def test_a_bad_postgresql_url_fails_naming_the_database_without_its_password(tmp_path):
    url = f"postgresql://u:{PASSWORD}@127.0.0.1:1/nodb"
    r = subprocess.run([*CLI, "ls", "--db", url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "Cannot open the store" in r.stderr and "127.0.0.1:1/nodb" in r.stderr
    assert PASSWORD not in r.stdout + r.stderr
