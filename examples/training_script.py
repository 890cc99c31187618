# The specification's "Integrating Schedulers into Training Scripts" example.
# Only the import lines differ from the specification.
import sys

from corral import LocalScheduler, RayScheduler, SlurmScheduler
from corral import load_expr_config
from grpo_config import GRPOConfig


def main():
    # Load experiment configuration

    cfg, _ = load_expr_config(["examples/configs/gsm8k.yaml"] + sys.argv[1:], GRPOConfig)

    # Instantiate appropriate scheduler

    if cfg.scheduler.type == "ray":
        scheduler = RayScheduler(exp_config=cfg)
    elif cfg.scheduler.type == "slurm":
        scheduler = SlurmScheduler(exp_config=cfg)
    else:
        scheduler = LocalScheduler(exp_config=cfg)

    # Create rollout workers

    rollout_ids = scheduler.create_workers(
        job=type(
            "Job",
            (),
            {
                "role": "rollout",
                "replicas": cfg.rollout.n_replicas,
                "tasks": cfg.scheduling_spec,
                "scheduling_strategy": cfg.scheduling_strategy,
            },
        )()
    )

    # Invoke engine method remotely

    result = scheduler.call_engine(
        worker_id=rollout_ids[0],
        method="generate",
        engine_name="my_engine",
        inputs={"prompt": "Explain quantum computing"},
    )
    print(result)

    # Cleanup

    scheduler.delete_workers()


if __name__ == "__main__":
    main()
