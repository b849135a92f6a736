"""T5 for the harness's command line: a key passed to the harness as an argument (`curl -H "Authorization:
Bearer sk-..."`, `--api-key X`, `OPENAI_API_KEY=X`) is redacted before the episode is stored, so no output
path (the database files, `ls`, `show`, `--json`, the exports, record's own output) can show it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from intercept_run import HERE, run_intercept
from requests_plan import plan

from polarproxy.redact import REDACTED

KEY = "sk-proj-CommandLineKey0123456789"
FLAG_VALUE = "flag-value-s3cret"
TOKEN = "tok-assigned-s3cret"
PASSWORD = "url-pa55word"
SECRETS = (KEY, FLAG_VALUE, TOKEN, PASSWORD)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, standin, test_ca):
    tmp = tmp_path_factory.mktemp("argv-secrets")
    (tmp / "plan.json").write_text(json.dumps([i for i in plan() if i["name"] == "chat"]))
    argv = [
        sys.executable,
        str(HERE / "client.py"),
        "plan.json",
        "out.json",  # client.py reads only these two; the rest is what a harness might be given
        "-H",
        f"Authorization: Bearer {KEY}",
        "--api-key",
        FLAG_VALUE,
        f"OPENAI_API_KEY={TOKEN}",
        f"postgresql://bob:{PASSWORD}@db.local/x",
    ]
    rec = run_intercept(tmp, standin, test_ca, argv)
    return rec, tmp


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "polarproxy", *args], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _assert_clean(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, (where, secret)


def test_the_stored_command_is_redacted_and_keeps_the_rest(recorded):
    rec, _ = recorded
    assert len(rec.calls) == 1
    assert rec.episode.command[-6:] == [
        "-H",
        f"Authorization: {REDACTED}",
        "--api-key",
        REDACTED,
        f"OPENAI_API_KEY={REDACTED}",
        f"postgresql://bob:{REDACTED}@db.local/x",
    ]
    for f in rec.db.parent.glob("intercept.db*"):
        data = f.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, (f.name, secret)


def test_record_ls_and_show_never_print_a_command_line_secret(recorded):
    rec, _ = recorded
    _assert_clean(rec.proc.stdout + rec.proc.stderr, "record")
    db = str(rec.db)
    ls = _cli("ls", "--db", db)
    assert "--api-key" in ls.stdout  # the command is shown, without its secrets
    _assert_clean(ls.stdout + ls.stderr, "ls")
    ls_json = _cli("ls", "--db", db, "--json")
    assert REDACTED in ls_json.stdout
    _assert_clean(ls_json.stdout, "ls --json")
    for args in ((), ("--json",), ("--tokens",)):
        show = _cli("show", rec.episode.id, "--db", db, *args)
        _assert_clean(show.stdout + show.stderr, f"show {args}")


def test_exports_never_carry_a_command_line_secret(recorded):
    rec, tmp = recorded
    out = tmp / "sft.jsonl"
    _cli("export", "--format", "sft", "--db", str(rec.db), "--out", str(out), "--json")
    rows = out.read_text()
    assert rows.strip()
    _assert_clean(rows, "export sft")
