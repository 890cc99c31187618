"""RayScheduler: the shared Scheduler with a RayLauncher, built from AReaL's signature
and the Ray options (``RayOptions``: keywords, else ``cfg.scheduler.ray``)."""

from __future__ import annotations

from typing import Any

from corral import scheduler_keywords as opts
from corral.backends.backend_options import RayOptions
from corral.backends.ray.launcher import RayLauncher
from corral.controller.scheduler import Scheduler


class RayScheduler(Scheduler):
    """Workers are Ray actors on a Ray cluster, one placement group bundle per worker.

    Joins the runtime this process already has (``ray.init()`` called before), else the
    cluster at ``address`` / ``cfg.scheduler.ray.address`` / ``RAY_ADDRESS`` / the one
    running on this machine, else starts a local runtime (no dashboard, object store
    capped at 512 MiB; ``init_kwargs`` go to ``ray.init``) that ``close()`` shuts down.
    A runtime it did not start is never shut down. The placement strategies and forking:
    the docstring of the package corral.backends.ray.
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
        (corral.backends.ray.node_loss; ``wait_role``). AReaL's signature (``startup_timeout``, then ``exp_config`` and
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
