"""The demo: a small RL-shaped job (rollout, reward helper, trainers) on any backend."""
