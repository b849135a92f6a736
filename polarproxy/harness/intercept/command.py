"""What `polarproxy record --intercept` and `polarproxy ca` do, for the CLI to call (no typer here)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from polarproxy.capture.intercept.ca import ensure_ca, install_hint
from polarproxy.harness.intercept.runner import InterceptConfig, parse_resolve, record_intercept
from polarproxy.harness.record import RecordOutcome


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
) -> RecordOutcome:
    """Record `command` in intercept mode; the outcome holds the child's exit code.
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
    return asyncio.run(record_intercept(cfg, command))


def ca_path() -> str:
    return str(ensure_ca().cert_file)


def ca_install_hint() -> str:
    return install_hint(ensure_ca())
