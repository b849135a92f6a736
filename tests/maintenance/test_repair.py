"""Repair after crashes: a running episode whose recording process is gone is ended as interrupted and its
in-flight calls marked interrupted with why; a live writer's episode is never touched; spools of dead
writers are replayed first."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from polarproxy.store import maintenance, owners, schema, spool
from polarproxy.store.ids import new_call_id
from polarproxy.store.records import CallResult, EpisodeStart


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _writer(store, *, pid: int, machine: str | None, proc_start: str | None, heartbeat_age: float = 0.0):
    ident = owners.Identity(
        id="w_" + os.urandom(8).hex(), host="h1", pid=pid, machine=machine, proc_start=proc_start
    )
    owners.heartbeat(store, ident, now=time.time() - heartbeat_age)
    return ident


def _running_episode(store, writer_id, make_start) -> tuple[str, str, str]:
    ep = store.create_episode(EpisodeStart(command=["agent"]))
    owners.claim(store, ep, writer_id)
    done, _ = store.begin_call(make_start(ep, [1, 2, 3]))
    store.finish_call(done, CallResult(status="ok", output_ids=[4, 5], output_logprobs=[-0.1, -0.2]))
    flying, _ = store.begin_call(make_start(ep, [1, 2, 3, 4, 5, 6]))
    return ep, done, flying


def test_episode_of_a_dead_process_on_this_machine_is_interrupted_with_why(store, make_start):
    pid = _dead_pid()
    w = _writer(store, pid=pid, machine=owners.machine_id(), proc_start="123")
    ep, done, flying = _running_episode(store, w.id, make_start)
    report = maintenance.recover(store)
    assert [(e.episode_id, e.calls) for e in report.episodes] == [(ep, 1)]
    assert store.get_episode(ep).status == "interrupted"
    assert store.get_call(done).status == "ok" and store.get_call(done).output_ids == [4, 5]
    dead = store.get_call(flying)
    assert dead.status == "interrupted"
    assert (
        dead.error
        == f"interrupted: the call never finished because its recording process (pid {pid} on h1) is gone"
    )
    assert maintenance.recover(store).episodes == []  # nothing left to do


def test_a_pid_now_used_by_another_process_counts_as_dead(store, make_start):
    w = _writer(
        store, pid=os.getpid(), machine=owners.machine_id(), proc_start="1"
    )  # not this process's start
    ep, _, _ = _running_episode(store, w.id, make_start)
    [(eid, why)] = maintenance.dead_episodes(store)
    assert eid == ep and "the pid now belongs to another process" in why


def test_a_live_writer_is_left_alone_whatever_its_heartbeat(store, make_start):
    me = owners.new_identity()
    owners.heartbeat(store, me, now=time.time() - 3600)
    ep, _, flying = _running_episode(store, me.id, make_start)
    assert maintenance.recover(store, stale_after=1).episodes == []
    assert store.get_episode(ep).status == "running" and store.get_call(flying).status == "in_flight"


def test_a_writer_on_another_machine_is_dead_only_after_its_heartbeat_is_stale(store, make_start):
    w = _writer(store, pid=1, machine="another-boot/pid:[1]", proc_start="5", heartbeat_age=120)
    ep, _, flying = _running_episode(store, w.id, make_start)
    assert maintenance.recover(store, stale_after=600).episodes == []
    assert store.get_call(flying).status == "in_flight"
    [gone] = maintenance.recover(store, stale_after=60).episodes
    assert gone.episode_id == ep and gone.calls == 1
    assert "sent no heartbeat for 2 min (stale after 1 min)" in gone.reason
    assert store.get_call(flying).status == "interrupted"


def test_an_episode_without_a_writer_is_judged_by_its_last_write(store, make_start):
    ep = store.create_episode(EpisodeStart(command=["old"]))  # as recorded before m002: no writer
    store.begin_call(make_start(ep, [1]))
    assert maintenance.dead_episodes(store, stale_after=60) == []
    later = time.time() + 3600
    [(eid, why)] = maintenance.dead_episodes(store, stale_after=60, now=later)
    assert eid == ep and "no recording process is known" in why


def test_writer_rows_name_host_pid_and_process_start(store):
    me = owners.new_identity()
    owners.heartbeat(store, me)
    with store._read() as conn:
        row = conn.execute(schema.writers.select()).one()._mapping
    assert (row["host"], row["pid"], row["proc_start"]) == (
        socket.gethostname(),
        os.getpid(),
        owners.proc_start(os.getpid()),
    )
    assert row["machine"] == owners.machine_id() and row["proc_start"] is not None


def test_recover_replays_orphaned_spools_first_and_leaves_held_ones(store, spool_root, make_start):
    folder = spool.spool_dir(store.url)
    ep = "ep_orphan0000"
    cid = new_call_id()
    orphan = spool.SpoolFile(folder / "w_dead.spool")
    orphan.append(
        [
            spool.op_create_episode(ep, EpisodeStart(command=["agent"]), "w_dead", reopen=False),
            spool.op_begin_call(cid, make_start(ep, [1, 2])),
            spool.op_finish_call(cid, CallResult(status="ok", output_ids=[3], output_logprobs=[-1.0])),
            spool.op_begin_call(new_call_id(), make_start(ep, [1, 2, 3, 4])),  # in flight at the crash
        ]
    )
    orphan.close()  # its writer died: the lock is gone
    held = spool.SpoolFile(folder / "w_live.spool")
    held.append([spool.op_finish_episode("ep_whatever00", "ok", 0)])
    try:
        report = maintenance.recover(store)
        assert (report.replayed_ops, report.replayed_calls) == (4, 2)
        assert not (folder / "w_dead.spool").exists() and (folder / "w_live.spool").exists()
        calls = store.list_calls(ep)
        assert [(c.id, c.status, c.output_ids) for c in calls[:1]] == [(cid, "ok", [3])]
        assert calls[1].status == "interrupted" and "left no record of itself" in (calls[1].error or "")
        assert store.get_episode(ep).status == "interrupted"
        assert [b.live for b in spool.pending(store.url)] == [True]
    finally:
        held.close()
