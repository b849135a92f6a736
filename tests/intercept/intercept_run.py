"""Running `polarproxy record --intercept` as a subprocess against the stand-ins, and reading it back."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from factories import record_summary
from standin import StandIn, TestCA

from polarproxy.store.records import Call, Episode
from polarproxy.store.store import Store

HERE = Path(__file__).resolve().parent


@dataclass
class Intercepted:
    proc: subprocess.CompletedProcess[str]
    summary: dict
    episode: Episode
    calls: list[Call]
    db: Path
    ca_dir: Path

    def call(self, **match: object) -> Call:
        found = [c for c in self.calls if all(getattr(c, k) == v for k, v in match.items())]
        assert len(found) == 1, (match, [(c.dialect, c.path, c.stream) for c in self.calls])
        return found[0]


def run_intercept(
    tmp: Path,
    standin: StandIn,
    test_ca: TestCA,
    argv: Sequence[str],
    *flags: str,
    env: dict[str, str] | None = None,
    expect_rc: int | None = 0,
    timeout: float = 120,
) -> Intercepted:
    """`polarproxy record --intercept` with every stand-in host resolved to the stand-in and its CA trusted
    upstream; the child also trusts the test CA (SSL_CERT_FILE), so traffic that is not intercepted works."""
    db = tmp / "intercept.db"
    ca_dir = tmp / "ca"
    cmd = [sys.executable, "-m", "polarproxy", "record", "--intercept", "--db", str(db)]
    cmd += [*standin.resolve_args(), "--upstream-ca", str(test_ca.cert), *flags, "--json", "--", *argv]
    full_env = dict(os.environ)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        full_env.pop(name, None)
    full_env.update(
        {"POLARPROXY_CA_DIR": str(ca_dir), "SSL_CERT_FILE": str(test_ca.cert), "NO_COLOR": "1", **(env or {})}
    )
    r = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=tmp)
    if expect_rc is not None:
        assert r.returncode == expect_rc, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    summary = record_summary(r.stderr)
    store = Store.open(str(db))
    episode = store.get_episode(summary["episode_id"])
    return Intercepted(r, summary, episode, store.list_calls(episode.id), db, ca_dir)
