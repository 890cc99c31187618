from corral import SlurmScheduler
from corral import BaseExperimentConfig, SchedulingSpec, SchedulingStrategy

exp_cfg = BaseExperimentConfig(
    experiment_name="demo",
    trial_name="run1",
    cluster=type(
        "C", (), {"n_gpus_per_node": 8, "fileroot": "/tmp/corral_logs", "cluster_name": "mycluster"}
    ),
)

scheduler = SlurmScheduler(exp_config=exp_cfg)

# Primary rollout workers

rollout_job = type(
    "Job",
    (),
    {
        "role": "rollout",
        "replicas": 2,
        "tasks": [SchedulingSpec(cpu=8, gpu=1, mem=32)],
        "scheduling_strategy": SchedulingStrategy(type="separation"),
    },
)()
rollout_ids = scheduler.create_workers(rollout_job)

# Fork proxy workers on the same nodes

proxy_ids = scheduler.fork_workers(role="proxy", target_role="rollout", command=None)

print("Rollout IDs:", rollout_ids)
print("Proxy IDs:", proxy_ids)
