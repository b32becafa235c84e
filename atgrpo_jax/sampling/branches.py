"""Decode steps for K branches that share one prompt's cache.

The prompt's keys and values stay as prefill wrote them, one row per prompt
([layers, B, kv_heads, P, head_dim]); each branch row only owns the slots of
its new tokens ([layers, B*K, kv_heads, max_new, head_dim]). A query of
branch k of prompt b attends to prompt b's slots and to its own new slots:
one softmax over both (`strategies.shared_prefix`, run by the model's one
forward pass). So nothing is copied K times, and each decode step reads a
prompt's keys once for all of its branches.
"""
from __future__ import annotations

from atgrpo_jax.models.qwen3 import KVCache, Qwen3, decodes_per_layer
from atgrpo_jax.models.strategies import shared_prefix
from atgrpo_jax.sampling.cache import constrain_cache


def init_branch_cache(model: Qwen3, rows: int, slots: int, dtype=None) -> KVCache:
    """Empty per-branch slots, in the layout the decode step reads; `valid` is unused (every
    written slot is a real token)."""
    cache = KVCache.init(model.cfg, rows, slots, dtype)
    return constrain_cache(cache.per_layer() if decodes_per_layer(model.cfg) else cache)


def branch_step(model: Qwen3, tokens, positions, prefix: KVCache, own: KVCache, branches: int, own_allowed=None,
                layers=None):
    """Run one new token per row: tokens, positions [N]; writes slot own.index of every row.
    own_allowed [N, 1, slots]: the own slots each row attends to (default: slots <= own.index).
    layers: per-layer weights (`Qwen3.layer_weights`), with per-layer caches; None: the stacked ones.

    Returns final-normed hidden states [N, D] and the updated per-branch cache.
    """
    h, own = model.hidden_states(tokens[:, None], positions[:, None],
                                 shared_prefix(prefix, own, branches, own_allowed), layers)
    return h[:, 0], constrain_cache(own)
