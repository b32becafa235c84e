"""Jitted sampling: KV cache, prefill/decode, K branches from one prefix, exact token selection."""
from atgrpo_jax.sampling.cache import init_cache, shard_model
from atgrpo_jax.sampling.decode import (Decoded, DecodeSettings, Prefilled, Rows, SamplingParams, prefill_jit,
                                        sampling_params, segment_jit, start_jit)
from atgrpo_jax.sampling.generate import DEFAULT_BUCKETS, Generation, GenerateSettings, generate, row_keys_for
from atgrpo_jax.sampling.sample import Selection, greedy, select
from atgrpo_jax.sampling.segments import Decoding, run

__all__ = [
    "DEFAULT_BUCKETS", "DecodeSettings", "Decoded", "GenerateSettings", "Generation", "Prefilled", "Rows", "Decoding", "SamplingParams",
    "Selection", "generate", "greedy", "init_cache", "prefill_jit", "row_keys_for", "run", "sampling_params",
    "segment_jit", "select", "shard_model", "start_jit",
]
