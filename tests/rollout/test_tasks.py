"""The TASKS file: the example set loads, every mistake is named with its line, and the JSON Schema in
schemas/ agrees with the loader on what a line is."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from rollout_support import EXAMPLE, REPO

from polarproxy.rollout.tasks import TaskError, load_tasks

SCHEMA = json.loads((REPO / "schemas" / "rollout-task.v2.json").read_text())


def test_example_tasks_load_with_paths_resolved_against_the_file() -> None:
    tasks = load_tasks(EXAMPLE / "tasks.jsonl")
    assert [t.id for t in tasks] == ["greet", "shout"]
    greet = tasks[0]
    assert greet.workspace == (EXAMPLE / "tasks" / "greet" / "workspace").resolve()
    assert greet.tests == (EXAMPLE / "tasks" / "greet" / "tests").resolve()
    assert greet.setup == ("test -f README.md",) and greet.timeout_s == 120.0
    assert greet.metadata == {"difficulty": "easy"}
    for line in (EXAMPLE / "tasks.jsonl").read_text().splitlines():
        jsonschema.validate(json.loads(line), SCHEMA)


def _write(tmp_path: Path, *lines: object) -> Path:
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "ws" / "t").mkdir(exist_ok=True)
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


GOOD = {"id": "a", "instruction": "do it", "workspace": "ws", "verify": "true"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({k: v for k, v in GOOD.items() if k != "verify"}, "field 'verify' is missing"),
        ({**GOOD, "workspace": "nowhere"}, "workspace 'nowhere' is not a folder"),
        ({**GOOD, "tests": "ws/t"}, "lies inside the workspace"),
        ({**GOOD, "timeout_s": 0}, "timeout_s 0 must be a positive number"),
        ({**GOOD, "extra": 1}, "unknown field(s) extra"),
        ({**GOOD, "id": "a b"}, "id 'a b' must be"),
        ({**GOOD, "setup": [1]}, "field 'setup' must be"),
        ("{not json", "not JSON"),
        ({**GOOD, "tests_dir": "../out"}, "tests_dir '../out' must be a folder path inside the workspace"),
        ({**GOOD, "tests_dir": "/abs"}, "tests_dir '/abs' must be a folder path inside the workspace"),
        ({**GOOD, "tests_dir": "hidden"}, "give 'tests' too"),
    ],
)
def test_bad_task_line_is_named_with_its_line_and_field(tmp_path: Path, line: object, message: str) -> None:
    path = _write(tmp_path, "# a comment", line)
    with pytest.raises(TaskError) as e:
        load_tasks(path)
    assert f"{path}:2:" in e.value.message and message in e.value.message, e.value.message
    if (
        isinstance(line, dict)
        and "workspace" in line
        and line.get("workspace") == "ws"
        and "tests" not in line
    ):
        with pytest.raises(jsonschema.ValidationError):  # the schema refuses it too
            jsonschema.validate(line, SCHEMA)


def test_duplicate_task_ids_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="used on line 1 too"):
        load_tasks(_write(tmp_path, GOOD, GOOD))


def test_empty_tasks_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="holds no task"):
        load_tasks(_write(tmp_path, ""))


def test_tasks_check_prints_what_each_task_will_run_and_names_a_bad_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from polarproxy.cli import make_app

    app = make_app("tasks")
    ok = CliRunner().invoke(
        app, ["tasks", "check", str(REPO / "examples" / "rollout" / "tasks.jsonl"), "--json"]
    )
    assert ok.exit_code == 0, ok.output
    plans = json.loads(ok.stdout)["tasks"]
    assert [p["id"] for p in plans] == ["greet", "shout"]
    assert plans[0]["verify"] == "python3 tests/check_greeting.py" and plans[0]["tests_dir"] == "tests"
    assert plans[0]["grade_from"] == "workspace"
    path = _write(tmp_path, {**GOOD, "grade_from": "git"})
    bad = CliRunner().invoke(app, ["tasks", "check", str(path)])
    assert (
        bad.exit_code == 1 and f"{path}:1: grade_from 'git' must be one of 'workspace', 'patch'" in bad.output
    )
    assert "Traceback" not in bad.output
