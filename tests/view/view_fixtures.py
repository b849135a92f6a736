"""The viewer tests' kit: a store made with the Store API (episodes, calls, rewards, groups, a 100k-token
trajectory), a `train` metrics folder, `polarproxy view` as a real subprocess, and a Chromium page that records
console errors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarproxy.conversation import Conversation, Message, Tool
from polarproxy.store import CallResult, CallStart, Store
from polarproxy.store.records import EpisodeStart, RewardOrigin

# what a graded task stores with the main episode's reward: the agent's diff and the grader's tests
PATCH = "diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
GRADING = {
    "resolved": False,
    "parser": "pytest -rA",
    "tests": {"tests/test_app.py::test_x": "PASSED", "tests/test_app.py::test_y": "FAILED"},
}

CHROMIUM = os.environ.get("POLARPROXY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
BIG_TOKENS = 100_000
TOOLS = [
    Tool(name="run", description="Run a shell command.", parameters={"type": "object", "properties": {}})
]


@dataclass
class Built:
    """What the store holds, as the tests need to find it."""

    db: Path
    model_dir: Path
    metrics_dir: Path
    main: str  # the episode with branches, a drifted call, a side request and a failed call
    main_calls: list[str] = field(default_factory=list)
    big: str = ""  # one call of BIG_TOKENS tokens
    big_call: str = ""
    group_g1: list[str] = field(default_factory=list)
    group_g2: list[str] = field(default_factory=list)


def _logprobs(n: int, seed: int) -> list[float]:
    """Logprobs float32 holds exactly, spread from sure (-1/64) to unsure (-4)."""
    return [-(((i * 7 + seed) % 64) + 1) / 16 for i in range(n)]


def _start(episode_id: str, conv: Conversation | None, prompt: list[int], **kw: Any) -> CallStart:
    return CallStart(
        episode_id=episode_id,
        dialect=kw.pop("dialect", "openai_chat"),
        method="POST",
        path="/v1/chat/completions",
        model="tiny",
        stream=True,
        request_headers={},
        request_body="{}",
        conversation=None if conv is None else conv.to_dict(),
        prompt_ids=prompt,
        backend_kind="sglang",
        **kw,
    )


def _ok(output: list[int], *, seed: int, latency: float, ttft: float) -> CallResult:
    return CallResult(
        status="ok",
        output_ids=output,
        output_logprobs=_logprobs(len(output), seed),
        completion={"text": "hello world", "reasoning": None, "tool_calls": []},
        finish_reason="stop",
        weight_version="w1",
        latency_ms=latency,
        ttft_ms=ttft,
    )


def build_store(db: Path, model_dir: Path, metrics_dir: Path) -> Built:
    from polarproxy.render.renderer import Renderer
    from polarproxy.train.metrics import METRIC_KEYS, MetricsLog

    r = Renderer(model_dir)
    end = r.encode("<|im_end|>")
    store = Store.open(db)
    meta = {"model_dir": str(model_dir)}
    main = store.create_episode(
        EpisodeStart(
            command=["qwen", "-p", "list files"], harness="qwen-code", task="t1", group_id="g1", metadata=meta
        )
    )
    built = Built(db=db, model_dir=model_dir, metrics_dir=metrics_dir, main=main)
    user = Message(role="user", content="List the files.")
    reply = Message(role="assistant", content="hello world")
    conv0 = Conversation(messages=[user], tools=TOOLS)
    prompt0 = r.render(conv0).ids
    out0 = r.encode("hello  world") + end  # what the model sampled: a double space the text does not keep
    c0, _ = store.begin_call(_start(main, conv0, prompt0))
    store.finish_call(c0, _ok(out0, seed=1, latency=180.0, ttft=40.0))

    def follow_up(text: str) -> tuple[Conversation, list[int]]:
        conv = Conversation(messages=[user, reply, Message(role="user", content=text)], tools=TOOLS)
        tail = r.encode(f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        return conv, prompt0 + out0 + tail

    conv1, prompt1 = follow_up("Again.")
    c1, _ = store.begin_call(_start(main, conv1, prompt1, render_mode="extended", extended_from=c0))
    store.finish_call(c1, _ok(r.encode("done") + end, seed=2, latency=90.0, ttft=25.0))
    side = Conversation(messages=[Message(role="system", content="Write a title."), user])
    c2, _ = store.begin_call(
        _start(
            main, side, r.render(side).ids, render_note="message 0 differs from call c0's (a side request)"
        )
    )
    store.finish_call(c2, _ok(r.encode("Files") + end, seed=3, latency=60.0, ttft=15.0))
    c3, _ = store.begin_call(_start(main, conv1, prompt1, dialect="anthropic"))
    store.finish_call(
        c3, CallResult(status="failed", error="backend answered 500", http_status=502, latency_ms=12.0)
    )
    conv4, prompt4 = follow_up("Other.")
    c4, _ = store.begin_call(_start(main, conv4, prompt4, render_mode="extended", extended_from=c0))
    store.finish_call(c4, _ok(r.encode("ok") + end, seed=4, latency=70.0, ttft=20.0))
    built.main_calls = [c0, c1, c2, c3, c4]
    store.finish_episode(main, status="ok", exit_code=0)
    store.set_reward(
        main,
        1.0,
        origin=RewardOrigin(
            source="command",
            command=["pytest", "-q"],
            exit_code=0,
            output_tail="1 passed",
            patch=PATCH,
            grading=GRADING,
        ),
    )
    built.group_g1.append(main)

    def small(group: str | None, task: str | None, reward: float | None, status: str = "ok") -> str:
        ep = store.create_episode(
            EpisodeStart(command=["agent", task or "-"], task=task, group_id=group, metadata=meta)
        )
        cid, _ = store.begin_call(_start(ep, conv0, prompt0))
        store.finish_call(cid, _ok(out0, seed=5, latency=100.0, ttft=30.0))
        store.finish_episode(ep, status=status, exit_code=0 if status == "ok" else 1)  # type: ignore[arg-type]
        if reward is not None:
            store.set_reward(ep, reward)
        return ep

    built.group_g1 += [small("g1", "t1", 0.0), small("g1", "t1", 0.5, status="failed")]
    built.group_g2 = [small("g2", "t2", 1.0), small("g2", "t2", 1.0)]
    small(None, None, None)
    big = store.create_episode(EpisodeStart(command=["agent", "--long"], task="long", metadata=meta))
    vocab = 4000
    prompt = [(i * 7919) % vocab for i in range(BIG_TOKENS - 500)]
    cbig, _ = store.begin_call(_start(big, None, prompt))
    store.finish_call(cbig, _ok([(i * 31) % vocab for i in range(500)], seed=6, latency=5000.0, ttft=900.0))
    store.finish_episode(big, status="ok", exit_code=0)
    built.big, built.big_call = big, cbig
    store.close()
    log = MetricsLog(metrics_dir)
    for step in range(1, 13):
        row: dict[str, Any] = {k: None for k in METRIC_KEYS}
        row.update(
            step=step,
            loss=1.0 / step,
            clip_frac=0.02 * (step % 4),
            reward_mean=0.1 * step,
            weight_version=str(step),
        )
        row["kl"] = None if step == 5 else 0.001 * step
        log.write(row)
    return built


@dataclass
class ViewServer:
    proc: subprocess.Popen[str]
    url: str
    stderr: list[str]


def start_view(*args: str) -> ViewServer:
    """`polarproxy view ARGS --port 0` as a real subprocess; returns once it printed its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "polarproxy", "view", "--port", "0", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        m = re.search(r"serving (http://\S+/)", line)
        if m:
            threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
            return ViewServer(proc, m.group(1), lines)
    proc.wait(10)
    raise RuntimeError("polarproxy view did not start:\n" + "".join(lines))


def chromium_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright's Python package is not installed (pip install playwright)"
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


@dataclass
class Page:
    """A browser page that records console errors and page errors."""

    page: Any
    errors: list[str]
    shots: Path

    def open(self, url: str) -> Any:
        self.page.goto(url)
        return self.wait_ready()

    def wait_ready(self) -> Any:
        self.page.wait_for_selector('main[data-ready="1"]', timeout=30_000)
        return self.page

    def go(self, hash_: str) -> Any:
        """Navigate within the page (a hash route) and wait until the view is drawn."""
        self.page.evaluate(
            "h => { document.getElementById('main').dataset.ready = '0'; location.hash = h; }", hash_
        )
        return self.wait_ready()

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=False)
        assert path.stat().st_size > 1000
        return path

    def assert_no_errors(self) -> None:
        assert self.errors == [], "the page logged errors:\n" + "\n".join(self.errors)
