"""GRPO's pieces on the trainer side: token log-probabilities and the clipped loss.

No critic: the advantage of a completion is its reward normalised within the group of
completions of the same prompt (``task.group_advantages``), the same for all its tokens.
"""

from __future__ import annotations

import torch


def completion_mask(completions: torch.Tensor, eos: int) -> torch.Tensor:
    """1.0 for each completion token up to and including its first ``eos``, else 0.0."""
    is_eos = (completions == eos).long()
    before = torch.cumsum(is_eos, dim=1) - is_eos  # eos seen strictly before this token
    return (before == 0).float()


def token_logprobs(model, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
    """log p(completion token | everything before it), shape ``[batch, completion length]``."""
    ids = torch.cat([prompts, completions], dim=1)
    logits = model(input_ids=ids).logits[:, prompts.shape[1] - 1 : -1]
    return (
        torch.log_softmax(logits.float(), dim=-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    )


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
) -> tuple[torch.Tensor, float]:
    """The clipped-ratio policy loss averaged over completion tokens, and the clipped fraction.

    ``ratio = exp(logp - old_logp)``; each token's objective is
    ``min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A)`` (PPO's, without a value model).
    """
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)
    objective = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    tokens = mask.sum().clamp(min=1.0)
    loss = -(objective * mask).sum() / tokens
    clipped = (((ratio - 1).abs() > clip).float() * mask).sum() / tokens
    return loss, float(clipped)
