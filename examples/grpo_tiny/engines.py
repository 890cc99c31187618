"""The engines of the GRPO job: rollout policy, reward helper, trainer.

Each method returns the seconds of its own compute (``seconds``) so that the controller
can tell the work from corral's share of a step (scheduling, RPC, dispatch, weight sync).
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import torch

from examples.grpo_tiny.grpo import completion_mask, grpo_loss, token_logprobs
from examples.grpo_tiny.model import build_model
from examples.grpo_tiny.task import EOS, PAD, group_advantages, reward


def _threads() -> None:
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))


def flat_params(model) -> torch.Tensor:
    """All parameters in one contiguous fp32 buffer (tied weights once), in module order."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def param_views(model) -> list[torch.Tensor]:
    """The parameters themselves (tied weights once, module order), detached: a broadcast
    reads or fills them in place, in their own dtype."""
    return [p.detach() for p in model.parameters()]


def load_flat(model, flat: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n
    if offset != flat.numel():
        raise ValueError(f"weights of {flat.numel()} values for a model of {offset}")


def digest(model) -> str:
    """sha256 of the parameters' bytes: equal digests mean bit-identical weights."""
    return hashlib.sha256(flat_params(model).numpy().tobytes()).hexdigest()


class Policy:
    """Rollout engine: samples ``group`` completions per prompt with HF ``generate``."""

    def __init__(self, size: str, seed: int = 0, group: int = 8, temperature: float = 1.0):
        _threads()
        self.model = build_model(size, seed).eval()
        self.group = group
        self.temperature = temperature
        self.version = 0
        torch.manual_seed(seed + 1000 * (1 + int(os.environ.get("RANK", "0"))))

    def generate(self, prompts: np.ndarray) -> dict:
        t = time.perf_counter()
        prompts_t = torch.as_tensor(np.asarray(prompts))
        length = prompts_t.shape[1] - 2
        with torch.no_grad():
            out = self.model.generate(
                prompts_t,
                do_sample=True,
                temperature=self.temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=length + 1,
                num_return_sequences=self.group,
            )
        completions = out[:, prompts_t.shape[1] :]
        if completions.shape[1] < length + 1:  # every sequence stopped early
            pad = torch.full((len(out), length + 1 - completions.shape[1]), PAD)
            completions = torch.cat([completions, pad], dim=1)
        return {
            "prompts": prompts_t.repeat_interleave(self.group, dim=0).numpy(),
            "completions": completions.numpy(),
            "version": self.version,
            "seconds": time.perf_counter() - t,
        }

    def load_weights(self, flat: torch.Tensor, version: int) -> float:
        """Fallback sync: the weights arrive as a (fetched) tensor argument."""
        t = time.perf_counter()
        load_flat(self.model, torch.as_tensor(flat))
        self.version = version
        return time.perf_counter() - t

    def receive_weights(self, group: str, version: int) -> float:
        """Weight sync: receive trainer rank 0's weights in the corral process group,
        straight into the parameters (no staging buffer; same host: one copy out of the
        trainer's shared-memory segment)."""
        from corral.groups import process_group

        t = time.perf_counter()
        process_group(group).broadcast(param_views(self.model), src=0)
        self.version = version
        return time.perf_counter() - t

    def weights_digest(self) -> str:
        return digest(self.model)


class Scorer:
    """Reward helper, forked next to a rollout worker: scores its completions."""

    def __init__(self, group: int = 8):
        self.group = group

    def score(self, batches: list[dict]) -> dict:
        """Rewards and group-normalised advantages of rollout batches (one per rank)."""
        t = time.perf_counter()
        prompts = np.concatenate([np.asarray(b["prompts"]) for b in batches])
        completions = np.concatenate([np.asarray(b["completions"]) for b in batches])
        rewards = reward(prompts, completions)
        return {
            "prompts": prompts,
            "completions": completions,
            "rewards": rewards,
            "advantages": group_advantages(rewards, self.group),
            "seconds": np.array([time.perf_counter() - t]),
        }


class Trainer:
    """Trainer engine: the GRPO loss on its shard, gradients averaged over the trainer role
    with ``torch.distributed`` (gloo) DDP, rendezvous from corral's per-role
    ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``."""

    def __init__(
        self, size: str, seed: int = 0, lr: float = 3e-4, clip: float = 0.2, updates: int = 2
    ):
        import torch.distributed as dist

        _threads()
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.model = build_model(size, seed)
        self.dp = self.model
        if self.world > 1:
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world)
            self.dp = torch.nn.parallel.DistributedDataParallel(self.model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.clip = clip
        self.updates = updates
        self.version = 0
        self.placed_in = ""  # the group whose shared memory holds the parameters

    def train(self, batch: dict) -> dict:
        """``updates`` optimizer steps on this rank's shard; returns loss, clip fraction,
        this shard's mean reward and the compute seconds."""
        t = time.perf_counter()
        prompts = torch.as_tensor(np.asarray(batch["prompts"]))
        completions = torch.as_tensor(np.asarray(batch["completions"]))
        adv = torch.as_tensor(np.asarray(batch["advantages"]))
        mask = completion_mask(completions, EOS)
        with torch.no_grad():
            old = token_logprobs(self.model, prompts, completions)
        losses, clipped = [], []
        for idx in np.array_split(np.arange(len(prompts)), self.updates):
            logp = token_logprobs(self.dp, prompts[idx], completions[idx])
            loss, frac = grpo_loss(logp, old[idx], adv[idx], mask[idx], self.clip)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP all-reduces (averages) the gradients over the trainers
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            losses.append(float(loss.detach()))
            clipped.append(frac)
        self.version += 1
        return {
            "loss": np.array([np.mean(losses)]),
            "clipped": np.array([np.mean(clipped)]),
            "seconds": np.array([time.perf_counter() - t]),
        }

    def weights(self) -> torch.Tensor:
        """Fallback sync: the flat weights, for a ref the rollout workers fetch."""
        return flat_params(self.model)

    def send_weights(self, group: str) -> float:
        """Weight sync: trainer rank 0 (group rank 0) broadcasts its weights to the group.
        On the first call the parameters move into the group's shared-memory segment
        (``ProcessGroup.place``; nothing moves where the group is not on one host), so a
        same-host broadcast copies nothing on this side."""
        from corral.groups import process_group

        t = time.perf_counter()
        pg = process_group(group)
        if self.placed_in != group:  # once: the parameters move into the group's segment
            params = list(self.model.parameters())
            for p, view in zip(params, pg.place(param_views(self.model)), strict=True):
                p.data = view
            self.placed_in = group
        pg.broadcast(param_views(self.model), src=0)
        return time.perf_counter() - t

    def weights_digest(self) -> str:
        return digest(self.model)

    def destroy(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
