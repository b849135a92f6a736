"""Real processes for the many-writers tests: the backend double (bench/stub_server.py) and
`polarproxy serve`, each a subprocess, and an agent-like client that drives many episodes at once."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _start(cmd: list[str], pattern: str, env: dict[str, str] | None = None) -> Proc:
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        m = re.search(pattern, line)
        if m:
            threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
            return Proc(proc, m.group(1), lines)
    proc.wait(10)
    raise RuntimeError(f"{cmd[2:4]} did not start:\n" + "".join(lines))


def start_stub(output_ids: list[int], text: str) -> Proc:
    return _start(
        [
            *(sys.executable, str(REPO / "bench" / "stub_server.py")),
            *("--output-ids", orjson.dumps(output_ids).decode(), "--text", text),
        ],
        r"listening on (http://[\d.]+:\d+)",
    )


def start_serve(backend_url: str, model_dir: Path, db: str, env: dict[str, str] | None = None) -> Proc:
    return _start(
        [
            *(sys.executable, "-m", "polarproxy", "serve", "--backend", backend_url),
            *("--model", str(model_dir), "--db", db, "--port", "0"),
        ],
        r"recording on (http://[\d.]+:\d+)",
        env,
    )


@dataclass
class EpisodeRun:
    """What one agent-like client sent and received in one episode."""

    episode_id: str
    users: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def run_episode(client: httpx.AsyncClient, proxy_url: str, run: EpisodeRun, calls: int) -> None:
    """`calls` chat calls, each repeating the history with the previous answer and a new user turn."""
    messages: list[dict[str, str]] = [{"role": "system", "content": f"You are agent {run.episode_id}."}]
    for k in range(calls):
        user = f"{run.episode_id} turn {k}: go on"
        messages.append({"role": "user", "content": user})
        try:
            r = await client.post(
                f"{proxy_url}/v1/chat/completions",
                json={"model": "tiny", "messages": messages, "max_tokens": 16},
                headers={"x-polarproxy-episode": run.episode_id},
            )
        except httpx.HTTPError as e:
            run.errors.append(f"call {k}: {type(e).__name__} {e}")
            return
        if r.status_code != 200:
            run.errors.append(f"call {k}: HTTP {r.status_code} {r.text[:200]}")
            return
        reply = r.json()["choices"][0]["message"]["content"]
        run.users.append(user)
        run.replies.append(reply)
        messages.append({"role": "assistant", "content": reply})


async def drive(proxies: list[str], episodes_per_proxy: int, calls: int, tag: str) -> list[EpisodeRun]:
    """All episodes of all proxies at once; returns what each episode sent and received."""
    runs: list[tuple[str, EpisodeRun]] = [
        (url, EpisodeRun(f"ep_{tag}_{p}_{e}"))
        for p, url in enumerate(proxies)
        for e in range(episodes_per_proxy)
    ]
    # No keep-alive: a pooled connection that the proxy closes as it is reused fails with a ReadError, and
    # then nobody can tell whether the call was recorded (a retry could record it twice).
    limits = httpx.Limits(max_connections=len(runs), max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(run_episode(client, url, run, calls) for url, run in runs))
    return [run for _, run in runs]
