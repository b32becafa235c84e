"""Jitted sampling: KV cache, prefill/decode, K branches from one prefix, exact token selection."""
from atgrpo_jax.sampling.cache import init_cache, shard_model
from atgrpo_jax.sampling.decode import (Decoded, DecodeSettings, Prefilled, SamplingParams, decode_jit,
                                        prefill_jit, run, sampling_params)
from atgrpo_jax.sampling.generate import DEFAULT_BUCKETS, Generation, generate, row_keys_for
from atgrpo_jax.sampling.sample import Selection, greedy, select

__all__ = [
    "DEFAULT_BUCKETS", "DecodeSettings", "Decoded", "Generation", "Prefilled", "SamplingParams", "Selection",
    "decode_jit", "generate", "greedy", "init_cache", "prefill_jit", "row_keys_for",
    "run", "sampling_params", "select", "shard_model",
]
