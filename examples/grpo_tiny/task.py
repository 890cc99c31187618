"""The task: reverse a short digit string. Its tokenizer, prompts and verifiable reward.

A prompt is ``<bos> d1 d2 .. dL <sep>``; the right completion is ``dL .. d2 d1 <eos>``.
Every prompt has the same length, so batches need no padding on the prompt side;
completions are padded with ``<pad>`` after their ``<eos>``.

The reward of a completion is in [0, 1]: 0.2 for stopping right after L tokens, plus 0.8
times the fraction of the L positions that hold the right digit. A random policy earns
about 0.1; a perfect one 1.0.
"""

from __future__ import annotations

import numpy as np

SPECIALS = ("<pad>", "<bos>", "<eos>", "<sep>")
PAD, BOS, EOS, SEP = range(len(SPECIALS))
DIGIT0 = len(SPECIALS)


class DigitTokenizer:
    """A character-level tokenizer for digit strings: 4 special tokens, then ``0``..``9``."""

    vocab = list(SPECIALS) + [str(d) for d in range(10)]
    pad_token_id, bos_token_id, eos_token_id, sep_token_id = PAD, BOS, EOS, SEP

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode_prompt(self, digits: str) -> list[int]:
        return [BOS] + [DIGIT0 + int(c) for c in digits] + [SEP]

    def decode(self, ids) -> str:
        """Digits up to the first ``<eos>``; other tokens as ``?``; pads dropped."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i != PAD:
                out.append(self.vocab[i] if i >= DIGIT0 else "?")
        return "".join(out)


def make_prompts(n: int, length: int, seed: int) -> np.ndarray:
    """``n`` prompts of ``length`` random digits, as token ids ``[n, length + 2]``."""
    rng = np.random.default_rng(seed)
    digits = rng.integers(0, 10, size=(n, length))
    ids = np.empty((n, length + 2), dtype=np.int64)
    ids[:, 0] = BOS
    ids[:, 1:-1] = DIGIT0 + digits
    ids[:, -1] = SEP
    return ids


def reward(prompt_ids: np.ndarray, completion_ids: np.ndarray) -> np.ndarray:
    """The reward of each completion (rows of ``completion_ids``) for its prompt row."""
    prompt_ids = np.asarray(prompt_ids)
    completion_ids = np.asarray(completion_ids)
    length = prompt_ids.shape[1] - 2
    target = prompt_ids[:, 1:-1][:, ::-1]
    width = min(length, completion_ids.shape[1])
    got = completion_ids[:, :width]
    # positions after an early <eos> do not count as digits
    before_eos = np.cumsum(got == EOS, axis=1) == 0
    correct = ((got == target[:, :width]) & before_eos).sum(axis=1) / length
    stopped = np.zeros(len(got), dtype=bool)
    if completion_ids.shape[1] > length:
        stopped = (completion_ids[:, length] == EOS) & before_eos.all(axis=1)
    return (0.2 * stopped + 0.8 * correct).astype(np.float32)


def group_advantages(rewards: np.ndarray, group: int, eps: float = 1e-4) -> np.ndarray:
    """GRPO's advantages: each reward minus its group's mean, over the group's std.

    ``rewards`` holds consecutive groups of ``group`` completions of one prompt."""
    r = np.asarray(rewards, dtype=np.float32).reshape(-1, group)
    adv = (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, keepdims=True) + eps)
    return adv.reshape(-1).astype(np.float32)
