"""`rollout --ray`: a 3-node in-process Ray cluster on loopback, a gateway per node recording into the
session's real PostgreSQL, the example agent and tasks, a stub backend on loopback; one worker node is
killed mid-run (`remove_node`), and the rollout still completes with nothing finished lost."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rollout_support import AGENT, EXAMPLE

from polarproxy.rollout.run import FINISHED
from polarproxy.store.store import Store

# ---- every TCP socket of a process tree, from /proc ---------------------------------------------------------


def _addr(hexaddr: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1]), int(port, 16)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four host-order 32-bit words
    return ipaddress.IPv6Address(words), int(port, 16)


def _is_loopback(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def tcp_sockets(pids: list[int]) -> list[dict[str, Any]]:
    """The TCP sockets these processes hold: local and remote address, listening or not, process name."""
    table: dict[str, tuple[str, str, str]] = {}
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            f = line.split()
            table[f[9]] = (f[1], f[2], f[3])
    out = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = target[len("socket:[") : -1] if target.startswith("socket:[") else None
            if inode in table:
                local, remote, state = table[inode]
                out.append(
                    {
                        "pid": pid,
                        "comm": comm,
                        "local": _addr(local),
                        "remote": _addr(remote),
                        "listen": state == "0A",
                    }
                )
    return out


# ---- the rollout ----------------------------------------------------------------------------------------------


def _episodes(store: Store, rid: str) -> list[Any]:
    return [e for e in store.list_episodes(limit=None) if e.task and e.metadata.get("rollout_id") == rid]


class Killer(threading.Thread):
    """Watches the store. Once every node has recorded an episode (so every gateway is up) it takes a
    snapshot of every TCP socket of this process tree; once an episode has finished and a worker node has
    one whose model call is in flight (begun under 0.3 s ago: the stub takes ~1 s), it kills that
    node at once: SIGKILL to its worker processes (the gateway and the harness in them), then remove_node."""

    def __init__(self, cluster: Any, db: str, rid: str, driver_node: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.db, self.rid = cluster, db, rid
        self.workers = {n.node_id: n for n in cluster.cluster.worker_nodes if n.node_id != driver_node}
        self.killed: str | None = None
        self.finished_before: dict[tuple[str, int], tuple[str, float]] = {}
        self.running_on_killed: set[str] = set()
        self.sockets: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the test
            self.error = e

    def _kill(self, node: Any) -> None:
        raylet = node.all_processes["raylet"][0].process.pid
        for pid in _tree(raylet)[1:]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cluster.cluster.remove_node(node, allow_graceful=False)

    def _run(self) -> None:
        store = Store.open(self.db)
        deadline = time.monotonic() + 120
        try:
            while time.monotonic() < deadline:
                eps = _episodes(store, self.rid)
                if not self.sockets and len({e.metadata["ray_node"] for e in eps}) == 3:
                    self.sockets = tcp_sockets(_tree(os.getpid()))
                # finished as the driver counts it: ended (ok/failed) with its reward. The reward is stored
                # just before the episode ends, so one with a reward may still be running.
                done = {
                    (e.task, int(e.metadata["sample"])): (e.id, e.reward)
                    for e in eps
                    if e.status in FINISHED and e.reward is not None
                }
                for nid, node in self.workers.items():
                    running = {
                        e.id
                        for e in eps
                        if e.status == "running"
                        and e.metadata["ray_node"] == nid
                        and self._calling(store, e.id)
                    }
                    if self.sockets and done and running:
                        self._kill(node)
                        self.killed, self.running_on_killed, self.finished_before = nid, running, done
                        return
                time.sleep(0.05)
        finally:
            store.close()

    @staticmethod
    def _calling(store: Store, episode_id: str) -> bool:
        calls = store.list_calls(episode_id)
        return any(c.status == "in_flight" and time.time() - c.started_at < 0.3 for c in calls)


def test_three_node_ray_rollout_survives_a_killed_node_and_stays_on_loopback(
    make_stub_backend, tiny_model_dir: Path, pg_server, tmp_path: Path
) -> None:
    if importlib.util.find_spec("ray") is None and not os.environ.get("CI"):  # CI has the `ray` extra
        pytest.skip("Ray is not installed (pip install 'polarproxy[ray]')")
    from polarproxy.commands.enums import BackendMode
    from polarproxy.commands.proxy_options import proxy_config
    from polarproxy.rollout.ray_runner import LocalCluster, NodeSpec, RayTarget, run_on_ray
    from polarproxy.rollout.sandbox import get_runner
    from polarproxy.rollout.stages import Settings
    from polarproxy.rollout.tasks import load_tasks

    stub = make_stub_backend(per_token_ms=250.0)  # a call takes ~1 s: the kill lands mid-call
    db, rid, samples = pg_server.create_database("ray"), "ro_ray_test", 3
    cfg = proxy_config(
        stub.url, tiny_model_dir, db, 0, 256, backend_kind=None, backend_mode=BackendMode.tokens
    )
    tasks = load_tasks(EXAMPLE / "tasks.jsonl")
    settings = Settings(  # as `rollout --ray` makes it; each node puts its own gateway in `episodes`
        rollout_id=rid,
        episodes=None,  # type: ignore[arg-type]
        runner=get_runner("none"),
        command=[sys.executable, str(AGENT)],
        hidden=[t.tests for t in tasks if t.tests is not None],
        setup_timeout_s=60.0,
        execute_timeout_s=60.0,
        verify_timeout_s=60.0,
    )
    spec = NodeSpec(cfg, settings, concurrency=1)
    cluster = LocalCluster(3)
    try:
        # the driver attaches to the head; remove_node refuses the driver's own node
        killer = Killer(cluster, db, rid, driver_node=cluster.cluster.head_node.node_id)
        killer.start()
        summary = run_on_ray(
            tasks,
            target=RayTarget(nodes=3),
            spec=spec,
            db=db,
            samples=samples,
            min_samples=None,
            resume=False,
            cluster=cluster,
        )
        killer.join(10)
    finally:
        cluster.close()
    assert killer.error is None, killer.error
    assert killer.killed is not None, "no worker node had a running episode after one finished"

    # the rollout completed: every (task, sample) is done, with the reward its verifier gives
    assert summary["states"] == {"done": 2 * samples}, summary["states"]
    assert summary["tasks"]["greet"]["rewards"] == [1.0] * samples
    assert summary["tasks"]["shout"]["rewards"] == [0.0] * samples
    assert summary["ray"]["lost_nodes"] == [killer.killed]
    assert len(summary["ray"]["nodes"]) == 3

    store = Store.open(db)
    try:
        eps = _episodes(store, rid)
    finally:
        store.close()
    finished = [e for e in eps if e.status == "ok" and e.reward is not None]
    by_key = {(e.task, int(e.metadata["sample"])): e for e in finished}
    assert len(finished) == len(by_key) == 2 * samples  # exactly one finished episode per (task, sample)
    for key, (eid, reward) in killer.finished_before.items():  # nothing finished was lost or repeated
        assert (by_key[key].id, by_key[key].reward) == (eid, reward)
    lost = {e.id: e for e in eps if e.id in killer.running_on_killed}
    assert lost and all(e.status == "interrupted" and e.reward is None for e in lost.values()), [
        (e.status, e.reward) for e in lost.values()
    ]
    rows = {(e["task"], e["sample"]): e for e in summary["episodes"]}
    for e in lost.values():  # the killed node's unfinished episodes ran again, elsewhere
        key = (e.task, int(e.metadata["sample"]))
        again = by_key[key]
        assert again.id != e.id and again.metadata["ray_node"] != killer.killed
        assert rows[key]["episode_id"] == again.id and rows[key]["node"] == again.metadata["ray_node"]
        assert {"node": killer.killed, "episode_id": e.id}.items() <= rows[key]["attempts"][0].items()

    # every TCP socket of the Ray processes and of the gateways in them is on loopback
    listening = [s for s in killer.sockets if s["listen"]]
    gateway_ports = {int(n["gateway"].rsplit(":", 1)[1]) for n in summary["ray"]["nodes"]}
    assert gateway_ports <= {s["local"][1] for s in listening}
    assert {"raylet", "gcs_server"} <= {s["comm"] for s in listening}
    far = [
        s
        for s in killer.sockets
        if not _is_loopback(s["local"][0]) or (not s["listen"] and not _is_loopback(s["remote"][0]))
    ]
    assert not far, far


def test_ray_option_refuses_sqlite_a_non_loopback_address_and_a_bad_local_count(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from polarproxy.cli import app

    base = [
        "rollout",
        str(EXAMPLE / "tasks.jsonl"),
        "--backend",
        "http://127.0.0.1:9",
        "--model",
        str(tmp_path),
    ]
    pg = "postgresql://u:hunter2@127.0.0.1:1/x"
    cases = {
        ("--db", str(tmp_path / "r.db"), "--ray", "local:2"): "--ray needs a PostgreSQL --db",
        ("--ray", "local:2"): "--ray needs a PostgreSQL --db",
        ("--db", pg, "--ray", "10.1.2.3:6379"): "--ray 10.1.2.3:6379: 10.1.2.3 is not a loopback address",
        (
            "--db",
            pg,
            "--ray",
            "ray://127.0.0.1:10001",
        ): "--ray 'ray://127.0.0.1:10001' is neither local:N nor HOST:PORT",
        ("--db", pg, "--ray", "local:0"): "--ray 'local:0': N must be a whole number from 1 to 16",
        ("--db", pg, "--ray", "local:x"): "--ray 'local:x': N must be a whole number from 1 to 16",
        (
            "--db",
            pg,
            "--ray",
            "local:2",
            "--serve",
            "http://127.0.0.1:9",
        ): "--serve and --backend/--model/--db",
    }
    for args, message in cases.items():
        r = CliRunner().invoke(
            app, [*base, *args, "--isolation", "none", "--", "true"], env={"POLARPROXY_DB": ""}
        )
        shown = " ".join((r.output or "").split())
        assert r.exit_code == 2, (args, shown)
        assert f"Error: {message}" in shown, (args, shown)
        assert "Traceback" not in shown and "hunter2" not in shown


def test_min_samples_on_ray_stops_the_groups_other_samples_where_they_run(tmp_path: Path) -> None:
    """The driver's side of --min-samples: once K of a group are evaluated, its queued samples are aborted
    and its dispatched ones are stopped on their node (recorded here in place of the node's actor)."""
    from collections import deque

    from polarproxy.rollout.ray_runner import RayRollout
    from polarproxy.rollout.run import Plan
    from polarproxy.rollout.stages import Job
    from polarproxy.rollout.tasks import load_tasks

    greet = load_tasks(EXAMPLE / "tasks.jsonl")[0]
    stopped: list[tuple[str, str, int, str]] = []

    class Node:  # what RayRollout calls on a node's actor: `.stop.remote(task, sample, reason)`
        def __init__(self, nid: str) -> None:
            self.stop = type("M", (), {"remote": lambda _, *a: stopped.append((nid, *a))})()

    plan = Plan([greet], 4, 1, min_samples=2)
    driver = RayRollout(plan, None, None, None)  # type: ignore[arg-type]
    driver.actors = {"n1": Node("n1"), "n2": Node("n2")}
    jobs = [Job(task=greet, sample=i, dir=tmp_path) for i in range(4)]
    driver.node_of = {jobs[0].key: "n1", jobs[1].key: "n2", jobs[2].key: "n2"}
    queue = deque([jobs[3]])
    jobs[0].state, jobs[0].evaluated = "done", True
    driver._accept(jobs[0], jobs, queue)
    assert stopped == [] and jobs[3].state == "pending"  # 1 of 2: not accepted yet
    jobs[1].state, jobs[1].evaluated = "done", True
    driver._accept(jobs[1], jobs, queue)
    reason = "aborted: the group was accepted with 2 of 4 samples"
    assert stopped == [("n2", "greet", 2, reason)]
    assert (jobs[3].state, jobs[3].reason) == ("aborted", reason)
