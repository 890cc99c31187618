"""RayScheduler: workers as Ray actors, placed with placement groups.

Each worker is a Ray actor that hosts the ordinary corral worker runtime in its own
process: it binds a port, registers in name-resolve and serves the same RPC as a local
worker. Ray only places the actor, keeps its resources reserved and tells us when it died.

Placement (``SchedulingSpec.ray_placement_strategy``, one value per role):

``"separate"`` (default)
    One placement group per worker, each with a single bundle that matches the worker's
    spec. Ray places single-bundle groups on the least loaded node that fits, so the
    workers of a role spread over the nodes when they can. Every group is created and
    waited for (up to ``startup_timeout``) before any actor starts.
``"shared"``
    One placement group for the whole role, one bundle per worker, strategy ``PACK``: the
    workers sit on as few nodes as possible. Created and waited for like ``separate``.
``"deferred"``
    Like ``separate``, but the actors are created at once without waiting for their
    groups; each actor starts when its group is placed. A group that never fits ends in
    the scheduler's ``WorkerTimeoutError`` (with the pending request in its message)
    instead of ``WorkerCreationError``. Use it on autoscaling clusters.

A bundle holds ``CPU=cpu`` and ``gpu`` units of the cluster's accelerator resource:
``GPU`` if the cluster has GPUs, else ``NPU`` if it has NPUs (read from
``ray.cluster_resources()``, never from the driver's own hardware). ``mem`` is not
reserved unless ``reserve_memory=True``: Ray's ``memory`` resource is a logical estimate
that small machines often cannot meet. A worker with a single GPU holds 0.9 of it so
that forked helpers (0.01 each, up to ten) fit on the same bundle.

Forked workers (``fork_workers`` / colocation with ``fork=True``) are new actors on the
target's placement group and bundle, with ``num_cpus=0`` and ``num_gpus=0.01`` (or
``NPU=0.01``). They see exactly the target's devices (``CUDA_VISIBLE_DEVICES`` /
``ASCEND_RT_VISIBLE_DEVICES``), also when the target has several GPUs: Ray cannot grant
a fraction of a multi-GPU bundle its owner holds whole, so such forks take no GPU share
from Ray's ledger and rely on the target's devices instead.

``MASTER_ADDR``/``MASTER_PORT`` come from the actor on bundle 0 of the role's first
placement group: it binds port 0 on its node's IP, closes it and reports both.

Workers receive the trial secret as an argument of the actor's constructor (Ray nodes need
not share a filesystem), never in ``runtime_env`` or an environment variable; their output goes to Ray's worker log and to corral's
per-replica, per-role and merged logs (when the log directory is writable on the node).
``SchedulingSpec.cmd`` and containers are not supported on Ray. ``max_restarts``: the
core restarts a dead worker through ``restart``, as a new actor on the old one's bundle.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral import options as opts
from corral.backends.options import RayOptions
from corral.backends.ray_actor import _GROUP_RE
from corral.backends.ray_placement import infeasible, node_totals, remove_trial_leftovers
from corral.backends.ray_requeue import NODE_LOST, NodeLossRequeue, node_lost
from corral.backends.ray_support import (  # name_prefix, apply_quiet_env: importable here
    DEFAULT_OBJECT_STORE_MEMORY,
    QUIET_ENV,
    _actor_class,
    _death_reason,
    _pg_name,
    _ray,
    _running_local_cluster,
    apply_quiet_env,
    format_resources,
    name_prefix,
)
from corral.capabilities import Elastic, Preemptible
from corral.errors import ConfigError, PlacementError, WorkerCreationError
from corral.launcher import ForkRequest, Launcher, LaunchRequest, WorkerExit, env_lines
from corral.logs import replica_log_path
from corral.procs import pid_alive
from corral.scheduler import Scheduler
from corral.spec import NormalizedJob, Worker
from corral.worker import env as E
from corral.worker.args import command_argv

log = logging.getLogger("corral.ray")

#: Environment that keeps Ray quiet and light; applied (without overriding) before import.
MAIN_SINGLE_GPU_SHARE = 0.9
FORK_ACCELERATOR_SHARE = 0.01
ACTOR_MAX_CONCURRENCY = 8
STOP_GRACE_SECONDS = 3.0
GONE_TIMEOUT_SECONDS = 10.0
STRATEGIES = {"separate": "SPREAD", "shared": "PACK", "deferred": "SPREAD"}


# --------------------------------------------------------------------------- driver side
@dataclass
class _Replica:
    role: str
    index: int
    name: str
    actor: Any
    done_ref: Any
    info_ref: Any
    env: dict[str, str]
    pg: Any
    bundle_index: int
    spec: Any
    kind: str | None  # the accelerator resource of its bundle (GPU, NPU) if it uses one
    log_dir: str
    parent: tuple[str, int] | None = None
    info: dict | None = None
    exit: WorkerExit | None = None


@dataclass
class _Role:
    replicas: list[_Replica] = field(default_factory=list)
    pgs: list[Any] = field(default_factory=list)
    bundles: list[list[dict]] = field(default_factory=list)
    strategy: str = "separate"


class RayLauncher(Launcher, Elastic, Preemptible):
    """Places workers with placement groups and runs each in a ``RayWorkerActor``."""

    name = "ray"
    shares_filesystem = False

    def __init__(
        self,
        options: RayOptions | None = None,
        *,
        startup_timeout: float = 120.0,
        dry_run: bool = False,
        requeue: bool = False,
    ):
        """``dry_run=True``: Ray is neither imported nor started (``describe`` only).
        ``requeue=True``: node loss is preemption (see ray_requeue)."""
        options = options or RayOptions()
        self.options = options
        self.requeue = requeue
        self._node_loss = NodeLossRequeue()
        self.startup_timeout = float(startup_timeout)
        self.reserve_memory = options.reserve_memory
        self.started_runtime = False
        self.address = address = options.address
        init_kwargs = options.init_kwargs
        self._roles: dict[str, _Role] = {}
        self._forks: dict[str, _Role] = {}
        self._lock = threading.RLock()
        self.ray = None
        if dry_run:
            return
        self.ray = ray = _ray()
        if ray.is_initialized():
            return  # the caller's runtime: used as it is, never shut down by us
        address = address or os.environ.get("RAY_ADDRESS") or _running_local_cluster()
        kwargs: dict[str, Any] = {"log_to_driver": False}
        if address and address != "local":
            kwargs.update(init_kwargs or {})
            ray.init(address=address, **kwargs)
        else:  # "local" or nothing running: start a runtime of our own
            kwargs.update(include_dashboard=False, object_store_memory=DEFAULT_OBJECT_STORE_MEMORY)
            kwargs.update(init_kwargs or {})
            ray.init(address="local", **kwargs)
        self.started_runtime = True

    # ------------------------------------------------------------- resources
    def accelerator_kind(self) -> str | None:
        """``GPU`` if the cluster has GPUs, else ``NPU`` if it has NPUs, else None."""
        resources = self.ray.cluster_resources()
        for kind in ("GPU", "NPU"):
            if resources.get(kind, 0) > 0:
                return kind
        return None

    def _bundle(self, spec, kind: str | None) -> dict[str, float]:
        bundle: dict[str, float] = {}
        if spec.cpu:
            bundle["CPU"] = float(spec.cpu)
        if spec.gpu and kind:
            bundle[kind] = float(spec.gpu)
        if self.reserve_memory and spec.mem:
            bundle["memory"] = float(spec.mem * 1024**3)
        return bundle or {"CPU": 0.001}

    def check(self, job: NormalizedJob) -> None:
        strategies = {t.ray_placement_strategy for t in job.tasks}
        if len(strategies) > 1:
            raise ConfigError(
                "job.tasks[*].ray_placement_strategy",
                sorted(strategies),
                "use one placement strategy for every replica of a role",
            )
        for i, spec in enumerate(job.tasks):
            if spec.cmd and command_argv(spec.cmd)[1:] != ["-m", "corral.worker"]:
                raise ConfigError(
                    f"job.tasks[{i}].cmd",
                    spec.cmd,
                    "RayScheduler runs the corral worker inside a Ray actor and cannot run "
                    "another command; remove cmd or use LocalScheduler/SlurmScheduler",
                )
            if spec.container_type != "none":
                raise ConfigError(
                    f"job.tasks[{i}].container_type",
                    spec.container_type,
                    "containers are a Slurm feature; on Ray use the cluster's image "
                    "(container_type='none')",
                )
        if self.ray is None:  # a dry run: no cluster to check against
            return
        kind = self.accelerator_kind()
        for i, spec in enumerate(job.tasks):
            if spec.gpu > 0 and kind is None:
                raise ConfigError(
                    f"job.tasks[{i}].gpu",
                    spec.gpu,
                    "the Ray cluster has no GPU or NPU resource (it has "
                    f"{format_resources(self.ray.cluster_resources())}); use gpu=0, join a "
                    "cluster with GPUs, or declare them with ray.init(num_gpus=N)",
                )
        bundles = [self._bundle(spec, kind) for spec in job.tasks]
        why = infeasible(bundles, node_totals(self.ray), format_resources)
        if why:
            raise PlacementError(
                f"{job.role}: placement",
                f"{job.replicas} worker(s)",
                f"it can never be placed: {why} (available now: "
                f"{format_resources(self.ray.available_resources())}). Lower cpu/gpu or "
                "replicas, or add nodes",
            )

    # ----------------------------------------------------------------- launch
    def describe(self, request: LaunchRequest) -> str:
        """The placement groups and each actor's options (GPU stands for the cluster's
        accelerator, GPU or NPU, which is read from the cluster at launch)."""
        job = request.job
        kind = self.accelerator_kind() if self.ray is not None else "GPU"
        prefix = name_prefix(request.envs[0][E.EXPERIMENT], request.envs[0][E.TRIAL])
        strategy = job.tasks[0].ray_placement_strategy
        bundles = [self._bundle(spec, kind) for spec in job.tasks]
        where = self.address or "the runtime of this process, RAY_ADDRESS or a local one"
        lines = [f"# dry run (ray): {job.replicas} {job.role} actor(s) on {where}"]
        if strategy == "shared":
            lines.append(f"placement_group({bundles}, strategy='PACK', name='{prefix}:{job.role}')")
        else:
            for i, bundle in enumerate(bundles):
                lines.append(
                    f"placement_group([{bundle}], strategy='{STRATEGIES[strategy]}', "
                    f"name='{prefix}:{job.role}:{i}')"
                )
        for index, (spec, env) in enumerate(zip(job.tasks, request.envs, strict=True)):
            options = {
                "name": f"{prefix}:{job.role}:{index}",
                "num_cpus": float(spec.cpu),
                "max_concurrency": ACTOR_MAX_CONCURRENCY,
                "max_restarts": 0,
                "placement_group_bundle_index": index if strategy == "shared" else 0,
                **self._accelerator_options(kind, spec.gpu),
            }
            if spec.gpu == 0:
                env = {**env, "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES", "")}
            lines += [
                f"## {job.role}/{index}: RayWorkerActor.options({options})",
                "  environment (the trial secret is an actor argument, never shown):",
                *env_lines(env),
            ]
        return "\n".join(lines)

    def launch(self, request: LaunchRequest) -> None:
        from ray.util.placement_group import placement_group

        job = request.job
        kind = self.accelerator_kind()
        prefix = name_prefix(request.envs[0][E.EXPERIMENT], request.envs[0][E.TRIAL])
        strategy = job.tasks[0].ray_placement_strategy
        bundles = [self._bundle(spec, kind) for spec in job.tasks]
        record = _Role(strategy=strategy)
        with self._lock:
            self._roles[job.role] = record
        if strategy == "shared":
            record.pgs = [placement_group(bundles, strategy="PACK", name=f"{prefix}:{job.role}")]
            record.bundles = [bundles]
            places = [(record.pgs[0], i) for i in range(job.replicas)]
        else:
            record.pgs = [
                placement_group([b], strategy=STRATEGIES[strategy], name=f"{prefix}:{job.role}:{i}")
                for i, b in enumerate(bundles)
            ]
            record.bundles = [[b] for b in bundles]
            places = [(pg, 0) for pg in record.pgs]
        if strategy != "deferred":
            self._wait_groups(job, record, bundles)
        for index, (spec, env) in enumerate(zip(job.tasks, request.envs, strict=True)):
            pg, bundle_index = places[index]
            replica = self._start_main(
                job.role, index, spec, env, pg, bundle_index, kind, request.log_dir
            )
            with self._lock:
                record.replicas.append(replica)

    def grow(
        self, role: str, first: int, tasks: list, envs: list[dict[str, str]], log_dir: str
    ) -> None:
        """New replicas ``first``..: their own placement group(s), then their actors."""
        from ray.util.placement_group import placement_group, remove_placement_group

        with self._lock:
            record = self._roles[role]
        kind = self.accelerator_kind()
        prefix = name_prefix(envs[0][E.EXPERIMENT], envs[0][E.TRIAL])
        bundles = [self._bundle(spec, kind) for spec in tasks]
        if record.strategy == "shared":
            pgs = [placement_group(bundles, strategy="PACK", name=f"{prefix}:{role}:+{first}")]
            groups, places = [bundles], [(pgs[0], i) for i in range(len(tasks))]
        else:
            pgs = [
                placement_group(
                    [b], strategy=STRATEGIES[record.strategy], name=f"{prefix}:{role}:{first + i}"
                )
                for i, b in enumerate(bundles)
            ]
            groups, places = [[b] for b in bundles], [(pg, 0) for pg in pgs]
        _, pending = self.ray.wait(
            [pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.startup_timeout
        )
        if pending:
            for pg in pgs:
                remove_placement_group(pg)
            self._wait_groups_gone(pgs)
            raise WorkerCreationError(
                f"could not place {len(tasks)} more {role} worker(s) within "
                f"{self.startup_timeout:.0f}s: {self.pending_reason(role) or 'no room'}"
            )
        with self._lock:
            record.pgs.extend(pgs)
            record.bundles.extend(groups)
        for i, (spec, env) in enumerate(zip(tasks, envs, strict=True)):
            pg, bundle_index = places[i]
            replica = self._start_main(role, first + i, spec, env, pg, bundle_index, kind, log_dir)
            with self._lock:
                record.replicas.append(replica)

    def shrink(self, role: str, indices: list[int]) -> None:
        """Stop these replicas' actors; remove their placement groups when nothing else
        of the role uses them."""
        gone = set(indices)
        with self._lock:
            record = self._roles[role]
            doomed = [r for r in record.replicas if r.index in gone]
            record.replicas = [r for r in record.replicas if r.index not in gone]
            used = {id(r.pg) for r in record.replicas}
            keep = [
                (pg, b) for pg, b in zip(record.pgs, record.bundles, strict=True) if id(pg) in used
            ]
            dropped = [pg for pg in record.pgs if id(pg) not in used]
            record.pgs = [pg for pg, _ in keep]
            record.bundles = [b for _, b in keep]
        self._teardown(doomed, dropped)

    def _start_main(
        self,
        role: str,
        index: int,
        spec: Any,
        env: dict[str, str],
        pg: Any,
        bundle_index: int,
        kind: str | None,
        log_dir: str,
        suffix: str = "",
    ) -> _Replica:
        env = dict(env)
        if spec.gpu == 0:
            env.setdefault("CUDA_VISIBLE_DEVICES", "")
        prefix = name_prefix(env[E.EXPERIMENT], env[E.TRIAL])
        try:
            return self._start_actor(
                role=role,
                index=index,
                name=f"{prefix}:{role}:{index}{suffix}",
                env=env,
                pg=pg,
                bundle_index=bundle_index,
                num_cpus=float(spec.cpu),
                options=self._accelerator_options(kind, spec.gpu),
                spec=spec,
                kind=kind if spec.gpu else None,
                log_dir=log_dir,
            )
        except Exception as exc:
            raise WorkerCreationError(
                f"could not create the Ray actor for {role}/{index}: {exc}"
            ) from exc

    def restart(self, role: str, index: int, env: dict[str, str]) -> None:
        """A new actor for replica ``index`` in the old one's placement group bundle."""
        with self._lock:
            record = self._roles.get(role)
        old = next((r for r in record.replicas if r.index == index), None) if record else None
        if record is None or old is None:
            raise WorkerCreationError(
                f"cannot restart {role}/{index}: the Ray backend has no such worker"
            )
        self._teardown([old], [])
        new = self._start_main(
            role, index, old.spec, env, old.pg, old.bundle_index, old.kind, old.log_dir
        )
        with self._lock:
            record.replicas = [new if r is old else r for r in record.replicas]

    @staticmethod
    def _accelerator_options(kind: str | None, gpu: int) -> dict:
        if not kind or not gpu:
            return {}
        share = MAIN_SINGLE_GPU_SHARE if gpu == 1 else float(gpu)
        return {"num_gpus": share} if kind == "GPU" else {"resources": {kind: share}}

    def _start_actor(
        self,
        *,
        role: str,
        index: int,
        name: str,
        env: dict[str, str],
        pg: Any,
        bundle_index: int,
        num_cpus: float,
        options: dict,
        spec: Any,
        kind: str | None,
        log_dir: str,
        visible_devices: dict[str, str] | None = None,
        parent: tuple[str, int] | None = None,
    ) -> _Replica:
        ray = self.ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor = (
            _actor_class(ray)
            .options(
                name=name,
                num_cpus=num_cpus,
                max_concurrency=ACTOR_MAX_CONCURRENCY,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle_index
                ),
                **options,
            )
            .remote(env, env.get(E.ADVERTISE_HOST), visible_devices, self.trial_secret)
        )
        return _Replica(
            role=role,
            index=index,
            name=name,
            actor=actor,
            done_ref=actor.wait_forever.remote(),
            info_ref=actor.info.remote(),
            env=env,
            pg=pg,
            bundle_index=bundle_index,
            spec=spec,
            kind=kind,
            log_dir=log_dir,
            parent=parent,
        )

    def _wait_groups(self, job: NormalizedJob, record: _Role, bundles: list[dict]) -> None:
        ray = self.ray
        from ray.util.placement_group import remove_placement_group

        refs = {pg.ready(): pg for pg in record.pgs}
        deadline = time.monotonic() + self.startup_timeout
        pending = list(refs)
        last = None
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=min(left, 1.0))
            if pending:  # waiting for busy resources: say so while it waits
                reason = self.pending_reason(job.role)
                if reason and reason != last:
                    self.progress(f"waiting for {job.role}: {reason}")
                    last = reason
        if not pending:
            return
        waiting = [refs[r] for r in pending]
        names = ", ".join(_pg_name(pg) for pg in waiting[:6])
        if len(waiting) > 6:
            names += f" and {len(waiting) - 6} more"
        total: dict[str, float] = {}
        for b in bundles:
            for key, value in b.items():
                total[key] = total.get(key, 0.0) + value
        uniform = len({str(b) for b in bundles}) == 1
        asked = (
            format_resources(bundles[0]) if uniform else ", ".join(map(format_resources, bundles))
        )
        message = (
            f"could not place {len(waiting)} of {len(record.pgs)} placement group(s) of role "
            f"{job.role!r} within {self.startup_timeout:.0f}s ({names}): each worker asks "
            f"{asked} (ray_placement_strategy={record.strategy!r}), the role "
            f"{format_resources(total)} in total; the Ray cluster has "
            f"{format_resources(ray.cluster_resources())}, of which "
            f"{format_resources(ray.available_resources())} available. Lower cpu/gpu or "
            "replicas, add nodes, or raise startup_timeout."
        )
        for pg in record.pgs:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        self._wait_groups_gone(record.pgs)
        with self._lock:
            self._roles.pop(job.role, None)
        raise WorkerCreationError(message)

    # ------------------------------------------------------------------- poll
    def _records(self, role: str) -> list[_Replica]:
        with self._lock:
            record = self._roles.get(role) or self._forks.get(role)
            return list(record.replicas) if record else []

    def poll(self, role: str) -> dict[int, WorkerExit]:
        ray = self.ray
        replicas = self._records(role)
        live = [r for r in replicas if r.exit is None]
        if live and not ray.is_initialized():
            for r in live:  # the driver's actors went with its runtime
                r.exit = WorkerExit(
                    f"Ray actor {r.name} is gone: ray.shutdown() was called in this process"
                )
        elif live:
            ready, _ = ray.wait([r.done_ref for r in live], num_returns=len(live), timeout=0)
            ready_ids = {ref.hex() for ref in ready}
            for r in live:
                if r.done_ref.hex() in ready_ids:
                    exit_ = self._exit_of(r)
                    with self._lock:  # the monitor and a call may poll at once
                        first, r.exit = r.exit is None, r.exit or exit_
                    if first and exit_.preempted and r.parent is None:
                        self._bring_back(r)
        dead = {r.index: r.exit for r in replicas if r.exit is not None}
        if self.requeue:
            dead.update(self._node_loss.still_lost(ray, role))
        return dead

    def _bring_back(self, old: _Replica) -> None:
        """A replica lost with its node: a new actor in the same bundle, which Ray starts
        once it placed the bundle again (see ray_requeue)."""
        try:  # a name of its own: Ray may not have released the dead actor's name yet
            new = self._start_main(
                old.role, old.index, old.spec, old.env, old.pg, old.bundle_index, old.kind,
                old.log_dir, suffix=f":back{uuid.uuid4().hex[:6]}",
            )  # fmt: skip
        except WorkerCreationError as exc:
            old.exit.preempted = False
            old.exit.reason += f"; it could not be brought back: {exc}"
            return
        with self._lock:
            record = self._roles.get(old.role)
            if record is not None:
                record.replicas = [new if r is old else r for r in record.replicas]
        self._node_loss.replace(old.role, old.index, old.exit, new)

    def preempted(self, role: str) -> bool:
        return self._node_loss.preempted(role)

    def mark_returned(self, role: str) -> None:
        self._node_loss.mark_returned(role)

    def _exit_of(self, replica: _Replica) -> WorkerExit:
        ray = self.ray
        log_path = replica_log_path(replica.log_dir, replica.role, replica.index)
        try:
            reason = ray.get(replica.done_ref, timeout=5)
            return WorkerExit(f"Ray actor {replica.name} {reason}", None, log_path)
        except ray.exceptions.RayActorError as exc:
            if self.requeue and node_lost(exc):
                return WorkerExit(_death_reason(exc) + NODE_LOST, None, log_path, preempted=True)
            return WorkerExit(_death_reason(exc), None, log_path)
        except Exception as exc:
            return WorkerExit(f"Ray actor {replica.name} is gone: {exc}", None, log_path)

    def pending_reason(self, role: str) -> str | None:
        from ray.util.placement_group import placement_group_table

        with self._lock:
            record = self._roles.get(role)
        if record is None or not self.ray.is_initialized():
            return None
        waiting = []
        for pg, bundles in zip(record.pgs, record.bundles, strict=True):
            state = placement_group_table(pg).get("state", "?")
            if state != "CREATED":
                asked = ", ".join(format_resources(b) for b in bundles)
                waiting.append(f"{_pg_name(pg)} is {state}, asking {asked}")
        if waiting:
            return (
                "placement group(s) not placed: "
                + "; ".join(waiting[:4])
                + f"; the cluster has {format_resources(self.ray.available_resources())} "
                f"available of {format_resources(self.ray.cluster_resources())}"
            )
        starting = [r.name for r in record.replicas if r.exit is None]
        if starting:
            return f"placement groups placed; Ray actors still starting: {', '.join(starting[:4])}"
        return None

    def remove_leftovers(self, experiment: str, trial: str) -> list[str]:
        return remove_trial_leftovers(self.ray, name_prefix(experiment, trial))

    def placement(self, role: str, index: int, timeout: float = 30.0) -> dict:
        """Where a worker (launched or forked) runs: node id and ip, placement group id,
        bundle index, pid, visible devices."""
        for r in self._records(role):
            if r.index == index:
                return dict(self._info(r, timeout))
        raise KeyError(f"{role}/{index}")

    def _info(self, replica: _Replica, timeout: float) -> dict:
        if replica.info is None:
            replica.info = self.ray.get(replica.info_ref, timeout=timeout)
        return replica.info

    # ------------------------------------------------------------- rendezvous
    def rendezvous_master(self, role: str, workers: list[Worker]) -> tuple[str, int] | None:
        replicas = self._records(role)
        if not replicas:
            return super().rendezvous_master(role, workers)
        first = min(replicas, key=lambda r: r.index)
        ip, port = self.ray.get(first.actor.free_port.remote(), timeout=60)
        return ip, int(port)

    # ------------------------------------------------------------------- fork
    def fork(self, request: ForkRequest) -> Worker:
        """A new actor in the target's placement group bundle, seeing its devices; a
        ``command`` other than the corral worker is started by the target itself."""
        role, index, target, env = request.role, request.index, request.target, request.env
        parent = next((r for r in self._records(target.role) if r.index == target.index), None)
        if request.command is not None or parent is None:
            return request.via_worker()
        ray = self.ray
        info = self._info(parent, self.startup_timeout)
        child_env = dict(parent.env)
        child_env.update({str(k): str(v) for k, v in env.items()})
        child_env.update({E.ROLE: role, E.INDEX: str(index), E.FORKED: "1"})
        for key in (E.INDEX_OFFSET, E.BACKEND_ID):
            child_env.pop(key, None)
        options = {}
        kind = parent.kind
        if kind and parent.spec.gpu == 1:
            share = FORK_ACCELERATOR_SHARE
            options = {"num_gpus": share} if kind == "GPU" else {"resources": {kind: share}}
        prefix = name_prefix(child_env[E.EXPERIMENT], child_env[E.TRIAL])
        try:
            child = self._start_actor(
                role=role,
                index=index,
                name=f"{prefix}:{role}:{index}",
                env=child_env,
                pg=parent.pg,
                bundle_index=parent.bundle_index,
                num_cpus=0,
                options=options,
                spec=parent.spec,
                kind=kind,
                log_dir=parent.log_dir,
                visible_devices=info.get("visible_devices") if kind else None,
                parent=(parent.role, parent.index),
            )
        except Exception as exc:
            raise WorkerCreationError(
                f"could not fork {role}/{index} next to {target.id}: {exc}"
            ) from exc
        with self._lock:
            self._forks.setdefault(role, _Role(strategy="fork")).replicas.append(child)
        try:
            child_info = self._info(child, self.startup_timeout)
        except Exception as exc:
            reason = (
                _death_reason(exc)
                if isinstance(exc, ray.exceptions.RayActorError)
                else f"not ready within {self.startup_timeout:.0f}s ({type(exc).__name__})"
            )
            self._teardown([child], [])
            self._drop_fork(child)
            raise WorkerCreationError(
                f"forked worker {role}/{index} next to {target.id} failed to start: {reason}"
            ) from None
        return Worker.from_registration(
            role,
            index,
            child_info["address"],
            child_info,
            host=child_info.get("node_id") or child_info.get("host", ""),  # as workers report it
            backend_id=child_info["actor_id"],
            forked=True,
        )

    def _drop_fork(self, child: _Replica) -> None:
        with self._lock:
            record = self._forks.get(child.role)
            if record is not None:
                record.replicas = [r for r in record.replicas if r is not child]
                if not record.replicas:
                    self._forks.pop(child.role, None)

    def stop_fork(self, worker: Worker, via_worker: Callable[[], None]) -> None:
        child = next((r for r in self._records(worker.role) if r.index == worker.index), None)
        if child is None or child.parent is None:
            via_worker()  # its host worker started it
            return
        self._teardown([child], [])
        self._drop_fork(child)

    # --------------------------------------------------------------- teardown
    def stop(self, role: str, reverse: bool = False) -> None:
        """Every actor of the role at once (Ray gives no order among them)."""
        self._node_loss.forget(role)
        with self._lock:
            record = self._roles.pop(role, None)
            doomed = []
            for fork_role, forks in list(self._forks.items()):
                mine = [r for r in forks.replicas if r.parent and r.parent[0] == role]
                if mine:
                    doomed.extend(mine)
                    forks.replicas = [r for r in forks.replicas if r not in mine]
                    if not forks.replicas:
                        self._forks.pop(fork_role, None)
        if record is None and not doomed:
            return
        replicas = doomed + (record.replicas if record else [])
        self._teardown(replicas, record.pgs if record else [])

    def _teardown(self, replicas: list[_Replica], pgs: list[Any]) -> None:
        ray = self.ray
        if not ray.is_initialized():
            return  # the runtime is gone, and its actors and groups with it
        from ray.util.placement_group import remove_placement_group

        live = [r for r in replicas if r.exit is None]
        stops = []
        for r in live:
            try:
                stops.append(r.actor.stop.remote())
            except Exception:
                pass
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=STOP_GRACE_SECONDS)
        pids = []
        for r in replicas:
            ready, _ = ray.wait([r.info_ref], timeout=0)
            if ready:
                try:
                    info = ray.get(r.info_ref, timeout=1)
                    if info.get("hostname") == socket.gethostname():
                        pids.append(info["pid"])
                except Exception:
                    pass
            try:
                ray.kill(r.actor, no_restart=True)
            except Exception:
                pass
        for pg in pgs:
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        deadline = time.monotonic() + GONE_TIMEOUT_SECONDS
        self._wait_actors_dead(replicas, deadline)
        for r in replicas:
            if r.exit is None:
                r.exit = WorkerExit(f"Ray actor {r.name} stopped by the scheduler")
        self._wait_groups_gone(pgs, deadline)
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if pid_alive(p)]
            if pids:
                time.sleep(0.02)

    def _wait_actors_dead(self, replicas: list[_Replica], deadline: float) -> None:
        """Until Ray reports each killed actor dead (then its name is free again): a call
        made after ``ray.kill`` fails with RayActorError once the kill has landed."""
        ray = self.ray
        pending = list(replicas)
        while pending and time.monotonic() < deadline:
            probes = {r.actor.ping.remote(): r for r in pending}
            ready, not_ready = ray.wait(
                list(probes), num_returns=len(probes), timeout=max(0.0, deadline - time.monotonic())
            )
            pending = [probes[ref] for ref in not_ready]
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                    pending.append(probes[ref])  # it still answered: the kill is on its way
                except ray.exceptions.RayActorError:
                    pass
                except Exception:
                    pass
            if pending:
                time.sleep(0.02)

    def _wait_groups_gone(self, pgs: list[Any], deadline: float | None = None) -> None:
        """Until the groups are REMOVED and their reserved resources are back."""
        if not pgs:
            return
        from ray.util.placement_group import placement_group_table

        deadline = deadline or time.monotonic() + GONE_TIMEOUT_SECONDS
        ids = {pg.id.hex() for pg in pgs}
        while time.monotonic() < deadline:
            states = {placement_group_table(pg).get("state") for pg in pgs}
            held = any(
                _GROUP_RE.search(k) and _GROUP_RE.search(k).group(2) in ids
                for k in self.ray.available_resources()
            )
            if states <= {"REMOVED"} and not held:
                return
            time.sleep(0.02)
        log.warning("placement groups %s still present after removal", sorted(ids))

    def close(self) -> None:
        for role in list(self._forks):
            with self._lock:
                record = self._forks.pop(role, None)
            if record:
                self._teardown(record.replicas, [])
        for role in list(self._roles):
            self.stop(role)
        if self.started_runtime and self.ray is not None and self.ray.is_initialized():
            self.ray.shutdown()
        self.started_runtime = False


class RayScheduler(Scheduler):
    """Workers are Ray actors on a Ray cluster, one placement group bundle per worker.

    Joins the runtime this process already has (``ray.init()`` called before), else the
    cluster at ``address`` / ``cfg.scheduler.ray.address`` / ``RAY_ADDRESS`` / the one
    running on this machine, else starts a local runtime (no dashboard, object store
    capped at 512 MiB; ``init_kwargs`` go to ``ray.init``) that ``close()`` shuts down.
    A runtime it did not start is never shut down. See the module docstring for the
    placement strategies and forking.
    """

    backend = "ray"

    def __init__(
        self,
        startup_timeout: float | None = None,
        *,
        exp_config: Any = None,
        n_gpus_per_node: int | None = None,
        address: str | None = None,
        init_kwargs: dict | None = None,
        reserve_memory: bool | None = None,
        dry_run: bool = False,
        requeue: bool = False,
        **kwargs: Any,
    ):
        """``requeue=True``: a worker lost with its Ray node is preempted and comes back
        (corral.backends.ray_requeue; ``wait_role``). AReaL's signature (``startup_timeout``, then ``exp_config`` and
        ``n_gpus_per_node`` by keyword; a config's ``n_gpus_per_node`` wins); an
        experiment config given first is taken as ``exp_config``. ``address``,
        ``init_kwargs`` and ``reserve_memory`` are :class:`RayOptions` (they win over
        ``cfg.scheduler.ray``)."""
        if exp_config is None and opts.looks_like_config(startup_timeout):
            exp_config, startup_timeout = startup_timeout, None
        opts.check_exp_config(exp_config)
        opts.check_number("startup_timeout", startup_timeout)
        options = RayOptions.resolve(
            exp_config, address=address, init_kwargs=init_kwargs, reserve_memory=reserve_memory
        )
        launcher = RayLauncher(options, dry_run=dry_run, requeue=requeue)
        try:
            super().__init__(
                exp_config,
                launcher=launcher,
                startup_timeout=startup_timeout,
                n_gpus_per_node=n_gpus_per_node,
                dry_run=dry_run,
                **kwargs,
            )
        except BaseException:
            launcher.close()
            raise
        launcher.startup_timeout = self.startup_timeout


__all__ = [
    "RayLauncher",
    "RayScheduler",
    "QUIET_ENV",
    "apply_quiet_env",
    "format_resources",
    "name_prefix",
]
