"""The sampler's KV cache (sharded by logical axes) and model placement on a mesh.

The cache is `atgrpo_jax.models.KVCache`: k/v [layers, batch, kv_heads,
cache_seq, head_dim], `valid` [batch, cache_seq], `index` (next slot). Under
`jax.set_mesh`, `constrain_cache` pins it to the rule table (batch over
data+fsdp, kv_heads over tensor, cache_seq replicated); without a mesh it is
a no-op.
"""
from __future__ import annotations

import jax
from flax import nnx

from atgrpo_jax.models.model_config import DTYPES, Qwen3Config
from atgrpo_jax.models.qwen3 import KVCache
from atgrpo_jax.sharding import RULES, constrain, logical_sharding

VALID_AXES = ("batch", "cache_seq")


def constrain_cache(cache: KVCache) -> KVCache:
    axes = KVCache.AXES[1:] if cache.layered else KVCache.AXES  # per layer: no layers axis
    pin = lambda x: constrain(x, axes)  # noqa: E731
    return KVCache(jax.tree.map(pin, cache.k), jax.tree.map(pin, cache.v), constrain(cache.valid, VALID_AXES),
                   cache.index)


def init_cache(cfg: Qwen3Config, batch: int, length: int, dtype: str | None = None) -> KVCache:
    """An empty cache of `length` slots; dtype is a Qwen3Config dtype name (default: compute dtype)."""
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"cache dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return constrain_cache(KVCache.init(cfg, batch, length, DTYPES[dtype] if dtype else None))


def shard_model(model: nnx.Module, mesh: jax.sharding.Mesh, rules: dict = RULES) -> nnx.Module:
    """A copy of the model with every parameter placed on `mesh` by its `logical_axes`
    metadata and `rules` (replicated without it); the given model is left as it was."""
    graphdef, state = nnx.split(model)

    def place(var: nnx.Variable) -> nnx.Variable:
        axes = getattr(var, "logical_axes", None) or (None,) * var.ndim
        return var.replace(jax.device_put(var[...], logical_sharding(mesh, axes, var.shape, rules)))

    state = jax.tree.map(place, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, state)
