"""Exact draws from unnormalized weights with two uniforms per row (inverse CDF in two stages).

The vocabulary is cut into blocks; the first uniform picks a block from the
block sums, the second a token inside it: P(token) = s_block / total * w / s_block.
This costs a few passes over the logits instead of one random number per
vocabulary entry (`jax.random.categorical` draws V Gumbels per row, which on
a CPU costs more than the LM head itself).
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp


def divisor_blocks(vocab: int, target: float, lo: int, hi: int, fallback: int) -> tuple[int, int]:
    """(block size, blocks): the divisor of V in [lo, hi] nearest `target` (the smaller on a tie),
    so the logits need no padding; else blocks of `fallback` (the last one overruns V)."""
    for d in sorted(range(max(lo, 1), hi + 1), key=lambda d: abs(d - target)):
        if vocab % d == 0:
            return d, vocab // d
    return fallback, -(-vocab // fallback)


def block_layout(vocab: int) -> tuple[int, int]:
    """(block size, number of blocks) for the two-stage draw; blocks may overrun V.

    A divisor of V near sqrt(V) avoids padding the logits; without one within
    a factor 4 of sqrt(V), blocks of ceil(sqrt(V)) are used (logits padded).
    """
    limit = 4 * (math.isqrt(vocab) + 1)
    return divisor_blocks(vocab, math.sqrt(vocab), -(-vocab // limit), limit, math.isqrt(vocab) + 1)


def top_k_barred(x: jax.Array, k: int):
    """lax.top_k behind optimization barriers: they keep XLA from folding later slices into top_k's
    sort, which defeats the CPU TopK rewrite and turns it into a full sort (100x slower). One barrier
    per output: a barrier over top_k's result tuple crashes XLA's SPMD partitioner on a mesh
    (hlo_casting_utils check failure, seen with an fsdp=8 mesh)."""
    vals, idx = jax.lax.top_k(x, min(k, x.shape[-1]))
    return jax.lax.optimization_barrier(vals), jax.lax.optimization_barrier(idx)


def pick(weights: jax.Array, u: jax.Array) -> jax.Array:
    """Inverse CDF over the last axis: the i with cum[i-1] <= u*total < cum[i].

    weights [N, n] >= 0 with a positive entry in every row; u [N] in [0, 1).
    Never returns a zero-weight index, even if rounding puts u*total past the end.
    """
    cum = jnp.cumsum(weights, axis=-1)
    idx = jnp.sum(cum <= (u * cum[:, -1])[:, None], axis=-1)
    last_positive = weights.shape[-1] - 1 - jnp.argmax((weights > 0)[:, ::-1], axis=-1)
    return jnp.minimum(idx, last_positive).astype(jnp.int32)


def sum_pair(values: jax.Array, counts: jax.Array, axis: int = -1):
    """(sum of float32 `values`, sum of int32 `counts`) along `axis`, in one pass.

    As one two-output reduction, XLA CPU fuses the arrays' producers into it; a
    plain sum of a computed array it hands to YNNPACK after writing that array
    out whole (3x slower on [32, 151669], measured). Two float outputs in one
    reduction were 4x slower again, hence one float and one int.
    """
    axis = axis % values.ndim
    return jax.lax.reduce((values, counts.astype(jnp.int32)), (jnp.float32(0), jnp.int32(0)),
                          lambda a, b: (a[0] + b[0], a[1] + b[1]), (axis,))


def masked_sums(values: jax.Array, mask: jax.Array, axis: int = -1):
    """(sum of `values` where `mask`, count of `mask`) along `axis`, in one pass."""
    return sum_pair(jnp.where(mask, values, 0.0), mask, axis)


def fused_sum(values: jax.Array, axis: int = -1) -> jax.Array:
    """The sum of float32 `values` along `axis` in one fused pass (see `sum_pair`)."""
    total, count = sum_pair(values, values != 0, axis)
    return total + 0.0 * count  # keeps the count alive: alone, the sum would go to YNNPACK again


def blocked(x: jax.Array, fill, layout: tuple[int, int] | None = None) -> jax.Array:
    """x [N, V] -> [N, blocks, size], padded with `fill` where blocks overrun V; layout (size, blocks),
    default `block_layout(V)`."""
    n, v = x.shape
    size, blocks = layout or block_layout(v)
    if size * blocks != v:
        x = jnp.pad(x, ((0, 0), (0, size * blocks - v)), constant_values=fill)
    return x.reshape(n, blocks, size)


def block_sums(xs: tuple, weight: Callable, fills: tuple):
    """(blocked xs, [N, blocks] sums of weight(*xs)); `weight` is elementwise, so XLA fuses it
    into the sums and the [N, V] weights are never stored (see `fused_sum`)."""
    xbs = [blocked(x, fill) for x, fill in zip(xs, fills)]
    return xbs, fused_sum(weight(*xbs), axis=-1)


def draw_in_blocks(xbs: list, weight: Callable, sums: jax.Array, u0: jax.Array, u1: jax.Array):
    """(tokens [N] int32, their weights): u0 picks a block by its sum, u1 a token inside it."""
    block = pick(sums, u0)
    inside = weight(*(jnp.take_along_axis(xb, block[:, None, None], axis=1) for xb in xbs))[:, 0]  # [N, size]
    offset = pick(inside, u1)
    chosen = jnp.take_along_axis(inside, offset[:, None], axis=1)[:, 0]
    return (block * xbs[0].shape[-1] + offset).astype(jnp.int32), chosen


def two_stage(xs: tuple, weight: Callable, u0: jax.Array, u1: jax.Array, fills: tuple):
    """Exact draw with P(i) proportional to weight(*(x[:, i] for x in xs)).

    Returns (tokens [N] int32, their weights, [N] total weights).
    """
    xbs, sums = block_sums(xs, weight, fills)
    return *draw_in_blocks(xbs, weight, sums, u0, u1), jnp.sum(sums, axis=-1)
