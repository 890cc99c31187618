"""Starting worker actors on placement group bundles: a worker's actor (launch,
restart, a lost node's replacement), a fork's actor, and the members of multi-node
instances (corral.multinode)."""

from __future__ import annotations

from typing import Any

from corral.backends.ray.bundles import accelerator_options, detached_options
from corral.backends.ray.state import RayState, Replica, RoleRecord, name_prefix
from corral.errors import WorkerCreationError
from corral.launcher import LaunchRequest
from corral.multinode import NNODES, NODE_RANK, member_index, member_role
from corral.worker import env as E

ACTOR_MAX_CONCURRENCY = 8

_ACTOR_CLASS: list[Any] = []


def actor_class(ray: Any) -> Any:
    """``RayWorkerActor`` as a Ray actor class (made once)."""
    if not _ACTOR_CLASS:
        from corral.backends.ray.worker_actor import RayWorkerActor

        _ACTOR_CLASS.append(ray.remote(RayWorkerActor))
    return _ACTOR_CLASS[0]


class ActorStarter:
    """Starts actors for the launcher's parts; reads the Ray handle, the trial secret and
    ``outlive`` from the state and adds members to its fork table."""

    def __init__(self, state: RayState):
        self.state = state

    def start_mains(
        self,
        request: LaunchRequest,
        record: RoleRecord,
        places: list,
        kind: str | None,
        first: int = 0,
    ) -> None:
        """The actors of replicas ``first``.. of ``request``, each at its place (group,
        bundle index), added to the role's record as they start."""
        job = request.job
        for i, (spec, env) in enumerate(zip(job.tasks, request.envs, strict=True)):
            pg, bundle_index = places[i]
            replica = self.start_main(
                job.role, first + i, spec, env, pg, bundle_index, kind, request.log_dir
            )
            with self.state.lock:
                record.replicas.append(replica)

    def start_main(
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
    ) -> Replica:
        env = dict(env)
        if spec.gpu == 0:
            env.setdefault("CUDA_VISIBLE_DEVICES", "")
        prefix = name_prefix(env[E.EXPERIMENT], env[E.TRIAL])
        try:
            return self.start_actor(
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

    def start_actor(
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
    ) -> Replica:
        ray = self.state.ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor = (
            actor_class(ray)
            .options(
                name=name,
                num_cpus=num_cpus,
                max_concurrency=ACTOR_MAX_CONCURRENCY,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle_index
                ),
                **detached_options(self.state.outlive),
                **options,
            )
            .remote(env, env.get(E.ADVERTISE_HOST), visible_devices, self.state.trial_secret)
        )
        return Replica(
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

    def start_members(
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
                replica = self.start_main(
                    members, index, spec, member_env, pg, bundle_index, kind, request.log_dir
                )
                replica.parent = (job.role, first + i)
                with self.state.lock:
                    self.state.forks.setdefault(
                        members, RoleRecord(strategy="members")
                    ).replicas.append(replica)
