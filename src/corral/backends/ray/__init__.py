"""The Ray backend: workers as Ray actors, placed with placement groups.

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

The package is a launcher made of parts that share one ``RayState`` (state.py):
``scheduler`` (RayScheduler), ``launcher`` (RayLauncher: wires the parts, checks,
describes, launches, restarts), ``runtime`` (joining or starting Ray), ``actors`` and
``bundles`` (a worker's actor and what it asks for), ``groups`` (placement groups),
``feasibility``, ``poll`` (deaths), ``teardown`` (stop, close), ``elastic``, ``forks``,
``node_loss`` (preemption), ``adoption`` (workers that outlive the controller),
``leftovers``, ``nodes`` / ``raylet`` / ``drain`` (what the driver learns about nodes),
``worker_actor`` (the code inside the actor) and ``private_api`` (the only use of
Ray's private modules). Nothing is imported here: Ray workers import
``corral.backends.ray.worker_actor`` without the driver side.
"""
