"""A harness that probes its sandbox, then does the `greet` task through the gateway. It writes what it
found to probe.json in its working folder. Parameters come from the environment (the test sets them):
PROBE_HIDDEN (files it must not read), PROBE_OUTSIDE (a host path it must not write), PROBE_PORTS (host
loopback ports it must not reach)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx


def can_read(path: str) -> str | None:
    try:
        return Path(path).read_text()[:200] or None
    except OSError as e:
        return None if e.errno else str(e)


def can_write(path: str) -> bool:
    try:
        Path(path).write_text("escaped\n")
    except OSError:
        return False
    return True


def can_connect(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def main() -> int:
    instruction = sys.stdin.read()
    base = os.environ["OPENAI_BASE_URL"]
    gateway_port = urlsplit(base).port
    found = {
        "instruction": instruction,
        "cwd": os.getcwd(),
        "home": os.environ["HOME"],
        "home_entries": sorted(os.listdir(os.environ["HOME"])),
        "read_hidden": {p: can_read(p) for p in os.environ["PROBE_HIDDEN"].split(os.pathsep)},
        "wrote_outside": can_write(os.environ["PROBE_OUTSIDE"]),
        "wrote_workspace": can_write("inside.txt"),
        "reached": {p: can_connect(int(p)) for p in os.environ["PROBE_PORTS"].split(",")},
        "reached_gateway": can_connect(gateway_port),
        # as an attacker run as root would try: undo the mounts, read the host's secrets and the store
        "uid": os.getuid(),
        "cap_eff": next(
            (
                ln.split()[1]
                for ln in Path("/proc/self/status").read_text().splitlines()
                if ln.startswith("CapEff")
            ),
            None,
        ),
        "remount_rw": subprocess.run(["mount", "-o", "remount,rw", "/"], capture_output=True).returncode == 0,
        "umount_tmp": subprocess.run(["umount", "/tmp"], capture_output=True).returncode == 0,
        "read_shadow": can_read("/etc/shadow") is not None,
        "env_names": sorted(os.environ),
        "seen": {p: os.path.exists(p) for p in os.environ.get("PROBE_ABSENT", "").split(os.pathsep) if p},
    }
    r = httpx.post(
        base + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": instruction}], "max_tokens": 16},
        headers={"authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
        timeout=60,
    )
    found["model_status"] = r.status_code
    episode = os.environ["POLARPROXY_EPISODE"]
    forged = httpx.post(  # its own key sets its own reward: refused (the verifier's alone counts)
        f"{os.environ['POLARPROXY_URL']}/polarproxy/v1/episodes/{episode}/reward",
        json={"reward": 1.0},
        headers={"authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
        timeout=60,
    )
    found["self_reward_status"] = forged.status_code
    if r.status_code == 200:
        Path("answer.txt").write_text(r.json()["choices"][0]["message"]["content"] + "\n")
    Path("probe.json").write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
