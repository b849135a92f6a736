"""`rollout --ray ADDRESS|local:N`: a rollout's episodes spread over the nodes of a Ray cluster.

Every node runs one `NodeRunner` actor: its own gateway (the in-process one of `rollout`, gateway.py) and
its own four stage pools (run.py's `Rollout`, fed one job at a time), recording into the one PostgreSQL
of `--db`. The driver (this process) hands each node up to `--concurrency` + a prewarm's worth of
(task, sample) jobs at once, so prewarm runs ahead of execute on every node as it does on one machine.

A node lost mid-run (its actor dies) loses nothing finished: a job it had ended in the store (evaluated,
with its reward) is taken from there; its other jobs go back to the front of the queue and run on a live
node, after their lost attempt was ended in the store as `interrupted`, its in-flight calls marked, and
the reason kept with its empty reward record, so it never counts as finished (`--resume` reads the same).

Ray stays on loopback: `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (set before ray is imported) keeps Ray from
rewriting 127.0.0.1 to the machine's interface address, and `local:N` starts every node with
`node_ip_address=127.0.0.1`, no dashboard, usage stats off and a temporary folder of its own. An ADDRESS
must be a loopback HOST:PORT, and every node of that cluster must be on loopback. Ray is imported only here,
and only once `--ray` is given.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from polarproxy.client import EpisodeHandle
from polarproxy.errors import UsageError
from polarproxy.loopback import is_loopback
from polarproxy.rollout.episodes import Episodes, PriorEpisode
from polarproxy.rollout.run import FINISHED, Plan, Rollout, plan_jobs, start_relay
from polarproxy.rollout.stages import STAGES, Job, Settings, group_id
from polarproxy.rollout.tasks import Task

MAX_LOCAL_NODES = 16
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class RayTarget:
    """`--ray local:N` (nodes) or `--ray HOST:PORT` (address)."""

    nodes: int | None = None
    address: str | None = None

    def __str__(self) -> str:
        return f"local:{self.nodes}" if self.nodes is not None else str(self.address)


def parse_target(value: str) -> RayTarget:
    """`local:N` (1..16) or a loopback HOST:PORT of a running cluster's head; UsageError otherwise."""
    allowed = "Give --ray local:N (N nodes on loopback, 1 to 16) or --ray 127.0.0.1:PORT of a running head."
    if value.startswith("local:"):
        n = value.removeprefix("local:")
        if not n.isdigit() or not 1 <= int(n) <= MAX_LOCAL_NODES:
            raise UsageError(
                f"--ray {value!r}: N must be a whole number from 1 to {MAX_LOCAL_NODES}.", hint=allowed
            )
        return RayTarget(nodes=int(n))
    host, sep, port = value.rpartition(":")
    if "://" in value or value == "auto" or not sep or not port.isdigit():
        raise UsageError(f"--ray {value!r} is neither local:N nor HOST:PORT.", hint=allowed)
    if not is_loopback(host):
        raise UsageError(
            f"--ray {value}: {host} is not a loopback address; polarproxy listens and connects on "
            "127.0.0.1/::1 only.",
            hint="Start the cluster on this machine (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head "
            "--node-ip-address=127.0.0.1`) and pass its 127.0.0.1:PORT, or use --ray local:N.",
        )
    return RayTarget(address=value)


def check_db(db: str | None) -> None:
    """A fleet records into one shared server database: --ray needs a postgresql:// --db."""
    if db and "://" in db and db.split("://", 1)[0].split("+", 1)[0] in ("postgresql", "postgres"):
        return
    from polarproxy.store.urls import display_url

    raise UsageError(
        f"--ray needs a PostgreSQL --db (postgresql://...), not {display_url(db) if db else 'the default'}: "
        "every node records into the same database, and a SQLite file is one machine's.",
        hint="e.g. --db postgresql://USER@127.0.0.1:5432/polarproxy",
    )


def import_ray() -> Any:
    """ray, with its loopback settings in the environment first (they are read when it is imported)."""
    os.environ.update(RAY_ENV)  # the processes Ray starts inherit them
    try:
        import ray
        from ray._private import ray_constants
    except ImportError as e:
        raise UsageError(
            "--ray needs Ray, which is not installed.", hint="pip install 'polarproxy[ray]'"
        ) from e
    # imported before the variable was set (by the embedding program): the value read then is kept in this
    # constant, which decides whether 127.0.0.1 is rewritten to the interface address
    ray_constants.ENABLE_RAY_CLUSTER = False
    return ray


class LocalCluster:
    """N Ray nodes in this process's care (`ray.cluster_utils.Cluster`), all on loopback."""

    def __init__(self, nodes: int, *, num_cpus: int = 1) -> None:
        import_ray()
        from ray.cluster_utils import Cluster

        self.temp_dir = tempfile.mkdtemp(prefix="pp-ray-")  # short: Ray's socket paths must fit 107 bytes
        args = {
            "num_cpus": num_cpus,
            "node_ip_address": LOOPBACK,
            "include_dashboard": False,
            "temp_dir": self.temp_dir,
        }
        # Cluster() also writes the head's address to Ray's shared file (/tmp/ray/ray_current_cluster),
        # whatever temp_dir says, and fails if that folder is gone (another Ray's shutdown removes it)
        from ray._private.utils import get_ray_address_file

        os.makedirs(os.path.dirname(get_ray_address_file(None)), exist_ok=True)
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(args))
        try:
            for _ in range(nodes - 1):
                self.cluster.add_node(**{k: v for k, v in args.items() if k != "include_dashboard"})
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def close(self) -> None:
        import ray

        if ray.is_initialized():  # the head cannot be removed while this process is attached to it
            ray.shutdown()
        self.cluster.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@dataclass
class NodeSpec:
    """What every node's runner needs, picklable: the gateway's config, the rollout's settings (their
    `episodes` is each node's own gateway, filled in there), the stage pools' size."""

    cfg: Any  # capture.runner.ProxyConfig (its port 0: each gateway takes a free one)
    settings: Settings
    concurrency: int
    workdir: Path | None = None  # each node keeps its episodes' folders in workdir/node-ID
    workers: dict[str, int] = field(default_factory=dict)


# the Job fields a node's result carries back (besides the episode and the stage times)
RESULT = ("state", "reason", "exit_code", "harness_timed_out", "reward", "reward_note")
RESULT += ("trajectories", "evaluated")


class NodeRunner:
    """The actor on one node: a gateway and the stage pools; `run` takes one job and returns its result."""

    def __init__(self, spec: NodeSpec, node_id: str) -> None:
        from polarproxy.rollout.episodes import LocalGateway

        self.node_id, rid = node_id, spec.settings.rollout_id
        cfg = copy.copy(spec.cfg)
        cfg.metadata = {**cfg.metadata, "rollout_id": rid, "ray_node": node_id}
        self.gateway = LocalGateway(cfg)
        if spec.workdir is not None:
            self.scratch = spec.workdir / f"node-{node_id[:12]}"
        else:
            self.scratch = Path(tempfile.mkdtemp(prefix=f"polarproxy-{rid}-"))
        self.settings = replace(
            spec.settings,
            episodes=self.gateway,
            keep=spec.workdir is not None,
            metadata={"ray_node": node_id},
        )
        self.relay_dir = Path(tempfile.mkdtemp(prefix="polarproxy-bridge-"))
        self.relay = start_relay(self.settings, self.relay_dir)
        plan = Plan([], 1, spec.concurrency, workers=spec.workers, scratch=self.scratch)
        self.rollout = Rollout(plan, self.settings, on_end=self._ended)
        self.done: dict[int, threading.Event] = {}
        self.running: dict[tuple[str, int], Job] = {}

    def ready(self) -> dict[str, Any]:
        return {"node": self.node_id, "gateway": self.gateway.url, "pid": os.getpid()}

    def _ended(self, job: Job) -> None:
        self.done[id(job)].set()

    def run(self, task: Task, sample: int) -> dict[str, Any]:
        job = Job(task=task, sample=sample, dir=self.scratch / task.id / str(sample))
        self.done[id(job)] = threading.Event()
        self.running[job.key] = job
        self.rollout.start(job)
        self.done[id(job)].wait()
        del self.done[id(job)], self.running[job.key]
        return {
            **{name: getattr(job, name) for name in RESULT},
            "episode_id": job.episode.episode_id if job.episode else None,
            "queue_s": {st: job.started[st] - job.queued[st] for st in job.started},
            "stage_s": {st: job.ended[st] - job.started[st] for st in job.ended},
        }

    def stop(self, task_id: str, sample: int | None, reason: str) -> None:
        """Stop a job (sample None: the task's; task "*": every job): killed if running, skipped if queued."""
        for key, job in list(self.running.items()):
            if task_id == "*" or (key[0] == task_id and sample in (None, key[1])):
                job.reason = job.reason or reason
                job.cancel.set()

    def close(self) -> None:
        self.rollout.close()
        if self.relay is not None:
            self.relay.close()
        self.gateway.close()
        shutil.rmtree(self.relay_dir, ignore_errors=True)
        if not self.settings.keep:
            shutil.rmtree(self.scratch, ignore_errors=True)


class StoreView:
    """The driver's reads and repairs in the shared store (it runs no gateway of its own)."""

    def __init__(self, db: str) -> None:
        from polarproxy.store.store import Store
        from polarproxy.store.urls import display_url

        self.store = Store.open(db)
        self.db = display_url(db)

    def prior(self, rollout_id: str, groups: list[str]) -> list[PriorEpisode]:
        from polarproxy.store.query import EpisodeQuery

        out = []
        for group in groups:
            for e in self.store.list_episodes(limit=None, where=EpisodeQuery(group_id=group), counts=False):
                if e.metadata.get("rollout_id") == rollout_id and "task_id" in e.metadata:
                    out.append(PriorEpisode(e.id, e.status, e.reward, e.metadata))
        return out

    def attempts(self, rollout_id: str, group: str, key: tuple[str, int]) -> list[PriorEpisode]:
        return [
            e
            for e in self.prior(rollout_id, [group])
            if (str(e.metadata.get("task_id")), int(e.metadata.get("sample", -1))) == key
        ]

    def abort(self, episode_id: str, why: str) -> None:
        """End a lost attempt: `interrupted`, its in-flight calls marked, the reason with its empty reward."""
        from polarproxy.rewards.verifier import VerifierResult
        from polarproxy.store.maintenance import interrupt

        interrupt(self.store, [(episode_id, why)])  # only if still running: a finished one is left as it is
        if self.store.get_episode(episode_id).status == "interrupted":
            origin = VerifierResult(reward=None, note=f"aborted: {why}").origin()
            self.store.set_rewards(episode_id, episode=None, origin=origin)

    def close(self) -> None:
        self.store.close()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class RayRollout:
    """The driver: hands jobs to the nodes' runners, re-queues the jobs of a lost node, and with
    --min-samples stops a group's other samples once K are evaluated."""

    def __init__(self, plan: Plan, settings: Settings, view: StoreView, spec: NodeSpec, on_job: Any = None):
        self.plan, self.s, self.view, self.spec = plan, settings, view, spec
        self.on_job = on_job or (lambda job, node: None)
        n = max(1, plan.concurrency)
        self.cap = n + max(1, n // 2)  # per node: the harnesses that run, and the prewarms ahead of them
        self.actors: dict[str, Any] = {}
        self.nodes: list[dict[str, Any]] = []
        self.lost: list[str] = []
        self.node_of: dict[tuple[str, int], str] = {}
        self.attempts: dict[tuple[str, int], list[dict[str, Any]]] = {}

    def start_nodes(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [n for n in ray.nodes() if n.get("Alive")]
        far = [n["NodeManagerAddress"] for n in alive if not is_loopback(n["NodeManagerAddress"])]
        if far:
            raise UsageError(
                f"The Ray cluster has nodes beyond loopback ({', '.join(sorted(set(far)))}).",
                hint="Start every node with --node-ip-address=127.0.0.1 and RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0.",
            )
        remote = ray.remote(NodeRunner)
        for node in alive:
            nid = node["NodeID"]
            strategy = NodeAffinitySchedulingStrategy(nid, soft=False)
            self.actors[nid] = remote.options(
                num_cpus=0, max_restarts=0, max_concurrency=self.cap + 4, scheduling_strategy=strategy
            ).remote(self.spec, nid)
        try:
            self.nodes = ray.get([a.ready.remote() for a in self.actors.values()], timeout=300)
        except Exception as e:
            raise UsageError(f"A node's gateway did not start: {e}", hint="Check --backend and --db.") from e

    def run(self) -> list[Job]:
        import ray

        scratch = self.plan.scratch or Path(tempfile.gettempdir())  # the nodes make their own folders
        jobs = plan_jobs(self.plan, self.s, scratch)
        queue = deque(j for j in jobs if j.state == "pending")
        refs: dict[Any, tuple[str, Job]] = {}
        load = {nid: 0 for nid in self.actors}
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            while queue or refs:
                while queue and load and min(load.values()) < self.cap:  # to the least loaded node
                    job = queue.popleft()
                    if job.state == "pending":
                        nid = min(load, key=load.__getitem__)
                        refs[self.actors[nid].run.remote(job.task, job.sample)] = (nid, job)
                        load[nid] += 1
                        self.node_of[job.key] = nid
                if not load and queue:
                    for job in queue:
                        job.state, job.reason = "failed", "every Ray node was lost"
                    queue.clear()
                if not refs:
                    continue
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
                for ref in ready:
                    nid, job = refs.pop(ref)
                    try:
                        self._apply(job, ray.get(ref))
                    except ray.exceptions.RayActorError:
                        if nid in load:
                            self._lose_node(nid)
                            del load[nid]
                        if self._lost_job(job, nid):
                            queue.appendleft(job)
                        continue
                    if nid in load:
                        load[nid] -= 1
                    self.on_job(job, nid)
                    self._accept(job, jobs, queue)
        except KeyboardInterrupt:
            live = [a for nid, a in self.actors.items() if nid not in self.lost]
            ray.get([a.stop.remote("*", None, "stopped") for a in live], timeout=60)
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return jobs

    def _apply(self, job: Job, r: dict[str, Any]) -> None:
        for name in RESULT:
            setattr(job, name, r[name])
        job.episode = EpisodeHandle(r["episode_id"], "") if r["episode_id"] else None
        for st in STAGES:  # durations measured on the node, on a time line of the job's own
            if st in r["queue_s"]:
                job.queued[st], job.started[st] = 0.0, r["queue_s"][st]
            if st in r["stage_s"]:
                job.ended[st] = job.started[st] + r["stage_s"][st]

    def _lose_node(self, nid: str) -> None:
        import ray

        self.lost.append(nid)
        ray.kill(self.actors[nid], no_restart=True)  # gone or unreachable: either way it runs nothing more

    def _lost_job(self, job: Job, nid: str) -> bool:
        """A job of a lost node: done if its episode finished in the store, else its attempt is ended
        `interrupted` and it runs again (True). Read again after the abort: a worker that outlived its node
        may have finished it just before; one that finishes it after is refused (409: not running)."""
        why = f"Ray node {nid[:12]} was lost mid-run; the sample runs again on another node"
        entry: dict[str, Any] = {"node": nid, "episode_id": None, "reason": why}
        self.attempts.setdefault(job.key, []).append(entry)
        for check in range(2):
            attempts = self.view.attempts(self.s.rollout_id, group_id(self.s, job.task), job.key)
            finished = [e for e in attempts if e.status in FINISHED and e.reward is not None]
            if finished:
                job.state, job.reward, job.evaluated = "done", finished[0].reward, True
                job.episode = EpisodeHandle(finished[0].episode_id, "")
                job.reason = f"its node {nid[:12]} was lost after it finished"
                entry.update(episode_id=finished[0].episode_id, reason=job.reason)
                self.on_job(job, nid)
                return False
            for e in attempts if check == 0 else []:
                if e.status == "running":
                    self.view.abort(e.episode_id, why)
                    entry["episode_id"] = e.episode_id
        return True

    def _accept(self, job: Job, jobs: list[Job], queue: deque[Job]) -> None:
        k = self.plan.min_samples
        if k is None or not job.evaluated:
            return
        group = [j for j in jobs if j.task.id == job.task.id]
        if sum(j.state == "skipped" or (j.evaluated and j.state == "done") for j in group) < k:
            return
        reason = f"aborted: the group was accepted with {k} of {self.plan.samples} samples"
        for other in group:
            if other.state == "pending":
                if other in queue:
                    other.state, other.reason = "aborted", reason
                else:
                    self.actors[self.node_of[other.key]].stop.remote(other.task.id, other.sample, reason)

    def close(self) -> None:
        import ray

        live = [a for nid, a in self.actors.items() if nid not in self.lost]
        try:
            ray.get([a.close.remote() for a in live], timeout=120)
        except Exception:  # a node that cannot close is killed below
            pass
        for a in live:
            ray.kill(a, no_restart=True)


def run_on_ray(
    task_list: list[Task],
    *,
    target: RayTarget,
    spec: NodeSpec,
    db: str,
    samples: int,
    min_samples: int | None,
    resume: bool,
    cluster: LocalCluster | None = None,
    on_job: Any = None,
) -> dict[str, Any]:
    """Run the rollout on `target` (or on `cluster`, already started) and return its summary (run.py's,
    plus `ray`: the nodes and their gateways, the lost nodes; and per episode its `node` and the
    `attempts` lost with a node)."""
    from polarproxy.rollout.run import summary

    ray = import_ray()
    own = cluster is None and target.nodes is not None
    if own:
        assert target.nodes is not None
        cluster = LocalCluster(target.nodes)
    view = StoreView(db)
    runner: RayRollout | None = None
    try:
        address = cluster.address if cluster else target.address
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        settings = replace(spec.settings, episodes=cast(Episodes, view))
        plan = Plan(
            task_list, samples, spec.concurrency, min_samples=min_samples, resume=resume, scratch=spec.workdir
        )
        runner = RayRollout(plan, settings, view, spec, on_job=on_job)
        t0 = time.monotonic()
        runner.start_nodes()
        started = time.monotonic() - t0
        jobs = runner.run()
        out = summary(jobs, settings, wall_s=time.monotonic() - t0)
        for job, entry in zip(jobs, out["episodes"], strict=True):
            entry["node"] = runner.node_of.get(job.key)
            entry["attempts"] = runner.attempts.get(job.key, [])
        out["ray"] = {
            "address": str(target),
            "nodes": runner.nodes,
            "lost_nodes": runner.lost,
            "gateways_start_s": round(started, 3),
        }
        return out
    finally:
        if runner is not None:
            runner.close()
        if ray.is_initialized():
            ray.shutdown()
        view.close()
        if own and cluster is not None:
            cluster.close()
