"""Test factories and readers shared across the suite (import as `from factories import ...`)."""

from __future__ import annotations

import json
from typing import Any


def record_summary(stderr: str) -> dict[str, Any]:
    """The JSON summary `polarproxy record --json` prints on stderr once the harness has exited."""
    start = stderr.rindex('{\n  "episode_id"')
    return json.JSONDecoder().raw_decode(stderr[start:])[0]
