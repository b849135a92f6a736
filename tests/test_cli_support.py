"""The CLI's shared mechanisms: commands never import cli.py, and no command prints a database password."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polarproxy.cli import app

COMMANDS = Path(__file__).resolve().parent.parent / "polarproxy" / "commands"
PG = "postgresql://alice:hunter2@127.0.0.1:1/x"


def test_no_command_module_imports_cli_py():
    for path in COMMANDS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "polarproxy.cli", f"{path.name} imports polarproxy.cli"
            if isinstance(node, ast.Import):
                assert all(a.name != "polarproxy.cli" for a in node.names), path.name


def _commands_with_db() -> list[list[str]]:
    """Every command and subcommand of the app that takes --db, with the arguments it needs."""
    import typer.main

    needs = {
        "show": ["ep_x"],
        "rm": ["ep_x", "--yes"],
        "prune": ["--before", "1d", "--yes"],
        "export": ["--out", "/tmp/polarproxy-t5-export.jsonl"],
        "reward": ["ep_x", "1"],
        "record": ["--backend", "http://127.0.0.1:1", "--model", "/nonexistent", "--", "true"],
        "serve": ["--backend", "http://127.0.0.1:1", "--model", "/nonexistent"],
    }
    out: list[list[str]] = []
    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None)
        for sub_name, sub in subs.items() if subs else [(None, cmd)]:
            if any("--db" in p.opts for p in sub.params):
                path = [name] + ([sub_name] if sub_name else [])
                out.append([*path, *needs.get(path[-1], [])])
    return out


def test_every_command_that_takes_db_is_covered():
    names = {tuple(c[:2]) if c[0] == "db" else (c[0],) for c in _commands_with_db()}
    assert {
        ("ls",),
        ("show",),
        ("export",),
        ("audit",),
        ("rm",),
        ("prune",),
        ("record",),
        ("serve",),
    } <= names
    assert {("db", "status"), ("db", "repair"), ("db", "migrate"), ("db", "path")} <= names


@pytest.mark.parametrize("argv", _commands_with_db(), ids=lambda a: " ".join(a[:2]))
def test_no_command_prints_a_database_password(argv):
    r = CliRunner().invoke(app, [*argv, "--db", PG], catch_exceptions=True)
    shown = (r.stdout or "") + (r.stderr or "") + repr(r.exception or "")
    assert "hunter2" not in shown, shown
    assert r.exit_code in (0, 1, 2), shown


@pytest.mark.parametrize(
    "argv",
    [["ls"], ["show", "ep_x"], ["audit"], ["export", "--out", "OUT"]],
    ids=lambda a: a[0],
)
def test_a_mistyped_db_path_is_an_error_and_creates_nothing(argv, tmp_path):
    missing = tmp_path / "typo" / "polarproxy.db"
    argv = [str(tmp_path / "out.jsonl") if a == "OUT" else a for a in argv]
    r = CliRunner().invoke(app, [*argv, "--db", str(missing)])
    assert r.exit_code == 1 and "Error: No database at" in r.stderr
    assert not missing.exists() and not missing.parent.exists()


@pytest.mark.parametrize("argv", [["ls"], ["audit"], ["export", "--out", "OUT"]], ids=lambda a: a[0])
def test_with_nothing_recorded_yet_read_commands_say_so_and_create_nothing(argv, tmp_path, monkeypatch):
    monkeypatch.delenv("POLARPROXY_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    argv = [str(tmp_path / "out.jsonl") if a == "OUT" else a for a in argv]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    assert "No episode has been recorded yet" in r.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / "out.jsonl").exists()


def test_an_export_to_a_path_it_cannot_write_fails_before_reading_the_store(tmp_path):
    db = tmp_path / "absent.db"
    for out, why in ((tmp_path, "is a folder"), (tmp_path / "no" / "x.jsonl", "does not exist")):
        r = CliRunner().invoke(app, ["export", "--out", str(out), "--db", str(db)])
        assert r.exit_code == 1 and why in r.stderr and not db.exists()


def test_usage_errors_exit_2_and_list_the_choices():
    r = CliRunner().invoke(app, ["export", "--out", "x.jsonl", "--strategy", "prefix"])
    assert r.exit_code == 2 and "per-request" in r.output and "prefix-merge" in r.output
    r = CliRunner().invoke(app, ["export", "--out", "x.jsonl", "--format", "csv"])
    assert r.exit_code == 2 and "parquet" in r.output
    r = CliRunner().invoke(app, ["export", "--out", "x.jsonl", "--encoding", "cl100k_base"])
    assert r.exit_code == 2 and "--format sft" in r.output


def test_error_messages_print_values_as_given_without_emoji_codes(tmp_path):
    """rich would turn `:x:` in a value into an emoji; an error must name the value the user typed."""
    r = CliRunner().invoke(app, ["export", "--out", str(tmp_path / "a:x:b" / "out.jsonl")])
    assert r.exit_code == 1 and "a:x:b" in r.stderr and "\u274c" not in r.stderr


def test_a_mistyped_record_option_is_refused_not_taken_for_the_command():
    r = CliRunner().invoke(app, ["record", "--tsak", "foo", "--", "true"])
    assert r.exit_code == 2 and "--tsak" in r.output


def test_a_backend_url_without_a_scheme_is_an_error_naming_the_fix(tmp_path):
    r = CliRunner().invoke(
        app, ["record", "--backend", "localhost:30000", "--model", str(tmp_path), "--", "true"]
    )
    assert r.exit_code == 1 and "http://localhost:30000" in r.stderr and "Traceback" not in r.output


def test_help_the_rollout_help_and_the_proxy_addon_import_no_ray():
    """Ray is the `ray` extra of `rollout --ray` only (rollout/ray_runner.py imports it when it runs)."""
    out = _in_fresh_interpreter(
        "import sys; from typer.testing import CliRunner; from polarproxy.cli import app;"
        "import polarproxy.capture.addon, polarproxy.rollout.ray_runner;"
        "assert CliRunner().invoke(app, ['--help']).exit_code == 0;"
        "r = CliRunner().invoke(app, ['rollout', '--help']); assert r.exit_code == 0 and '--ray' in r.output;"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    assert out.strip() == "[]", out


def _in_fresh_interpreter(code: str) -> str:
    """What `code` prints when run by a new interpreter (which modules it imports is then its own)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"cannot reach {PG}.", "cannot reach postgresql://alice:***@127.0.0.1:1/x."),
        (
            "see postgresql://db.example/runs?password=hunter2",
            "see postgresql://db.example/runs?password=***",
        ),
        ("pass --backend http://127.0.0.1:30000 then", "pass --backend http://127.0.0.1:30000 then"),
        ("no url here", "no url here"),
    ],
)
def test_error_text_hides_every_password_and_leaves_urls_without_one_as_they_are(text, shown):
    from polarproxy.store.urls import hide_passwords

    assert hide_passwords(text) == shown


def test_a_missing_backend_is_told_without_importing_the_proxy():
    """A CLI mistake is told at once: the check comes before mitmproxy, SQLAlchemy and the gateway load."""
    _in_fresh_interpreter(
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from polarproxy.cli import app\n"
        "r = CliRunner().invoke(app, ['record', '--', 'true'], env={'POLARPROXY_BACKEND': ''})\n"
        "assert r.exit_code == 1 and 'No backend given' in r.output, r.output\n"
        "heavy = [m for m in ('mitmproxy', 'sqlalchemy', 'polarproxy.capture.gateway') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )


@pytest.mark.parametrize(
    ("argv", "module", "extra"),
    [
        (["tiny-model", "{tmp}/tiny"], "torch", "torch"),
        (["train", "--data", "{tmp}/rows.jsonl", "--model", "{tmp}", "--out", "{tmp}/run"], "torch", "torch"),
        (["backend", "--model", "{model}"], "torch", "torch"),
    ],
)
def test_a_missing_optional_dependency_is_an_error_with_the_pip_line(
    argv, module, extra, tmp_path, tiny_model_dir, monkeypatch
):
    """Without torch (`pip install .` for recording only), the commands that need it say so and how to get
    it; no traceback, and the model folder is not blamed."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a)
    )
    (tmp_path / "rows.jsonl").write_text("")
    args = [a.format(tmp=tmp_path, model=tiny_model_dir) for a in argv]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1, r.output
    assert f"needs {module}" in r.stderr and f"pip install 'polarproxy[{extra}]'" in r.stderr
    assert "Traceback" not in r.output and "save_pretrained" not in r.stderr


def test_sampling_flags_are_refused_where_the_gateway_does_not_sample(tmp_path):
    r = CliRunner().invoke(
        app, ["record", "--intercept", "--temperature", "0.5", "--db", str(tmp_path / "x.db"), "--", "true"]
    )
    assert r.exit_code == 2 and "gateway mode" in r.output
    r = CliRunner().invoke(
        app,
        [
            "record",
            "--backend",
            "http://127.0.0.1:9",
            "--model",
            str(tmp_path),
            "--top-p",
            "1.5",
            "--",
            "true",
        ],
    )
    assert r.exit_code == 2 and "--top-p 1.5" in r.output


def test_an_error_quoting_what_an_agent_named_cannot_drive_the_terminal(capsys):
    """`Error:` messages may quote a file or task an agent named: markup stays text, escapes become \\xNN."""
    import typer

    from polarproxy.commands.support import fail

    with pytest.raises(typer.Exit):
        fail("cannot copy 'a[/]\x1b[2J\x9b1m.py'")
    err = capsys.readouterr().err
    assert "\x1b[2J" not in err and "\x9b" not in err, repr(err)
    assert "a[/]\\x1b[2J\\x9b1m.py" in err, repr(err)
