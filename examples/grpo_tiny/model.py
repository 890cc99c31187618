"""The policy: a decoder-only transformer from a Hugging Face ``transformers`` config.

Random init from a seed (nothing is downloaded); the size is a name from ``SIZES``.
"""

from __future__ import annotations

from corral import ConfigError
from examples.grpo_tiny.task import DigitTokenizer

# name: (hidden size, layers, attention heads); parameters are printed by the example
SIZES = {
    "tiny": (32, 2, 2),  # ~30 K, for tests
    "10m": (384, 6, 6),  # ~10.6 M
    "25m": (512, 8, 8),  # ~25 M
    "50m": (640, 10, 10),  # ~49 M
}


def check_size(size: str) -> str:
    if size not in SIZES:
        raise ConfigError("model.size", size, f"use one of {', '.join(SIZES)}")
    return size


def build_model(size: str, seed: int = 0, max_positions: int = 64):
    """A randomly initialised Llama-style causal LM of ``size``, on the CPU, in fp32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads = SIZES[check_size(size)]
    tok = DigitTokenizer()
    config = LlamaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=hidden,
        intermediate_size=(8 * hidden // 3 + 63) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())
