import ray
from corral import RayScheduler
from corral import BaseExperimentConfig, SchedulingSpec, SchedulingStrategy

# Initialise Ray (local mode for testing)

ray.init(ignore_reinit_error=True, num_cpus=8, num_gpus=4)

# Minimal experiment config

exp_cfg = BaseExperimentConfig(
    experiment_name="demo",
    trial_name="run1",
    cluster=type("C", (), {"n_gpus_per_node": 4}),  # dummy cluster object
)

scheduler = RayScheduler(exp_config=exp_cfg)

# Create 2 workers, each with 1 GPU

job = type(
    "Job",
    (),
    {
        "role": "rollout",
        "replicas": 2,
        "tasks": [SchedulingSpec(cpu=4, gpu=1, mem=16, port_count=2)],
        "scheduling_strategy": SchedulingStrategy(type="separation"),
    },
)()
worker_ids = scheduler.create_workers(job)
print("Ray workers:", worker_ids)

# Clean up

scheduler.delete_workers()
ray.shutdown()
