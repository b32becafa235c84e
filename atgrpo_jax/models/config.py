"""Qwen3 architecture config and presets.

Sizes of the released models are those of their published `config.json`
(Qwen/Qwen3-*); all share vocab 151,936 embedding rows (the tokenizer has
151,669 tokens), RoPE theta 1e6, RMSNorm eps 1e-6, SwiGLU, q/k norms.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 40_960
    param_dtype: str = "float32"  # storage of weights
    compute_dtype: str = "float32"  # matmul inputs and activations
    remat: bool = False  # recompute each layer in the backward pass
    lora_rank: int = 0  # > 0 adds low-rank adapters to every projection
    lora_alpha: float = 32.0

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"Qwen3Config.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"Qwen3Config.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Config.head_dim must be even for RoPE, got {self.head_dim}")
        for name in ("param_dtype", "compute_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"Qwen3Config.{name} must be one of {sorted(DTYPES)}, "
                                 f"got {getattr(self, name)!r}")

    @property
    def dtype(self):
        return DTYPES[self.compute_dtype]

    @property
    def weight_dtype(self):
        return DTYPES[self.param_dtype]

    def replace(self, **kw) -> "Qwen3Config":
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        d, f, l = self.hidden_size, self.intermediate_size, self.num_layers
        attn = d * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        per_layer = attn + 3 * d * f + 2 * d + 2 * self.head_dim
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.vocab_size * d + l * per_layer + d + head


_QWEN_VOCAB = 151_936

PRESETS: dict[str, Qwen3Config] = {
    "qwen3-0.6b": Qwen3Config(_QWEN_VOCAB, 1024, 3072, 28, 16, 8, 128, tie_word_embeddings=True),
    "qwen3-1.7b": Qwen3Config(_QWEN_VOCAB, 2048, 6144, 28, 16, 8, 128, tie_word_embeddings=True),
    "qwen3-4b": Qwen3Config(_QWEN_VOCAB, 2560, 9728, 36, 32, 8, 128, tie_word_embeddings=True),
    "qwen3-8b": Qwen3Config(_QWEN_VOCAB, 4096, 12288, 36, 32, 8, 128),
    "qwen3-14b": Qwen3Config(_QWEN_VOCAB, 5120, 17408, 40, 40, 8, 128),
    "qwen3-32b": Qwen3Config(_QWEN_VOCAB, 5120, 25600, 64, 64, 8, 128),
    # Benchmark configs (DESIGN.md): a small one and a Qwen3-like one (102M).
    "bench-small": Qwen3Config(8192, 256, 768, 4, 4, 2, 64),
    "bench-qwen-like": Qwen3Config(151_669, 512, 1536, 8, 8, 2, 64),
    # From-scratch CPU demo with the character tokenizer (vocab padded to 128).
    "demo-tiny": Qwen3Config(128, 128, 384, 2, 4, 2, 32, tie_word_embeddings=True,
                             max_position_embeddings=1024),
    # Tests: head_dim != hidden/heads on purpose.
    "test-tiny": Qwen3Config(512, 64, 128, 2, 4, 2, 24, max_position_embeddings=256),
}


def get_preset(name: str, **overrides) -> Qwen3Config:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
