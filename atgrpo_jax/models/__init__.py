"""Qwen3 in Flax NNX, HF checkpoints in and out, tokenizers."""
from atgrpo_jax.models.model_config import PRESETS, Qwen3Config, get_preset
from atgrpo_jax.models.qwen3 import KVCache, Qwen3

__all__ = ["PRESETS", "Qwen3Config", "get_preset", "KVCache", "Qwen3"]
