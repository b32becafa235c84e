"""How a layer's attention sees its keys: one strategy per kind of forward pass.

`Qwen3.hidden_states(tokens, positions, attention)` runs the layer stack once for every
kind of call; the strategy says where the keys come from and where new ones go:

- `causal(valid)`: one sequence per row, no cache (the update's one-sample rows, scoring);
- `packed(segments)`: a shared prompt then several responses to it per row (the update);
- `cached(cache, valid)`: write the T new keys into a KV cache and attend to all of it
  (prefill, and step-by-step decoding);
- `shared_prefix(prefix, own, branches, own_allowed)`: K branch rows read their prompt's
  keys in place and write only their own new slots (the sampler's decode step).

A strategy is closed over by the layer scan: `init()` is its part of the
scan carry (the cache buffers it writes, or None), `attend(cfg, layer, q, k, v, carry)`
returns the attention output and the new carry, and `finish(carry, t)` what
`hidden_states` returns beside the hidden states (the updated cache, or None). Strategies
without a cache may be rematerialized in the backward pass (`remat`); cached ones are
never differentiated.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from atgrpo_jax.models.attention import Mask, attention, shared_prefix_attention
from atgrpo_jax.models.model_config import Qwen3Config
from atgrpo_jax.models.decode_kernel import kernel_shared_prefix_attention, supported as kernel_takes


class KVCache(NamedTuple):
    """Keys and values of every layer; slot `index` is the next to be written.

    All rows write the same slot (prompts are left-padded to one length), and
    `valid` marks the slots that hold real tokens rather than padding. Heads
    come before slots: decode attention then reads each head's keys as one
    contiguous [cache_seq, head_dim] block (decode attention ~2x faster on CPU).

    Two layouts of k and v: stacked, one [layers, ...] array (what a loop over the
    layers indexes, and what prefill writes); or per layer, a tuple of [batch, ...] arrays
    (`per_layer`), what the unrolled decode step reads: a layer sliced out of the stack
    inside the step is a copy of it at every step (docs/sampler_performance.md).
    """

    k: jax.Array | tuple[jax.Array, ...]  # [layers, batch, kv_heads, cache_seq, head_dim], or per layer
    v: jax.Array | tuple[jax.Array, ...]
    valid: jax.Array  # [batch, cache_seq] bool
    index: jax.Array  # int32 scalar

    AXES = ("layers", "batch", "kv_heads", "cache_seq", "head_dim")

    @staticmethod
    def shape(cfg: Qwen3Config, batch: int, length: int) -> tuple[int, ...]:
        """Shape of k and v, in the order of AXES."""
        return (cfg.num_layers, batch, cfg.num_kv_heads, length, cfg.head_dim)

    @classmethod
    def init(cls, cfg: Qwen3Config, batch: int, length: int, dtype=None) -> "KVCache":
        shape = cls.shape(cfg, batch, length)
        dtype = dtype or cfg.dtype
        # two buffers, not one shared: a shared buffer cannot be donated twice
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch, length), bool),
                   jnp.zeros((), jnp.int32))

    @property
    def layered(self) -> bool:
        """k and v are one array per layer."""
        return isinstance(self.k, tuple)

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    @property
    def dtype(self):
        return (self.k[0] if self.layered else self.k).dtype

    def per_layer(self) -> "KVCache":
        """The same cache with one array per layer (a copy of each layer, once)."""
        return self if self.layered else self._replace(k=tuple(self.k), v=tuple(self.v))

    def take_rows(self, index) -> "KVCache":
        """Rows `index` (batch entries) of k, v and valid, in either layout."""
        axis = 0 if self.layered else 1
        take = lambda x: jnp.take(x, index, axis=axis)  # noqa: E731
        return KVCache(jax.tree.map(take, self.k), jax.tree.map(take, self.v), jnp.take(self.valid, index, axis=0),
                       self.index)

    def grow(self, slots: int) -> "KVCache":
        """The same cache with `slots` slots, the new ones empty (a copy of the old, once)."""
        more = slots - self.slots
        pad = lambda x: jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, more), (0, 0)])  # noqa: E731 (the cache_seq axis)
        return KVCache(jax.tree.map(pad, self.k), jax.tree.map(pad, self.v), jnp.pad(self.valid, ((0, 0), (0, more))),
                       self.index)

    def where_rows(self, rows, other: "KVCache") -> "KVCache":
        """`other`'s rows where rows [batch] is True, else this cache's (same layout and shapes)."""
        axis = 0 if self.layered else 1
        pick = lambda mine, theirs: select_rows(rows, theirs, mine, axis)  # noqa: E731
        return KVCache(jax.tree.map(pick, self.k, other.k), jax.tree.map(pick, self.v, other.v),
                       select_rows(rows, other.valid, self.valid), self.index)


def select_rows(rows, new, old, axis: int = 0):
    """`new` where rows (a bool vector along `axis`) is True, else `old`."""
    return jnp.where(rows.reshape((1,) * axis + (-1,) + (1,) * (old.ndim - axis - 1)), new, old)


def _write(carry, layer, slot, k, v):
    """Store k, v [B, T, KV, D] at `slot` of `layer` in the cache buffers (k, v in either layout;
    per layer, `layer` is a Python int)."""
    ks, vs = carry
    if isinstance(ks, tuple):
        def put(bufs, x):
            x = jnp.swapaxes(x, 1, 2).astype(bufs[layer].dtype)
            return (*bufs[:layer], jax.lax.dynamic_update_slice(bufs[layer], x, (0, 0, slot, 0)), *bufs[layer + 1:])
        return put(ks, k), put(vs, v)
    k, v = (jnp.swapaxes(x, 1, 2)[None].astype(ks.dtype) for x in (k, v))
    return (jax.lax.dynamic_update_slice(ks, k, (layer, 0, 0, slot, 0)),
            jax.lax.dynamic_update_slice(vs, v, (layer, 0, 0, slot, 0)))


class NoCache(NamedTuple):
    """Attention among the row's own tokens, as the mask allows."""

    mask: Mask
    remat = True

    def init(self):
        return None

    def attend(self, cfg: Qwen3Config, layer, q, k, v, carry):
        return attention(q, k, v, self.mask, cfg.attention, block=cfg.attention_block), carry

    def finish(self, carry, t):
        return None


def causal(valid) -> NoCache:
    """valid [B, T] bool marks real tokens (left padding is masked as a key)."""
    return NoCache(Mask.causal(jnp.arange(valid.shape[1]), valid.astype(bool)))


def packed(segments) -> NoCache:
    """segments [B, T] int: one prompt (0) and responses to it (1, 2, ...); see `Mask.packed`."""
    return NoCache(Mask.packed(segments))


class Cached(NamedTuple):
    """The T new tokens go to slots index..index+T-1 of the cache and see every valid slot before them."""

    cache: KVCache
    mask: Mask  # over the cache's slots, the new ones included
    valid: jax.Array  # [B, S]: the cache's valid slots after the write
    remat = False

    def init(self):
        return self.cache.k, self.cache.v

    def attend(self, cfg: Qwen3Config, layer, q, k, v, carry):
        ks, vs = carry = _write(carry, layer, self.cache.index, k, v)
        return attention(q, ks[layer].astype(cfg.dtype), vs[layer].astype(cfg.dtype), self.mask, cfg.attention,
                         heads_first=True, cached=True, block=cfg.attention_block), carry

    def finish(self, carry, t):
        return KVCache(*carry, self.valid, self.cache.index + t)


def cached(cache: KVCache, valid) -> Cached:
    """valid [B, T] bool marks which of the T new tokens are real."""
    start, t = cache.index, valid.shape[1]
    valid = jax.lax.dynamic_update_slice(cache.valid, valid.astype(bool), (0, start))
    return Cached(cache, Mask.causal(start + jnp.arange(t), valid), valid)


class SharedPrefix(NamedTuple):
    """One new token per row for N = B*K branch rows (prompt-major): each reads its prompt's
    keys in `prefix` ([layers, B, ...] or per layer, as prefill wrote them) in place, and writes and
    reads its own slots in `own` ([layers, N, ...] or per layer, slot own.index is written).
    With cfg.decode_attention "pallas", the attention is `decode_kernel.py`'s where it takes the
    shapes (head_dim a power of two, both caches' slots multiples of 16), else the einsums."""

    prefix: KVCache
    own: KVCache
    own_allowed: jax.Array  # [N, 1, slots] bool: the own slots each row attends to
    branches: int
    remat = False

    def init(self):
        return self.own.k, self.own.v

    def attend(self, cfg: Qwen3Config, layer, q, k, v, carry):
        ks, vs = carry = _write(carry, layer, self.own.index, k, v)
        dt, p = cfg.dtype, self.prefix
        args = (q, p.k[layer].astype(dt), p.v[layer].astype(dt), p.valid, ks[layer].astype(dt), vs[layer].astype(dt),
                self.own_allowed)
        if cfg.decode_attention == "pallas" and q.shape[1] == 1 and kernel_takes(cfg.head_dim, p.slots, self.own.slots):
            return kernel_shared_prefix_attention(*args, self.branches), carry
        return shared_prefix_attention(*args, self.branches), carry

    def finish(self, carry, t):
        return self.own._replace(k=carry[0], v=carry[1], index=self.own.index + t)


def shared_prefix(prefix: KVCache, own: KVCache, branches: int, own_allowed=None) -> SharedPrefix:
    """own_allowed [N, 1, slots] (default: the slots up to and including own.index)."""
    if own_allowed is None:
        rows, slots = own.valid.shape
        own_allowed = jnp.broadcast_to(jnp.arange(slots) <= own.index, (rows, 1, slots))
    return SharedPrefix(prefix, own, own_allowed, branches)

