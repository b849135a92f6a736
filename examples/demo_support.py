"""What the demos share (`make demo`, `make demo-swe`): their steps' headings, the tiny model they build
once, and the local backend they start on a free port."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / ".cache" / "demo-tiny"
CLI = [sys.executable, "-m", "polarproxy"]


def step(msg: str) -> None:
    print(f"\n\033[1m==> {msg}\033[0m", flush=True)


def ensure_tiny() -> Path:
    """The tiny model, built once (`polarproxy tiny-model`) into .cache/demo-tiny."""
    if not (TINY / "config.json").is_file():
        step("building the tiny model (once)")
        subprocess.run([*CLI, "tiny-model", str(TINY)], check=True)
    return TINY


def start_backend(*flags: str, echo: bool = True) -> tuple[subprocess.Popen[str], str]:
    """`polarproxy backend` over the tiny model on a free port, with `flags`; the process and its URL once
    it listens (its log echoed to stderr until then when `echo`)."""
    proc = subprocess.Popen(
        [*CLI, "backend", "--model", str(TINY), "--port", "0", *flags], stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if echo:
            sys.stderr.write(line)
        m = re.search(r"on (http://[\d.]+:\d+)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit("Error: the backend did not start (its log is above).")
