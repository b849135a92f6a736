"""Five tiny SWE-bench-format instances, made here: a small git repository each (a bug at the base commit,
then one commit with its fix and the test that shows it), an issue text, a gold patch, a test patch, and
FAIL_TO_PASS / PASS_TO_PASS found by running the tests before and after the gold patch (as SWE-bench finds
them). Stdlib only, besides pytest to run the tests.

    python examples/swe/suite.py OUT        # writes OUT/repos/acme__NAME/ and OUT/instances.jsonl

then `polarproxy rollout OUT/instances.jsonl --repos OUT/repos ...` (docs/tasks.md; `make demo-swe`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "example",
    "GIT_AUTHOR_EMAIL": "example@localhost",
    "GIT_COMMITTER_NAME": "example",
    "GIT_COMMITTER_EMAIL": "example@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


@dataclass(frozen=True)
class Instance:
    name: str  # the repository acme/NAME; the instance ID is acme__NAME-N
    number: int
    issue: str
    module: str  # its file name
    buggy: str  # the module at the base commit
    fixed: str  # the module after the gold patch
    tests: str  # tests/test_NAME.py at the base commit
    new_tests: str  # what the test patch appends to it

    @property
    def instance_id(self) -> str:
        return f"acme__{self.name}-{self.number}"


INSTANCES = (
    Instance(
        "calc",
        1,
        "add() subtracts: add(2, 2) returns 0 instead of 4.",
        "calc.py",
        "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n",
        "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
        "from calc import add, sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n",
        "\n\ndef test_add():\n    assert add(2, 2) == 4\n",
    ),
    Instance(
        "text",
        2,
        "slugify() keeps capital letters: slugify('Hello World') gives 'Hello-World', not 'hello-world'.",
        "text.py",
        'def slugify(s):\n    return "-".join(s.split())\n',
        'def slugify(s):\n    return "-".join(s.lower().split())\n',
        'from text import slugify\n\n\ndef test_spaces():\n    assert slugify("a  b c") == "a-b-c"\n',
        '\n\ndef test_lowercase():\n    assert slugify("Hello World") == "hello-world"\n',
    ),
    Instance(
        "dates",
        3,
        "is_leap(1900) says True, but 1900 was not a leap year (a century is one only when divisible by 400).",
        "dates.py",
        "def is_leap(year):\n    return year % 4 == 0\n",
        "def is_leap(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
        "from dates import is_leap\n\n\ndef test_ordinary():\n    assert is_leap(2024) and not is_leap(2023)\n",
        "\n\ndef test_centuries():\n    assert not is_leap(1900) and is_leap(2000)\n",
    ),
    Instance(
        "stack",
        4,
        "Stack.peek() returns the bottom item instead of the top one.",
        "stack.py",
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
        "        self.items.append(x)\n\n    def pop(self):\n        return self.items.pop()\n\n"
        "    def peek(self):\n        return self.items[0]\n",
        "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
        "        self.items.append(x)\n\n    def pop(self):\n        return self.items.pop()\n\n"
        "    def peek(self):\n        return self.items[-1]\n",
        "from stack import Stack\n\n\ndef test_push_pop():\n    s = Stack()\n    s.push(1)\n    s.push(2)\n"
        "    assert s.pop() == 2\n",
        "\n\ndef test_peek():\n    s = Stack()\n    s.push(1)\n    s.push(2)\n    assert s.peek() == 2\n",
    ),
    Instance(
        "config",
        5,
        "parse_bool('yes') is False: it should accept yes/no as well as true/false.",
        "config.py",
        'def parse_bool(s):\n    return s.strip().lower() == "true"\n',
        'def parse_bool(s):\n    return s.strip().lower() in ("true", "yes")\n',
        'from config import parse_bool\n\n\ndef test_true_false():\n    assert parse_bool("True") and not parse_bool("false")\n',
        '\n\ndef test_yes_no():\n    assert parse_bool("yes") and not parse_bool("no")\n',
    ),
)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
    ).stdout


def test_statuses(repo: Path) -> dict[str, str]:
    """test ID -> status from pytest's -rA summary, run in `repo`."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    found = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", run.stdout, re.MULTILINE)
    return {test: status for status, test in found}


def make(inst: Instance, repos: Path) -> dict[str, object]:
    """The instance's repository under `repos`, and its SWE-bench row."""
    repo = repos / f"acme__{inst.name}"
    (repo / "tests").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / inst.module).write_text(inst.buggy)
    test_file = repo / "tests" / f"test_{inst.name}.py"
    test_file.write_text(inst.tests)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    test_file.write_text(inst.tests + inst.new_tests)
    test_patch = git(repo, "diff")
    before = test_statuses(repo)  # the test patch without the fix
    (repo / inst.module).write_text(inst.fixed)
    gold_patch = git(repo, "diff", "--", inst.module)
    after = test_statuses(repo)
    git(repo, "commit", "-q", "-am", f"Fix #{inst.number}")  # after base: never reachable from a workspace
    fail_to_pass = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED")
    pass_to_pass = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
    if not fail_to_pass or sorted(after.values()) != ["PASSED"] * len(after):
        raise SystemExit(
            f"{inst.instance_id}: the gold patch does not make its tests pass: {before} -> {after}"
        )
    return {
        "instance_id": inst.instance_id,
        "repo": f"acme/{inst.name}",
        "base_commit": base,
        "problem_statement": inst.issue,
        "patch": gold_patch,
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(fail_to_pass),  # JSON strings, as SWE-bench's own files hold them
        "PASS_TO_PASS": json.dumps(pass_to_pass),
        "version": "1.0",
    }


def build(out: Path) -> Path:
    """Write the five repositories and `out/instances.jsonl`; return the instances file."""
    repos = out / "repos"
    if repos.exists():
        raise SystemExit(f"{repos} exists: give an empty folder.")
    rows = [make(inst, repos) for inst in INSTANCES]
    source = out / "instances.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return source


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python examples/swe/suite.py OUT")
    print(build(Path(sys.argv[1])))
