"""`record` on a database that does not take writes: refused with an `Error:` before the harness runs (both
modes); the summary of an episode whose writes wait in a spool says so.

Root ignores file modes, so the database is made read-only by a read-only bind mount of the file, inside a
mount namespace of the test's own (`unshare -m`); the test is skipped only where that cannot be made.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
PY = sys.executable


def _namespace_mounts_work(tmp: Path) -> bool:
    probe = tmp / "probe"
    probe.mkdir()
    script = f"mount -t tmpfs -o size=1m tmpfs {probe} && touch {probe}/f && mount --bind -o ro {probe}/f {probe}/f"
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@pytest.fixture
def ro_shell(tmp_path: Path):
    """Run a bash script in a mount namespace where `$DB` is a polarproxy database on a tmpfs; `ro_db` in
    the script makes that file read-only (a bind mount), for root too."""
    if not _namespace_mounts_work(tmp_path):
        pytest.skip(
            "no mount namespace here (unshare -m / mount need CAP_SYS_ADMIN): cannot make a read-only db"
        )
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def run(body: str, *, spool: Path) -> subprocess.CompletedProcess[str]:
        script = f"""
set -e
mount -t tmpfs -o size=16m tmpfs {mnt}
export DB={mnt}/ro.db POLARPROXY_SPOOL_DIR={spool} POLARPROXY_CA_DIR={tmp_path}/ca
{PY} -c "from polarproxy.store.store import Store; Store.open('$DB').close()"
ro_db() {{ mount --bind "$DB" "$DB" && mount -o remount,bind,ro "$DB"; }}
set +e
{body}
"""
        return subprocess.run(
            ["unshare", "-m", "bash", "-c", script], capture_output=True, text=True, timeout=180
        )

    return run


def test_intercept_record_on_a_read_only_database_is_refused_before_the_harness_runs(ro_shell, tmp_path):
    marker = tmp_path / "harness-ran"
    r = ro_shell(
        f'ro_db; {PY} -m polarproxy record --intercept --db "$DB" -- touch {marker}; echo "RC=$?"',
        spool=tmp_path / "spool",
    )
    assert "RC=1" in r.stdout, r.stderr
    assert (
        "Error: The store" in r.stderr
        and "does not take writes (attempt to write a readonly database)" in r.stderr
    )
    assert "the harness was not started" in r.stderr and "--db PATH" in r.stderr
    assert "Traceback" not in r.stderr
    assert not marker.exists()
    assert not list((tmp_path / "spool").rglob("*.spool"))  # nothing left waiting for a database that refuses


def test_gateway_record_on_a_read_only_database_is_refused_before_the_harness_runs(
    ro_shell, tmp_path, tiny_model_dir
):
    marker = tmp_path / "harness-ran"
    r = ro_shell(
        f'ro_db; {PY} -m polarproxy record --backend http://127.0.0.1:1 --model {tiny_model_dir} --db "$DB" '
        f'-- touch {marker}; echo "RC=$?"',
        spool=tmp_path / "spool",
    )
    assert "RC=1" in r.stdout, r.stderr
    assert "does not take writes" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists()


def test_the_summary_of_an_episode_still_in_a_spool_says_so_instead_of_a_traceback(tmp_path, capsys):
    # a database that stopped taking writes mid-run: the episode's writes are in a spool, not in the store
    from polarproxy.commands.record import summarize
    from polarproxy.harness.record import RecordOutcome
    from polarproxy.store.store import Store

    db = str(tmp_path / "x.db")
    Store.open(db).close()
    outcome = RecordOutcome(exit_code=3, episode_id="ep_spooled1", db=db)
    summarize(outcome, db, mode="intercept", json_out=False, json_file=None)
    err = capsys.readouterr().err
    assert "episode ep_spooled1 is not in the store yet" in err and "polarproxy db repair" in err
