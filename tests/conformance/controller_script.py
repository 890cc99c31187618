"""A controller process for the controller-death and run-identity tests: starts workers,
prints their pids and its run id, then waits to be killed.

argv: backend fileroot experiment trial gpus [lease_timeout [outlive_controller]]"""

from __future__ import annotations

import json
import sys
import time

from corral import BaseExperimentConfig, Job, SchedulingSpec, make_scheduler

backend, fileroot, experiment, trial, gpus = sys.argv[1:6]
lease_timeout = float(sys.argv[6]) if len(sys.argv) > 6 else None
cfg = BaseExperimentConfig(experiment_name=experiment, trial_name=trial)
cfg.scheduler.type = backend
cfg.cluster.fileroot = fileroot
cfg.cluster.n_gpus_per_node = int(gpus)
kwargs = {"gpu_devices": [0, 1]} if backend == "local" else {}
if lease_timeout is not None:
    kwargs["lease_timeout"] = lease_timeout
if len(sys.argv) > 7:
    kwargs["outlive_controller"] = float(sys.argv[7])
sched = make_scheduler(cfg, **kwargs)
sched.create_workers(Job(role="orphan", replicas=2, tasks=[SchedulingSpec(cpu=1)]))
sched.fork_workers("orphan_child", "orphan")
pids = [w.pid for role in ("orphan", "orphan_child") for w in sched.get_workers(role)]
print(json.dumps({"pids": pids, "run_id": sched.run_id}), flush=True)
time.sleep(600)
