"""Forking on Ray: a child actor in its target's placement group bundle, seeing the
target's devices, and stopping it again."""

from __future__ import annotations

from collections.abc import Callable

from corral.backends.ray_start import FORK_ACCELERATOR_SHARE, _Replica, _Role
from corral.backends.ray_support import _death_reason, name_prefix
from corral.errors import WorkerCreationError
from corral.launcher import ForkRequest
from corral.spec import Worker
from corral.worker import env as E


class RayForks:
    """Mixin of RayLauncher: ``fork`` and ``stop_fork`` (children live in ``self._forks``)."""

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
