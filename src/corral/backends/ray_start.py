"""Starting one worker actor of the Ray backend on a placement group bundle: the
replica records, a bundle's resources and the accelerator share an actor asks for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.backends.ray_support import _actor_class, name_prefix
from corral.errors import WorkerCreationError
from corral.launcher import LaunchRequest, WorkerExit
from corral.multinode import NNODES, NODE_RANK, member_index, member_role
from corral.resources import ray_extra_resources
from corral.worker import env as E

MAIN_SINGLE_GPU_SHARE = 0.9
FORK_ACCELERATOR_SHARE = 0.01
ACTOR_MAX_CONCURRENCY = 8
NAMESPACE = "corral"  # of the detached actors of runs that outlive their controller


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


def detached_options(outlive: float) -> dict:
    """Workers asked to outlive their controller (corral.controller.reattach) are detached actors in
    corral's namespace, so that they survive the driver and a new one finds them by name;
    otherwise (the default) they share the driver's fate."""
    return {"lifetime": "detached", "namespace": NAMESPACE} if outlive else {}


def accelerator_options(kind: str | None, gpu: int) -> dict:
    """The actor's share of its bundle's accelerator: 0.9 of a single GPU (forks fit
    beside it), all of several."""
    if not kind or not gpu:
        return {}
    share = MAIN_SINGLE_GPU_SHARE if gpu == 1 else float(gpu)
    return {"num_gpus": share} if kind == "GPU" else {"resources": {kind: share}}


class ActorStarter:
    """Mixin of RayLauncher: the cluster's accelerator, a worker's bundle and its actor
    (uses ``self.ray``, ``self.reserve_memory``, ``self.trial_secret``)."""

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
        bundle.update(ray_extra_resources(spec))  # custom resources, accelerator type
        return bundle or {"CPU": 0.001}

    def _start_mains(
        self, request: LaunchRequest, record: _Role, places: list, kind: str | None, first: int = 0
    ) -> None:
        """The actors of replicas ``first``.. of ``request``, each at its place (group,
        bundle index), added to the role's record as they start."""
        job = request.job
        for i, (spec, env) in enumerate(zip(job.tasks, request.envs, strict=True)):
            pg, bundle_index = places[i]
            replica = self._start_main(
                job.role, first + i, spec, env, pg, bundle_index, kind, request.log_dir
            )
            with self._lock:
                record.replicas.append(replica)

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
                options=accelerator_options(kind, spec.gpu),
                spec=spec,
                kind=kind if spec.gpu else None,
                log_dir=log_dir,
            )
        except Exception as exc:
            raise WorkerCreationError(
                f"could not create the Ray actor for {role}/{index}: {exc}"
            ) from exc

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
                **detached_options(self.outlive),
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

    def _start_members(
        self, request: LaunchRequest, places: list, kind: str | None, k: int, first: int = 0
    ) -> None:
        """The member workers of multi-node instances (corral.multinode): one actor on
        each bundle after the first of every instance's group, child records of the
        instance (stopped with it, their deaths reported as its own)."""
        job = request.job
        members = member_role(job.role)
        for i, (spec, env) in enumerate(zip(job.tasks, request.envs, strict=True)):
            for rank in range(1, k):
                pg, bundle_index = places[i * k + rank]
                index = member_index(first + i, rank, k)
                member_env = {**env, E.ROLE: members, E.INDEX: str(index)}
                member_env.update({NNODES: str(k), NODE_RANK: str(rank)})
                replica = self._start_main(
                    members, index, spec, member_env, pg, bundle_index, kind, request.log_dir
                )
                replica.parent = (job.role, first + i)
                with self._lock:
                    self._forks.setdefault(members, _Role(strategy="members")).replicas.append(
                        replica
                    )

    def _member_deaths(self, role: str) -> dict[int, WorkerExit]:
        """Instances of ``role`` with a dead member: the member's node and why."""
        members = member_role(role)
        if members not in self._forks:
            return {}
        dead: dict[int, WorkerExit] = {}
        for index, exit_ in sorted(self.poll(members).items()):
            replica = next(r for r in self._records(members) if r.index == index)
            instance = replica.parent[1]
            try:
                node = self._info(replica, 1.0).get("node_id", "?")
            except Exception:
                node = "?"
            rank = int(replica.env.get(NODE_RANK, "0"))
            dead.setdefault(
                instance,
                WorkerExit(
                    f"member {members}/{index} on node {node} (node rank {rank}) died: "
                    f"{exit_.reason}",
                    exit_.exit_code,
                    exit_.log_path,
                ),
            )
        return dead
