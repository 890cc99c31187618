"""RayScheduler: workers as Ray actors, placed with placement groups.

Each worker is a Ray actor that hosts the ordinary corral worker runtime in its own
process: it binds a port, registers in name-resolve and serves the same RPC as a local
worker. Ray only places the actor, keeps its resources reserved and tells us when it died.

Placement (``SchedulingSpec.ray_placement_strategy``, one value per role; docs/backends.md):
``"separate"`` (default) is one single-bundle placement group per worker, so a role
spreads over the nodes; ``"shared"`` is one ``PACK`` group per role; ``"deferred"`` is
``separate`` without waiting for the groups before the actors start (autoscaling
clusters: a group that never fits ends in ``WorkerTimeoutError``).

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

import dataclasses
import logging
import os
import threading
from typing import Any

from corral import scheduler_keywords as opts
from corral.backends.backend_options import RayOptions
from corral.backends.ray_adopt import RayAdoption
from corral.backends.ray_elastic import RayElastic
from corral.backends.ray_fork import RayForks
from corral.backends.ray_groups import PlacementGroups, group_specs
from corral.backends.ray_nodes import NodeWatch
from corral.backends.ray_placement import infeasible, node_totals, remove_trial_leftovers
from corral.backends.ray_requeue import NODE_LOST, NodeLossRequeue, RayNodeLoss, node_lost
from corral.backends.ray_start import (
    ACTOR_MAX_CONCURRENCY,
    ActorStarter,
    _Replica,
    _Role,
    accelerator_options,
    detached_options,
)
from corral.backends.ray_support import (  # name_prefix, apply_quiet_env: importable here
    DEFAULT_OBJECT_STORE_MEMORY,
    QUIET_ENV,
    _death_reason,
    _ray,
    _running_local_cluster,
    apply_quiet_env,
    format_resources,
    name_prefix,
)
from corral.backends.ray_teardown import RayTeardown
from corral.errors import ConfigError, PlacementError, WorkerCreationError
from corral.launcher import Launcher, LaunchRequest, WorkerExit, env_lines
from corral.logs import replica_log_path
from corral.multinode import per_node
from corral.resources import ray_extra_resources, unknown_ray_resources
from corral.scheduler import Scheduler
from corral.spec import NormalizedJob, Worker
from corral.worker import env as E
from corral.worker.args import command_argv

log = logging.getLogger("corral.ray")


class RayLauncher(
    ActorStarter,
    PlacementGroups,
    RayElastic,
    RayForks,
    RayNodeLoss,
    RayTeardown,
    RayAdoption,
    Launcher,
):
    """Places workers with placement groups and runs each in a ``RayWorkerActor``.

    Its capabilities live in mixins, one module each: ``ray_start`` (a worker's actor on
    a bundle), ``ray_groups`` (placement groups, pending reasons), ``ray_elastic`` (grow,
    shrink), ``ray_fork`` (fork, stop_fork), ``ray_requeue`` (node loss as preemption),
    ``ray_teardown`` (stop, close), ``ray_adopt`` (workers that outlive the
    controller, re-attach). This class launches, checks, describes, restarts
    and polls."""

    name = "ray"
    shares_filesystem = False
    # the connection of a call fan-out, and the gRPC channel Ray opens to the actor's
    # process (measured: tests/conformance/test_fd_budget.py)
    fds_per_worker = 2

    elastic = preemption = adoption = property(lambda self: self)  # its own parts, for now
    multi_node = True

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
        self.own_cluster = False  # a local runtime that ends with this process
        self.address = address = options.address
        init_kwargs = options.init_kwargs
        self._roles: dict[str, _Role] = {}
        self._forks: dict[str, _Role] = {}
        self._lock = threading.RLock()
        self.ray = None
        self.n_gpus_per_node = 0  # set by RayScheduler: multi-node workers (corral.multinode)
        self._nodes: NodeWatch | None = None  # drained nodes, dead raylets (ray_nodes)
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
            self.own_cluster = True
        self.started_runtime = True

    def check(self, job: NormalizedJob) -> None:
        self.check_outlive()
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
        k = self.nodes_per_worker(job)
        bundles = [self._bundle(per_node(spec, k), kind) for spec in job.tasks for _ in range(k)]
        if k > len(node_totals(self.ray)):
            raise PlacementError(
                f"{job.role}: nodes",
                k,
                f"each worker holds {k} whole nodes but the Ray cluster has "
                f"{len(node_totals(self.ray))} alive; lower gpu or add nodes",
            )
        wanted = {name for spec in job.tasks for name in ray_extra_resources(spec)}
        why = unknown_ray_resources(wanted, self.ray.cluster_resources()) or infeasible(
            bundles, node_totals(self.ray), format_resources
        )
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
        k = self.nodes_per_worker(job)  # > 1: one STRICT_SPREAD group of k nodes per worker
        bundles = [self._bundle(per_node(spec, k), kind) for spec in job.tasks]
        where = self.address or "the runtime of this process, RAY_ADDRESS or a local one"
        lines = [f"# dry run (ray): {job.replicas} {job.role} actor(s) on {where}"]
        if k > 1:
            lines.append(f"# each worker holds {k} nodes: a {job.role}.members actor per node")
        specs = [
            ([b] * k, "STRICT_SPREAD", f"{prefix}:{job.role}:{i}") for i, b in enumerate(bundles)
        ]
        for group, group_strategy, name in (
            specs if k > 1 else group_specs(prefix, job.role, bundles, strategy)
        ):
            lifetime = ", lifetime='detached'" if self.outlive else ""
            lines.append(
                f"placement_group({group}, strategy='{group_strategy}', name='{name}'{lifetime})"
            )
        for index, (spec, env) in enumerate(zip(job.tasks, request.envs, strict=True)):
            options = {
                "name": f"{prefix}:{job.role}:{index}",
                "num_cpus": float(spec.cpu),
                "max_concurrency": ACTOR_MAX_CONCURRENCY,
                "max_restarts": 0,
                "placement_group_bundle_index": index if strategy == "shared" else 0,
                **detached_options(self.outlive),
                **accelerator_options(kind, per_node(spec, k).gpu),
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
        k = self.nodes_per_worker(request.job)
        if k > 1:  # the share of one node; the worker on bundle 0, members on the others
            tasks = tuple(per_node(t, k) for t in request.job.tasks)
            request = dataclasses.replace(
                request, job=dataclasses.replace(request.job, tasks=tasks)
            )
        job = request.job
        record = _Role(strategy=job.tasks[0].ray_placement_strategy)
        with self._lock:
            self._roles[job.role] = record
        kind, bundles, (record.pgs, record.bundles, places) = self._new_groups(request, record, k=k)
        if record.strategy != "deferred" or k > 1:
            self._wait_groups(job, record, bundles)
        self._start_mains(request, record, places[::k], kind)
        if k > 1:
            self._start_members(request, places, kind, k)

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
            self._raylets_lost(live)
            live = [r for r in live if r.exit is None]
        if live and ray.is_initialized():
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
        for index, exit_ in self._member_deaths(role).items():
            dead.setdefault(index, exit_)
        if self.requeue:
            dead.update(self._node_loss.still_lost(ray, role))
        return dead

    def _node_watch(self) -> NodeWatch:
        if self._nodes is None:
            self._nodes = NodeWatch(self.ray)
        return self._nodes

    def _raylets_lost(self, live: list[_Replica]) -> None:
        """Warn replicas on draining nodes; end those whose raylet died (with
        ``requeue=True`` that is a lost node: preempted, brought back)."""
        for i, exit_ in self._node_watch().check(live).items():
            r = live[i]
            exit_.preempted = self.requeue
            exit_.reason += NODE_LOST if self.requeue else ""
            with self._lock:
                first, r.exit = r.exit is None, r.exit or exit_
            if first and exit_.preempted and r.parent is None:
                self._bring_back(r)

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

    @opts.config_first
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
        super().__init__(  # it closes the launcher if it cannot start
            exp_config,
            launcher=RayLauncher(options, dry_run=dry_run, requeue=requeue),
            startup_timeout=startup_timeout,
            n_gpus_per_node=n_gpus_per_node,
            dry_run=dry_run,
            **kwargs,
        )
        self.launcher.startup_timeout = self.startup_timeout
        self.launcher.n_gpus_per_node = self.n_gpus_per_node


__all__ = [
    "RayLauncher",
    "RayScheduler",
    "QUIET_ENV",
    "apply_quiet_env",
    "format_resources",
    "name_prefix",
]
