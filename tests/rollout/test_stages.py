"""The stage pipeline without a gateway: an in-memory episode source records what `rollout` tells it, and
shell commands stand in for harnesses (isolation none)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from polarproxy.client import EpisodeHandle
from polarproxy.rewards.verifier import VerifierResult
from polarproxy.rollout.episodes import PriorEpisode
from polarproxy.rollout.run import Plan, Rollout, summary
from polarproxy.rollout.sandbox import Runner
from polarproxy.rollout.stages import Settings
from polarproxy.rollout.tasks import load_tasks


class MemoryEpisodes:
    url, port, db = "http://127.0.0.1:9", 9, "memory"

    def __init__(self, prior: list[PriorEpisode] | None = None) -> None:
        self.lock = threading.Lock()
        self.created: dict[str, dict] = {}
        self.finished: dict[str, tuple[str, int | None]] = {}
        self.rewards: dict[str, list[VerifierResult]] = {}
        self._prior = prior or []

    def create(self, *, task, group, harness, metadata, command=None) -> EpisodeHandle:
        eid = f"ep-{task}-{metadata['sample']}"
        with self.lock:
            self.created[eid] = {"task": task, "group": group, "metadata": metadata}
        return EpisodeHandle(
            eid, "key", {"openai": self.url + "/v1", "anthropic": self.url, "gemini": self.url}
        )

    def end(self, episode_id, *, exit_code, result, stages=None) -> None:
        assert episode_id not in self.finished, f"{episode_id} ended twice"
        self.finished[episode_id] = exit_code
        if result is not None:
            self.rewards.setdefault(episode_id, []).append(result)

    def prior(self, rollout_id, groups):
        assert groups == ["ro_t:t"]
        return self._prior

    def calls_made(self, episode_id, group) -> int:
        return 1  # these agents stand for harnesses that reached the model

    def close(self) -> None:
        pass


def _tasks(tmp_path: Path, **task) -> Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "f.txt").write_text("x")
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "expected").write_text("solved\n")
    line = {"id": "t", "instruction": "solve", "workspace": "ws", "tests": "hidden", **task}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(line) + "\n")
    return path


def _settings(episodes, command: str, **kw) -> Settings:
    return Settings(
        rollout_id="ro_t", episodes=episodes, runner=Runner(), command=["/bin/sh", "-c", command], **kw
    )


def test_min_samples_accepts_the_group_and_stops_the_rest_as_aborted(tmp_path: Path) -> None:
    tasks = load_tasks(_tasks(tmp_path, verify="true"))
    episodes = MemoryEpisodes()
    # samples 0 and 1 finish at once; 2 and 3 would run a minute
    cmd = 'case "$POLARPROXY_EPISODE" in *-0|*-1) exit 0;; *) exec sleep 60;; esac'
    t0 = time.monotonic()
    jobs = Rollout(Plan(tasks, 4, 4, min_samples=2), _settings(episodes, cmd)).run()
    assert time.monotonic() - t0 < 20
    states = {j.sample: j.state for j in jobs}
    assert states == {0: "done", 1: "done", 2: "aborted", 3: "aborted"}
    for j in jobs[2:]:
        assert j.reason == "aborted: the group was accepted with 2 of 4 samples"
        assert episodes.finished[f"ep-t-{j.sample}"] == 130  # stopped
        assert [r.reward for r in episodes.rewards[f"ep-t-{j.sample}"]] == [None]
        assert episodes.rewards[f"ep-t-{j.sample}"][0].note == j.reason
    s = summary(jobs, _settings(episodes, cmd), wall_s=1.0)
    assert s["tasks"]["t"]["rewards"] == [1.0, 1.0] and s["states"] == {"done": 2, "aborted": 2}


def test_harness_sees_instruction_on_stdin_and_env_and_verify_sees_hidden_tests(tmp_path: Path) -> None:
    tasks = load_tasks(_tasks(tmp_path, verify="cmp answer tests/expected", setup=["echo set > setup.txt"]))
    episodes = MemoryEpisodes()
    cmd = 'test -f setup.txt && test ! -e tests && read line && [ "$line" = "$POLARPROXY_INSTRUCTION" ] && echo solved > answer'
    jobs = Rollout(Plan(tasks, 2, 2), _settings(episodes, cmd)).run()
    assert [j.state for j in jobs] == ["done", "done"]
    assert [j.reward for j in jobs] == [1.0, 1.0]
    assert episodes.created["ep-t-0"]["group"] == "ro_t:t"
    assert episodes.created["ep-t-1"]["metadata"] == {"rollout_id": "ro_t", "task_id": "t", "sample": "1"}
    assert episodes.finished["ep-t-0"] == 0 and episodes.rewards["ep-t-0"][0].note == "exit code 0"


def test_hidden_tests_go_to_tests_dir_and_the_repositorys_own_tests_stay(tmp_path: Path) -> None:
    """A workspace with its own tests/ (a real repository's): with `tests_dir` the hidden tests land in a
    folder of their own in the grading copy, and the repository's tests/ is there as the agent left it."""
    path = _tasks(
        tmp_path,
        verify="cmp answer .grading/hidden/expected && test -f tests/own.py && test ! -e tests/hidden",
        tests_dir=".grading/hidden",
    )
    (tmp_path / "ws" / "tests").mkdir()
    (tmp_path / "ws" / "tests" / "own.py").write_text("def test_own(): pass\n")
    tasks = load_tasks(path)
    assert tasks[0].tests_dir == ".grading/hidden"
    # the agent plants a link where the hidden tests go: it is replaced, not followed
    cmd = "echo solved > answer && ln -s tests .grading"
    jobs = Rollout(Plan(tasks, 1, 1), _settings(MemoryEpisodes(), cmd)).run()
    assert [j.reward for j in jobs] == [1.0], [j.reward_note for j in jobs]


def test_grading_from_the_patch_applies_the_agents_changes_to_a_clean_copy_less_what_steers_the_tests(
    tmp_path: Path,
) -> None:
    """`"grade_from": "patch"`: verify runs in a clean copy of the task's workspace with the agent's changes
    applied (an added binary file, a deletion, a rename), and without its conftest.py, its edit of
    pyproject's pytest section, its caches and its harness folder, each counted in the reward's note."""
    checks = [
        "cmp answer tests/expected",
        "test -f bin.dat",
        "test ! -e f.txt",
        "test -f pkg/renamed.py && test ! -e pkg/mod.py",
        "test ! -e conftest.py",
        "grep -q 'addopts = \"-q\"' pyproject.toml",
        "test ! -e __pycache__ && test ! -e .codex",
    ]
    path = _tasks(tmp_path, verify=" && ".join(checks), grade_from="patch")
    (tmp_path / "ws" / "pkg").mkdir()
    (tmp_path / "ws" / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "ws" / "pyproject.toml").write_text(
        '[project]\nname = "t"\n\n[tool.pytest.ini_options]\naddopts = "-q"\n'
    )
    agent = " && ".join(
        [
            "echo solved > answer",
            "printf '\\000\\001\\377' > bin.dat",
            "rm f.txt",
            "mv pkg/mod.py pkg/renamed.py",
            "echo 'def pytest_collection_modifyitems(items): items.clear()' > conftest.py",
            "mkdir __pycache__ && touch __pycache__/m.pyc && mkdir .codex && echo s > .codex/state",
        ]
    )
    episodes = MemoryEpisodes()
    jobs = Rollout(Plan(load_tasks(path), 1, 1), _settings(episodes, agent)).run()
    assert [j.reward for j in jobs] == [1.0], [j.reward_note for j in jobs]
    note = jobs[0].reward_note
    assert "3 file(s) changed, 2 deleted" in note and "1 cache, 1 harness, 1 steers-tests" in note, note
    # stored with the reward: what was applied, as a diff (binary files named, the rename a delete and an add)
    (result,) = episodes.rewards[jobs[0].episode.episode_id]
    heads = [
        line
        for line in result.patch.splitlines()
        if line.startswith(("diff ", "new ", "deleted ", "Binary "))
    ]
    assert heads == [
        "diff --git a/answer b/answer",
        "new file",
        "diff --git a/bin.dat b/bin.dat",
        "new file",
        "Binary files /dev/null and b/bin.dat differ (b: binary)",
        "diff --git a/f.txt b/f.txt",
        "deleted file",
        "diff --git a/pkg/mod.py b/pkg/mod.py",
        "deleted file",
        "diff --git a/pkg/renamed.py b/pkg/renamed.py",
        "new file",
    ], result.patch
    assert "+solved\n" in result.patch and "-x = 1\n" in result.patch
    # the same agent editing pyproject's pytest section: that file is left out whole
    (tmp_path / "ws2").mkdir()
    for f in ("f.txt", "pyproject.toml"):
        (tmp_path / "ws2" / f).write_bytes((tmp_path / "ws" / f).read_bytes())
    line = {
        "id": "t",
        "instruction": "solve",
        "workspace": "ws2",
        "tests": "hidden",
        "grade_from": "patch",
        "verify": "grep -q 'addopts = \"-q\"' pyproject.toml && cmp answer tests/expected",
    }
    (tmp_path / "tasks2.jsonl").write_text(json.dumps(line) + "\n")
    agent = 'echo solved > answer && sed -i \'s/-q/-p no:terminal/; s/name = "t"/name = "t"\\nversion = "2"/\' pyproject.toml'
    jobs = Rollout(
        Plan(load_tasks(tmp_path / "tasks2.jsonl"), 1, 1), _settings(MemoryEpisodes(), agent)
    ).run()
    assert [j.reward for j in jobs] == [1.0] and "1 steers-tests (pyproject.toml)" in jobs[0].reward_note


def test_harness_past_its_timeout_is_killed_and_still_evaluated(tmp_path: Path) -> None:
    tasks = load_tasks(_tasks(tmp_path, verify="test -f answer", timeout_s=0.5))
    episodes = MemoryEpisodes()
    t0 = time.monotonic()
    jobs = Rollout(Plan(tasks, 1, 1), _settings(episodes, "sleep 60; touch answer")).run()
    assert time.monotonic() - t0 < 15
    assert jobs[0].harness_timed_out and jobs[0].reward == 0.0
    assert episodes.finished["ep-t-0"] == 124  # as timeout(1) says


def test_failed_setup_fails_the_episode_with_the_reason_and_runs_no_harness(tmp_path: Path) -> None:
    tasks = load_tasks(_tasks(tmp_path, verify="true", setup=["exit 3"]))
    episodes = MemoryEpisodes()
    jobs = Rollout(Plan(tasks, 1, 1), _settings(episodes, "true")).run()
    assert jobs[0].state == "failed" and jobs[0].reason.startswith(
        "prewarm: setup command 0 ('exit 3') exited 3"
    )
    assert episodes.created == {}


def test_resume_skips_pairs_finished_with_a_reward_and_reruns_the_rest(tmp_path: Path) -> None:
    tasks = load_tasks(_tasks(tmp_path, verify="true"))
    md = {"rollout_id": "ro_t", "task_id": "t"}
    prior = [
        PriorEpisode("old-0", "ok", 1.0, {**md, "sample": "0"}),
        PriorEpisode("old-1", "running", None, {**md, "sample": "1"}),  # killed mid-run
        PriorEpisode("old-2", "ok", None, {**md, "sample": "2"}),  # killed before its reward
    ]
    episodes = MemoryEpisodes(prior)
    jobs = Rollout(Plan(tasks, 3, 3, resume=True), _settings(episodes, "true")).run()
    assert [j.state for j in jobs] == ["skipped", "done", "done"]
    assert sorted(episodes.created) == ["ep-t-1", "ep-t-2"]


def test_rollout_id_with_episodes_is_refused_without_resume(tmp_path: Path) -> None:
    import pytest

    from polarproxy.errors import UsageError

    tasks = load_tasks(_tasks(tmp_path, verify="true"))
    episodes = MemoryEpisodes(
        [PriorEpisode("old", "ok", 1.0, {"rollout_id": "ro_t", "task_id": "t", "sample": "0"})]
    )
    with pytest.raises(UsageError, match="already has episodes") as e:
        Rollout(Plan(tasks, 1, 1), _settings(episodes, "true")).run()
    assert "--resume" in (e.value.hint or "")


def test_a_key_the_agent_wrote_into_its_changes_is_redacted_in_the_stored_diff(tmp_path: Path) -> None:
    """The agent's diff is stored with the reward (and shown, exported): a secret the agent copied into a
    file does not reach the store through it (T5)."""
    key = "sk-proj-abcdefghijklmnopqrstuvwx0123"
    path = _tasks(tmp_path, verify="cmp answer tests/expected", grade_from="patch")
    episodes = MemoryEpisodes()
    agent = f"echo solved > answer && echo 'OPENAI_API_KEY={key}' > leak.env"
    jobs = Rollout(Plan(load_tasks(path), 1, 1), _settings(episodes, agent)).run()
    (result,) = episodes.rewards[jobs[0].episode.episode_id]
    assert jobs[0].reward == 1.0 and "diff --git a/leak.env b/leak.env" in result.patch
    assert key not in result.patch and "<redacted>" in result.patch
