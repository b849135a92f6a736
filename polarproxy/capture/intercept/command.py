"""What `polarproxy record --intercept` and `polarproxy ca` do, for the CLI to call (no typer here)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson

from polarproxy.capture.intercept.ca import ensure_ca, install_hint
from polarproxy.capture.intercept.runner import InterceptConfig, parse_resolve, record_intercept
from polarproxy.store.store import Store


def run_record_intercept(
    command: list[str],
    *,
    db: str | None,
    port: int,
    hosts: list[str],
    resolve: list[str],
    upstream_ca: Path | None,
    harness: str | None,
    task: str | None,
    group: str | None,
    json_out: bool,
) -> int:
    """Record `command` in intercept mode, print the summary, return the child's exit code.
    Raises PolarproxyError (UsageError) for bad options."""
    cfg = InterceptConfig(
        db=db,
        port=port,
        hosts=list(hosts),
        resolve=parse_resolve(list(resolve)),
        upstream_ca=upstream_ca,
        harness=harness,
        task=task,
        group_id=group,
    )
    outcome = asyncio.run(record_intercept(cfg, command))
    calls = Store.open(db).list_calls(outcome.episode_id)
    counts: dict[str, int] = {}
    for c in calls:
        counts[c.status] = counts.get(c.status, 0) + 1
    if json_out:
        summary = {
            "episode_id": outcome.episode_id,
            "exit_code": outcome.exit_code,
            "mode": "intercept",
            "calls": len(calls),
            "statuses": counts,
            "db": outcome.db,
        }
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"
        print(
            f"polarproxy: episode {outcome.episode_id} (intercept): {len(calls)} provider calls ({detail}), "
            f"exit {outcome.exit_code}, store {outcome.db}",
            file=sys.stderr,
        )
    return outcome.exit_code


def ca_path() -> str:
    return str(ensure_ca().cert_file)


def ca_install_hint() -> str:
    return install_hint(ensure_ca())
