"""bench/workspace_copy.py --quick: both ways copy the whole tree and every figure is reported (no timing
is checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_workspace_copy_bench_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "copy.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "workspace_copy.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["files"] == 20 and sum(result["ways"].values()) == 20
    assert set(result["ways"]) <= {"reflink", "read"}
    for way in ("polarproxy", "read/write"):
        assert result[way]["s_median"] > 0 and result[way]["mb_per_s"] > 0 and "disk_bytes" in result[way]
    assert result["speedup"] > 0
