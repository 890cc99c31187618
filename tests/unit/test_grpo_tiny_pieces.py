"""examples/grpo_tiny's pure pieces: the reward, GRPO's advantages and clipped loss, the
tokenizer, the config checks (no process is started)."""

from __future__ import annotations

import numpy as np
import pytest

from corral import ConfigError
from examples.grpo_tiny.config import GRPOTinyConfig, check
from examples.grpo_tiny.task import EOS, PAD, DigitTokenizer, group_advantages, make_prompts, reward

torch = pytest.importorskip("torch")


def completion(digits: str, stop: bool = True, width: int = 4) -> list[int]:
    ids = [DigitTokenizer.vocab.index(c) for c in digits] + ([EOS] if stop else [])
    return (ids + [PAD] * width)[:width]


def test_reward_pays_right_digits_and_stopping():
    prompts = np.array([DigitTokenizer().encode_prompt("123")] * 4)
    got = reward(
        prompts,
        np.array(
            [completion("321"), completion("329"), completion("321", stop=False), completion("3")]
        ),
    )
    assert got.tolist() == pytest.approx([1.0, 0.2 + 0.8 * 2 / 3, 0.8, 0.8 / 3])


def test_group_advantages_are_normalised_within_each_group():
    adv = group_advantages(np.array([0.0, 1.0, 0.5, 0.5]), group=2)
    assert adv[:2] == pytest.approx([-1.0, 1.0], abs=1e-3)
    assert adv[2:] == pytest.approx([0.0, 0.0])  # a group with one reward: no signal


def test_grpo_loss_clips_the_ratio():
    from examples.grpo_tiny.grpo import completion_mask, grpo_loss

    mask = completion_mask(torch.tensor([[5, EOS, PAD]]), EOS)
    assert mask.tolist() == [[1.0, 1.0, 0.0]]
    old = torch.zeros(1, 3)
    adv = torch.tensor([1.0])
    inside, frac = grpo_loss(torch.full((1, 3), 0.1), old, adv, mask, clip=0.2)
    assert inside.item() == pytest.approx(-np.exp(0.1)) and frac == 0.0
    beyond, frac = grpo_loss(torch.full((1, 3), 1.0), old, adv, mask, clip=0.2)
    assert beyond.item() == pytest.approx(-1.2) and frac == 1.0


def test_prompts_and_tokenizer():
    tok = DigitTokenizer()
    p = make_prompts(3, 5, seed=1)
    assert p.shape == (3, 7) and (p[:, 0] == tok.bos_token_id).all()
    assert tok.decode(completion("42")) == "42"


@pytest.mark.parametrize(
    "field,value", [("model.size", "huge"), ("task.group", 1), ("task.prompts", 3)]
)
def test_bad_config_names_the_field(field, value):
    cfg = GRPOTinyConfig()
    section, name = field.split(".")
    setattr(getattr(cfg, section), name, value)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        check(cfg)
