"""Forking on Ray: a child actor in its target's placement group bundle, seeing the
target's devices, and stopping it again."""

from __future__ import annotations

from collections.abc import Callable

from corral.backends.ray.actors import ActorStarter
from corral.backends.ray.bundles import FORK_ACCELERATOR_SHARE
from corral.backends.ray.poll import death_reason
from corral.backends.ray.state import RayState, Replica, RoleRecord, name_prefix
from corral.backends.ray.teardown import RayTeardown
from corral.errors import WorkerCreationError
from corral.launcher import ForkRequest
from corral.spec import Worker
from corral.worker import env as E


class RayForks:
    """``fork`` and ``stop_fork`` of the launcher (children live in ``state.forks``)."""

    def __init__(self, state: RayState, actors: ActorStarter, teardown: RayTeardown):
        self.state = state
        self.actors = actors
        self.teardown = teardown

    def fork(self, request: ForkRequest) -> Worker:
        """A new actor in the target's placement group bundle, seeing its devices; a
        ``command`` other than the corral worker is started by the target itself."""
        role, index, target, env = request.role, request.index, request.target, request.env
        state = self.state
        parent = state.find(target.role, target.index)
        if request.command is not None or parent is None:
            return request.via_worker()
        ray, timeout = state.ray, state.startup_timeout
        info = state.info(parent, timeout)
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
            child = self.actors.start_actor(
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
        with state.lock:
            state.forks.setdefault(role, RoleRecord(strategy="fork")).replicas.append(child)
        try:
            child_info = state.info(child, timeout)
        except Exception as exc:
            reason = (
                death_reason(exc)
                if isinstance(exc, ray.exceptions.RayActorError)
                else f"not ready within {timeout:.0f}s ({type(exc).__name__})"
            )
            self.teardown.teardown([child], [])
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

    def _drop_fork(self, child: Replica) -> None:
        with self.state.lock:
            record = self.state.forks.get(child.role)
            if record is not None:
                record.replicas = [r for r in record.replicas if r is not child]
                if not record.replicas:
                    self.state.forks.pop(child.role, None)

    def stop_fork(self, worker: Worker, via_worker: Callable[[], None]) -> None:
        """Stop a forked actor (one its host worker started: through the host)."""
        child = self.state.find(worker.role, worker.index)
        if child is None or child.parent is None:
            via_worker()  # its host worker started it
            return
        self.teardown.teardown([child], [])
        self._drop_fork(child)
