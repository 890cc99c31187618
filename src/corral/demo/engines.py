"""Engines of the demo job: a bandit policy that generates, a reward model, a learner.

The policy picks one of ``n_arms`` actions from softmax(weights); the reward model pays
each arm's hidden mean plus noise; learners run REINFORCE on their shard of the batch and
average gradients with torch.distributed (gloo) when torch is installed, else return
gradients for the controller to average.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

ARM_MEANS = np.linspace(-1.0, 1.0, 8)


def softmax(w: np.ndarray) -> np.ndarray:
    z = np.exp(w - w.max())
    return z / z.sum()


class Policy:
    """Rollout engine: holds the latest weights and samples actions."""

    def __init__(self, n_arms: int = 8, seed: int = 0):
        self.weights = np.zeros(n_arms)
        self.version = 0
        self.rng = np.random.default_rng(seed + int(os.environ.get("RANK", "0")) * 1000)

    def generate(self, batch: int) -> dict:
        probs = softmax(self.weights)
        actions = self.rng.choice(len(probs), size=batch, p=probs)
        return {"actions": actions.astype(np.int64), "version": self.version}

    def update_weights(self, weights: np.ndarray, version: int) -> int:
        self.weights = np.array(weights, dtype=np.float64)
        self.version = version
        return version


class RewardModel:
    """Helper engine, forked next to each rollout worker: scores actions."""

    def __init__(self, noise: float = 0.3, seed: int = 1):
        self.noise = noise
        self.rng = np.random.default_rng(seed)

    def score(self, actions: np.ndarray) -> np.ndarray:
        means = ARM_MEANS[np.asarray(actions) % len(ARM_MEANS)]
        return (means + self.rng.normal(0.0, self.noise, size=means.shape)).astype(np.float32)


class Learner:
    """Trainer engine: REINFORCE on a shard; gradients all-reduced over the role."""

    def __init__(self, n_arms: int = 8, lr: float = 0.5, use_torch: bool | None = None):
        self.weights = np.zeros(n_arms)
        self.lr = lr
        if use_torch is None:
            use_torch = importlib.util.find_spec("torch") is not None
        self.use_torch = use_torch
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.dist = None
        if use_torch and self.world > 1:
            import torch.distributed as dist

            dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=self.world)
            self.dist = dist

    def backend(self) -> str:
        return "torch.distributed/gloo" if self.dist is not None else "numpy"

    def gradient(self, actions: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        probs = softmax(self.weights)
        advantage = rewards - rewards.mean()
        grad = np.zeros_like(self.weights)
        for a, adv in zip(actions, advantage, strict=True):
            g = -probs.copy()
            g[a] += 1.0
            grad += adv * g
        return grad / max(1, len(actions))

    def train_step(self, actions: np.ndarray, rewards: np.ndarray) -> dict:
        grad = self.gradient(actions, rewards)
        if self.dist is not None:
            import torch

            t = torch.from_numpy(grad)
            self.dist.all_reduce(t)
            grad = t.numpy() / self.world
            self.weights += self.lr * grad
        return {"grad": grad, "weights": self.weights.copy()}

    def apply(self, grad: np.ndarray) -> np.ndarray:
        self.weights += self.lr * np.asarray(grad)
        return self.weights.copy()

    def get_weights(self) -> np.ndarray:
        return self.weights.copy()

    def destroy(self) -> None:
        if self.dist is not None and self.dist.is_initialized():
            self.dist.destroy_process_group()


class ToyGenerator:
    """A stand-in generation engine for examples: answers prompts deterministically."""

    def generate(self, inputs: dict) -> dict:
        prompt = str(inputs.get("prompt", ""))
        words = prompt.split()
        return {"prompt": prompt, "completion": " ".join(reversed(words)), "n_words": len(words)}
