"""RayLauncher: the Ray backend's Launcher, wired from parts that share one RayState
(see the package docstring). It checks, describes, launches and restarts; the rest it
hands to its parts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from corral.backends.backend_options import RayOptions
from corral.backends.ray.actors import ACTOR_MAX_CONCURRENCY, ActorStarter
from corral.backends.ray.adoption import RayAdoption
from corral.backends.ray.bundles import (
    accelerator_kind,
    accelerator_options,
    bundle_of,
    detached_options,
    format_resources,
)
from corral.backends.ray.elastic import RayElastic
from corral.backends.ray.feasibility import infeasible, node_totals
from corral.backends.ray.forks import RayForks
from corral.backends.ray.groups import PlacementGroups, group_specs
from corral.backends.ray.leftovers import remove_trial_leftovers
from corral.backends.ray.node_loss import NodeLossRequeue
from corral.backends.ray.nodes import NodeWatch
from corral.backends.ray.poll import ReplicaPoll
from corral.backends.ray.runtime import join_runtime
from corral.backends.ray.state import RayState, RoleRecord, name_prefix
from corral.backends.ray.teardown import RayTeardown
from corral.errors import ConfigError, PlacementError, WorkerCreationError
from corral.launcher import ForkRequest, Launcher, LaunchRequest, WorkerExit, env_lines
from corral.multinode import per_node
from corral.resources import ray_extra_resources, unknown_ray_resources
from corral.spec import NormalizedJob, Worker
from corral.worker import env as E
from corral.worker.args import command_argv


def _in_state(name: str, doc: str) -> Any:
    """A launcher attribute kept in its RayState (the scheduler sets some of them after
    the launcher is made; the parts read them from the state)."""
    return property(
        lambda self: getattr(self.state, name),
        lambda self, value: setattr(self.state, name, value),
        doc=doc,
    )


class RayLauncher(Launcher):
    """Places workers with placement groups and runs each in a ``RayWorkerActor``.

    Made of parts that receive the shared :class:`RayState`: ``actors`` (a worker's
    actor on a bundle), ``groups`` (placement groups, pending reasons), ``polls``
    (deaths), ``teardown`` (stop, close), ``forks`` (fork, stop_fork), and the
    capabilities ``elastic`` (grow, shrink), ``preemption`` (node loss with
    ``requeue=True``) and ``adoption`` (workers that outlive the controller)."""

    name = "ray"
    shares_filesystem = False
    # the connection of a call fan-out, and the gRPC channel Ray opens to the actor's
    # process (measured: tests/conformance/test_fd_budget.py)
    fds_per_worker = 2
    multi_node = True

    startup_timeout = _in_state("startup_timeout", "Seconds to wait for groups and actors.")
    n_gpus_per_node = _in_state("n_gpus_per_node", "Set by RayScheduler (corral.multinode).")
    outlive = _in_state("outlive", "Set by the scheduler (corral.controller.adoption).")
    trial_secret = _in_state("trial_secret", "Set by the scheduler: an actor argument.")
    progress = _in_state("progress", "Progress lines; the Scheduler sets its own.")
    own_cluster = _in_state("own_cluster", "The runtime ends with this process.")
    started_runtime = _in_state("started_runtime", "ray.init was called by this launcher.")

    def __init__(
        self,
        options: RayOptions | None = None,
        *,
        startup_timeout: float = 120.0,
        dry_run: bool = False,
        requeue: bool = False,
    ):
        """``dry_run=True``: Ray is neither imported nor started (``describe`` only).
        ``requeue=True``: node loss is preemption (see corral.backends.ray.node_loss)."""
        options = options or RayOptions()
        self.state = state = RayState(
            ray=None, options=options, requeue=requeue, startup_timeout=float(startup_timeout)
        )
        if not dry_run:
            state.ray, state.started_runtime, state.own_cluster = join_runtime(options)
        self.actors = ActorStarter(state)
        self.groups = PlacementGroups(state)
        nodes = NodeWatch(state.ray)  # drained nodes, dead raylets
        self.node_loss = NodeLossRequeue(state, self.actors)
        self.teardown = RayTeardown(state, self.groups, nodes, self.node_loss)
        self.polls = ReplicaPoll(state, nodes, self.node_loss)
        self.forks = RayForks(state, self.actors, self.teardown)
        self.elastic = RayElastic(state, self.groups, self.actors, self.teardown)
        self.preemption = self.node_loss
        self.adoption = RayAdoption(state)

    @property
    def ray(self) -> Any:
        """The ``ray`` module (None in a dry run)."""
        return self.state.ray

    @property
    def requeue(self) -> bool:
        return self.state.requeue

    def accelerator_kind(self) -> str | None:
        """``GPU`` if the cluster has GPUs, else ``NPU`` if it has NPUs, else None."""
        return accelerator_kind(self.state.ray)

    def check(self, job: NormalizedJob) -> None:
        self.adoption.check_outlive()
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
        ray = self.state.ray
        if ray is None:  # a dry run: no cluster to check against
            return
        kind = self.accelerator_kind()
        for i, spec in enumerate(job.tasks):
            if spec.gpu > 0 and kind is None:
                raise ConfigError(
                    f"job.tasks[{i}].gpu",
                    spec.gpu,
                    "the Ray cluster has no GPU or NPU resource (it has "
                    f"{format_resources(ray.cluster_resources())}); use gpu=0, join a "
                    "cluster with GPUs, or declare them with ray.init(num_gpus=N)",
                )
        k = self.groups.nodes_per_worker(job)
        reserve = self.state.options.reserve_memory
        bundles = [
            bundle_of(per_node(spec, k), kind, reserve) for spec in job.tasks for _ in range(k)
        ]
        if k > len(node_totals(ray)):
            raise PlacementError(
                f"{job.role}: nodes",
                k,
                f"each worker holds {k} whole nodes but the Ray cluster has "
                f"{len(node_totals(ray))} alive; lower gpu or add nodes",
            )
        wanted = {name for spec in job.tasks for name in ray_extra_resources(spec)}
        why = unknown_ray_resources(wanted, ray.cluster_resources()) or infeasible(
            bundles, node_totals(ray), format_resources
        )
        if why:
            raise PlacementError(
                f"{job.role}: placement",
                f"{job.replicas} worker(s)",
                f"it can never be placed: {why} (available now: "
                f"{format_resources(ray.available_resources())}). Lower cpu/gpu or "
                "replicas, or add nodes",
            )

    # ----------------------------------------------------------------- launch
    def describe(self, request: LaunchRequest) -> str:
        """The placement groups and each actor's options (GPU stands for the cluster's
        accelerator, GPU or NPU, which is read from the cluster at launch)."""
        job = request.job
        kind = self.accelerator_kind() if self.state.ray is not None else "GPU"
        prefix = name_prefix(request.envs[0][E.EXPERIMENT], request.envs[0][E.TRIAL])
        strategy = job.tasks[0].ray_placement_strategy
        k = self.groups.nodes_per_worker(job)  # > 1: one STRICT_SPREAD group of k nodes per worker
        reserve = self.state.options.reserve_memory
        bundles = [bundle_of(per_node(spec, k), kind, reserve) for spec in job.tasks]
        where = (
            self.state.options.address or "the runtime of this process, RAY_ADDRESS or a local one"
        )
        lines = [f"# dry run (ray): {job.replicas} {job.role} actor(s) on {where}"]
        if k > 1:
            lines.append(f"# each worker holds {k} nodes: a {job.role}.members actor per node")
        specs = [
            ([b] * k, "STRICT_SPREAD", f"{prefix}:{job.role}:{i}") for i, b in enumerate(bundles)
        ]
        for group, group_strategy, name in (
            specs if k > 1 else group_specs(prefix, job.role, bundles, strategy)
        ):
            lifetime = ", lifetime='detached'" if self.state.outlive else ""
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
                **detached_options(self.state.outlive),
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
        k = self.groups.nodes_per_worker(request.job)
        if k > 1:  # the share of one node; the worker on bundle 0, members on the others
            tasks = tuple(per_node(t, k) for t in request.job.tasks)
            request = dataclasses.replace(
                request, job=dataclasses.replace(request.job, tasks=tasks)
            )
        job = request.job
        record = RoleRecord(strategy=job.tasks[0].ray_placement_strategy)
        with self.state.lock:
            self.state.roles[job.role] = record
        kind, bundles, (record.pgs, record.bundles, places) = self.groups.create(
            request, record, k=k
        )
        if record.strategy != "deferred" or k > 1:
            self.groups.wait_placed(job, record, bundles)
        self.actors.start_mains(request, record, places[::k], kind)
        if k > 1:
            self.actors.start_members(request, places, kind, k)

    def restart(self, role: str, index: int, env: dict[str, str]) -> None:
        """A new actor for replica ``index`` in the old one's placement group bundle."""
        with self.state.lock:
            record = self.state.roles.get(role)
        old = next((r for r in record.replicas if r.index == index), None) if record else None
        if record is None or old is None:
            raise WorkerCreationError(
                f"cannot restart {role}/{index}: the Ray backend has no such worker"
            )
        self.teardown.teardown([old], [])
        new = self.actors.start_main(
            role, index, old.spec, env, old.pg, old.bundle_index, old.kind, old.log_dir
        )
        with self.state.lock:
            record.replicas = [new if r is old else r for r in record.replicas]

    # ------------------------------------------------------- handed to parts
    def poll(self, role: str) -> dict[int, WorkerExit]:
        return self.polls.poll(role)

    def pending_reason(self, role: str) -> str | None:
        return self.groups.pending_reason(role)

    def stop(self, role: str, reverse: bool = False) -> None:
        """Every actor of the role at once (Ray gives no order among them)."""
        self.teardown.stop(role)

    def fork(self, request: ForkRequest) -> Worker:
        return self.forks.fork(request)

    def stop_fork(self, worker: Worker, via_worker: Callable[[], None]) -> None:
        self.forks.stop_fork(worker, via_worker)

    def close(self) -> None:
        self.teardown.close()

    def remove_leftovers(self, experiment: str, trial: str) -> list[str]:
        return remove_trial_leftovers(self.state.ray, name_prefix(experiment, trial))

    def placement(self, role: str, index: int, timeout: float = 30.0) -> dict:
        """Where a worker (launched or forked) runs: node id and ip, placement group id,
        bundle index, pid, visible devices."""
        replica = self.state.find(role, index)
        if replica is None:
            raise KeyError(f"{role}/{index}")
        return dict(self.state.info(replica, timeout))

    # ------------------------------------------------------------- rendezvous
    def rendezvous_master(self, role: str, workers: list[Worker]) -> tuple[str, int] | None:
        replicas = self.state.records(role)
        if not replicas:
            return super().rendezvous_master(role, workers)
        first = min(replicas, key=lambda r: r.index)
        ip, port = self.state.ray.get(first.actor.free_port.remote(), timeout=60)
        return ip, int(port)
