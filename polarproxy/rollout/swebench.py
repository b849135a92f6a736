"""SWE-bench instances as a rollout task source: a JSONL or Parquet file of rows with `instance_id`, `repo`,
`base_commit`, `problem_statement`, `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS` (lists or JSON strings),
optionally `version` and `environment_setup_commit`, and `--repos DIR` holding a clone (or mirror) of each
repository, named `owner__name`.

Each instance becomes a task (task.py's Task): its ID is the `instance_id`, its instruction the
`problem_statement`, and its workspace the repository at `base_commit` with no history after it: a fresh
repository of one commit, made once per instance from `git archive` of the clone (so neither the gold patch
nor any later commit is reachable from what the agent gets), under `CACHE/swebench/INSTANCE-COMMIT/`. The
hidden folder holds the test patch, the instance's tests and the grader (swebench_grade.py), placed at
`.polarproxy_grading/` in the grading copy; grading is from the agent's patch (`grade_from: patch`) on a
clean copy, as SWE-bench grades. Git runs here only on the clones the user gave, never on an agent's folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from polarproxy.rollout.tasks import Task, TaskError

FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
GRADING_DIR = ".polarproxy_grading"
GRADER = Path(__file__).resolve().parent / "swebench_grade.py"
# one fixed identity and date, so the workspace's one commit is the same however often it is made
GIT_ENV = {
    "GIT_AUTHOR_NAME": "polarproxy",
    "GIT_AUTHOR_EMAIL": "polarproxy@localhost",
    "GIT_COMMITTER_NAME": "polarproxy",
    "GIT_COMMITTER_EMAIL": "polarproxy@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


def is_swebench(path: Path) -> bool:
    """Whether the source is SWE-bench instances (a Parquet file, or JSONL whose first row has an
    `instance_id`), not a TASKS file."""
    if path.suffix == ".parquet":
        return True
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip() and not line.lstrip().startswith("#"):
                    row = json.loads(line)
                    return isinstance(row, dict) and "instance_id" in row
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return False


def _rows(path: Path) -> list[tuple[str, Any]]:
    """(where, row) for each instance of the source."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"{path}:row {i + 1}", r) for i, r in enumerate(pq.read_table(path).to_pylist())]
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.append((f"{path}:{n}", json.loads(line)))
        except ValueError as e:
            raise TaskError(f"{path}:{n}: not JSON ({e})", hint="One SWE-bench instance per line.") from None
    return out


def _test_list(value: Any, name: str, where: str) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise TaskError(
                f"{where}: field '{name}' is not a list or a JSON list",
                hint='e.g. ["tests/test_a.py::test_x"]',
            ) from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise TaskError(
            f"{where}: field '{name}' must be a list of test IDs", hint='e.g. ["tests/test_a.py::test_x"]'
        )
    return value


def _git(repo: Path, *args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False, **kw)


def _workspace(clone: Path, commit: str, into: Path, where: str) -> None:
    """The clone's tree at `commit` as a fresh repository of one commit at `into` (made once)."""
    if (into / ".git").is_dir():
        into.chmod(0o755)  # one made before mkdtemp's 0700 was opened up (an episode user could not enter it)
        return
    archive = _git(clone, "archive", "--format=tar", commit)
    if archive.returncode != 0:
        raise TaskError(
            f"{where}: base_commit {commit} is not in {clone}: {archive.stderr.decode(errors='replace').strip()}",
            hint="Fetch it into the clone (git fetch), or pass the --repos folder that has it.",
        )
    tmp = Path(tempfile.mkdtemp(dir=into.parent, prefix=f".{into.name}."))
    try:
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True, capture_output=True)
        env = {**os.environ, **GIT_ENV}
        for args in (("init", "-q"), ("add", "-A"), ("commit", "-q", "--no-verify", "-m", f"base {commit}")):
            done = _git(tmp, *args, env=env)
            if done.returncode != 0:
                raise TaskError(
                    f"{where}: cannot make the workspace: git {args[0]}: {done.stderr.decode(errors='replace')}"
                )
        tmp.chmod(0o755)  # mkdtemp's 0700 would keep each episode's user out of its copy
        os.replace(tmp, into)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_swebench(path: Path, repos: Path | None, cache: Path) -> list[Task]:
    """The tasks of a SWE-bench source; TaskError naming the row and field for a bad row, a missing
    repository or commit (nothing is run)."""
    if repos is None:
        raise TaskError(
            f"{path} holds SWE-bench instances; they need --repos DIR with a clone of each repository.",
            hint="Clone each one there named owner__name, e.g. git clone https://github.com/psf/requests repos/psf__requests",
        )
    rows = _rows(path)
    if not rows:
        raise TaskError(f"{path} holds no instances.", hint="One SWE-bench instance per line.")
    checked = []
    seen: set[str] = set()
    for where, row in rows:
        if not isinstance(row, dict):
            raise TaskError(
                f"{where}: an instance must be a JSON object", hint="One SWE-bench instance per line."
            )
        missing = [f for f in FIELDS if not row.get(f)]
        if missing:
            raise TaskError(
                f"{where}: field(s) {', '.join(missing)} missing or empty",
                hint=f"Each instance needs {', '.join(FIELDS)}.",
            )
        iid = str(row["instance_id"])
        if iid in seen:
            raise TaskError(f"{where}: instance_id {iid!r} appears twice", hint="Give each instance once.")
        seen.add(iid)
        f2p = _test_list(row["FAIL_TO_PASS"], "FAIL_TO_PASS", where)
        p2p = _test_list(row["PASS_TO_PASS"] or "[]", "PASS_TO_PASS", where)
        clone = repos / str(row["repo"]).replace("/", "__")
        if not clone.is_dir():
            raise TaskError(
                f"{where}: no clone of {row['repo']} at {clone}",
                hint=f"git clone the repository into {clone}",
            )
        checked.append((where, row, iid, f2p, p2p, clone))
    tasks = []
    for where, row, iid, f2p, p2p, clone in checked:
        folder = cache / "swebench" / f"{iid}-{str(row['base_commit'])[:12]}"
        folder.mkdir(parents=True, exist_ok=True)
        _workspace(clone, str(row["base_commit"]), folder / "workspace", where)
        hidden = folder / "hidden"
        hidden.mkdir(exist_ok=True)
        (hidden / "test.patch").write_text(str(row["test_patch"]), encoding="utf-8")
        (hidden / "instance.json").write_text(
            json.dumps(
                {
                    "instance_id": iid,
                    "repo": str(row["repo"]),
                    "version": str(row.get("version") or ""),
                    "FAIL_TO_PASS": f2p,
                    "PASS_TO_PASS": p2p,
                    "log_parser": str(row.get("log_parser") or ""),  # SWE-bench 5's own rows name it
                }
            ),
            encoding="utf-8",
        )
        shutil.copyfile(GRADER, hidden / "grade.py")
        tasks.append(
            Task(
                id=iid,
                instruction=str(row["problem_statement"]),
                workspace=folder / "workspace",
                verify=f"python3 {GRADING_DIR}/grade.py",
                tests=hidden,
                tests_dir=GRADING_DIR,
                grade_from="patch",
                metadata={
                    "source": "swebench",
                    "repo": str(row["repo"]),
                    "base_commit": str(row["base_commit"]),
                    "version": str(row.get("version") or ""),
                },
            )
        )
    return tasks


def default_cache() -> Path:
    """Where instance workspaces are made ($XDG_CACHE_HOME/polarproxy, else ~/.cache/polarproxy)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "polarproxy"
