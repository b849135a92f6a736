"""Grade one SWE-bench instance the way SWE-bench grades it, in the grading copy (stdlib, and the swebench
package's log parsers when they are importable: rollout's verifier runs it in its sandbox, with the
`python3` on its PATH, from the task's hidden folder, next to `instance.json` and `test.patch`).

    python3 .polarproxy_grading/grade.py

The copy is the task's workspace (a repository of one commit, at `base_commit`) with the agent's changes
applied (`grade_from: patch`). As SWE-bench's evaluation script does: the files the test patch touches are
reset to `base_commit` (a new one is removed), the test patch is applied, the tests it touches run under
pytest with `-rA`, and each test's status is read from its output: with the official `swebench` package's
log parser where that package is importable here (`pip install 'polarproxy[swebench]'`: only its parsers
are used) and knows the repository (by the row's `log_parser`, else by its repository) with a parser of
pytest's output, else from pytest's short summary lines. Resolved when every FAIL_TO_PASS and every
PASS_TO_PASS test passes (PASSED or XFAIL). The last line printed is JSON: `{"resolved", "parser", "tests":
{id: status}}` (`parser`: which one read the log); the exit code is 0 when resolved, 1 when not, 2 when the
test patch does not apply.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PASSING = ("PASSED", "XFAIL")
SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")
DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


def touched_files(patch: str) -> list[str]:
    """The paths a unified git diff touches (both sides of a rename), in order."""
    seen: list[str] = []
    for a, b in DIFF_FILE.findall(patch):
        for path in (a, b):
            if path not in seen:
                seen.append(path)
    return seen


def parse_pytest_summary(output: str) -> dict[str, str]:
    """test ID -> status, from pytest's `-rA` short summary lines."""
    status: dict[str, str] = {}
    for line in output.splitlines():
        m = SUMMARY.match(line.strip())
        if m:
            status[m.group(2)] = m.group(1)
    return status


# SWE-bench's parsers of repositories it runs with another test runner than pytest: their logs are not
# what this grader makes (it runs pytest), so pytest's own lines are read for them
NOT_PYTEST_PARSERS = ("parse_log_django", "parse_log_sympy")


@functools.cache  # once: the stand-ins below have no __spec__ for find_spec to read again
def _import_parsers() -> tuple[dict, dict] | None:
    """swebench's (PARSER_REGISTRY, MAP_REPO_TO_PARSER_PY), or None where it is not installed (or has
    neither). Its `swebench` and `swebench.harness` packages are stood in for by bare ones first: their own
    __init__ imports its Docker, Modal and datasets clients (2-4 s a grading, measured here; the parsers
    alone take 20 ms), and the parsers need none of them."""
    import importlib.util
    import types

    try:
        found = importlib.util.find_spec("swebench")
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    root = next(iter(found.submodule_search_locations))
    for name, folder in (("swebench", root), ("swebench.harness", os.path.join(root, "harness"))):
        if name not in sys.modules:
            stand_in = types.ModuleType(name)
            stand_in.__path__ = [folder]
            sys.modules[name] = stand_in
    try:
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY
    except Exception:  # a version without these names
        return None
    return PARSER_REGISTRY, MAP_REPO_TO_PARSER_PY


def official_parser(spec: dict) -> tuple[str, object] | None:
    """(name, function) of the swebench package's parser for this instance, or None (not installed, or it
    does not know the repository, or its parser reads another runner's log)."""
    parsers = _import_parsers()
    if parsers is None:
        return None
    registry, by_repo = parsers
    parse = registry.get(spec.get("log_parser") or "") or by_repo.get(spec.get("repo", ""))
    if parse is None or parse.__name__ in NOT_PYTEST_PARSERS:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("swebench")
    except PackageNotFoundError:
        release = "?"
    return f"swebench {release} {parse.__name__}", parse


def read_statuses(output: str, spec: dict) -> tuple[str, dict[str, str]]:
    """(the parser used, test ID -> status) of a pytest -rA log."""
    official = official_parser(spec)
    if official is not None:
        from types import SimpleNamespace

        name, parse = official
        fields = ("instance_id", "repo", "version", "FAIL_TO_PASS", "PASS_TO_PASS", "log_parser")
        test_spec = SimpleNamespace(image="", eval_script_list=[], **{k: spec.get(k, "") for k in fields})
        return name, dict(parse(output, test_spec))  # type: ignore[operator]
    return "pytest -rA", parse_pytest_summary(output)


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    # the copy's .git is the task's own (the agent's changes to .git are never applied), owned by the
    # verifier's user or not: safe.directory lets git read it either way
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args], capture_output=True, text=True, check=False
    )


def main() -> int:
    with open(os.path.join(HERE, "instance.json"), encoding="utf-8") as f:
        spec = json.load(f)
    patch_path = os.path.join(HERE, "test.patch")
    with open(patch_path, encoding="utf-8") as f:
        patch = f.read()
    touched = touched_files(patch)
    head = _git("rev-parse", "--verify", "HEAD")
    if head.returncode != 0:
        print(f"the grading copy is not the task's repository: {head.stderr.strip()}")
        print(json.dumps({"resolved": False, "parser": None, "tests": {}}))
        return 2
    for path in touched:  # back to base_commit: what the agent did to the tests does not count
        if _git("cat-file", "-e", f"HEAD:{path}").returncode == 0:
            _git("checkout", "HEAD", "--", path)
        elif os.path.lexists(path):
            os.remove(path)
    applied = _git("apply", "--binary", patch_path)
    if applied.returncode != 0:
        print(f"the test patch does not apply: {applied.stderr.strip()}")
        print(json.dumps({"resolved": False, "parser": None, "tests": {}}))
        return 2
    test_files = [p for p in touched if p.endswith(".py") and os.path.exists(p)]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *test_files],
        capture_output=True,
        text=True,
        check=False,
    )
    output = run.stdout + run.stderr
    print(output[-4000:])
    parser, status = read_statuses(output, spec)
    wanted = list(spec["FAIL_TO_PASS"]) + list(spec["PASS_TO_PASS"])
    tests = {t: status.get(t, "MISSING") for t in wanted}
    resolved = bool(wanted) and all(s in PASSING for s in tests.values())
    print(json.dumps({"resolved": resolved, "parser": parser, "tests": tests}))
    return 0 if resolved else 1


if __name__ == "__main__":
    sys.exit(main())
