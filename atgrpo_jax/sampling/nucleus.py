"""Top-p over a full vocabulary, exact, without sorting it; for most rows at the cost of a softmax.

Tokens are ranked by logit (descending), ties by index (ascending); the
nucleus is the shortest prefix of that ranking whose weight reaches top_p of
the total, as a stable sort and a cumulative sum would give; weights are
w = exp((logit - max) / T).

Each row's head: every token outside the HEAD blocks (of ~48 tokens) with the
highest maxima is at most the next block maximum (`bound`), so every token
above `bound` lies in those blocks. Gathered in index order and put through
top_k (which keeps equal values in position order), the tokens above `bound`
(all HEAD of them unless block maxima tie there) are exactly the first
tokens of the row's ranking, and a nucleus that ends on one of them is exact.
This costs two passes over the logits (block maxima, the sum of w), as a
softmax does, and top_k over HEAD block maxima and HEAD * 48 logits.

Rows whose nucleus runs past their head (flat rows) go to the threshold
search of top_p_search.py, a few passes more; when at most half the rows do, just
those are gathered and searched, max(4, N // CHUNKS) rows at a time.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from atgrpo_jax.sampling.draw import blocked, divisor_blocks, fused_sum, pick, top_k_barred
from atgrpo_jax.sampling.top_p_search import Nucleus, by_threshold, from_key, gather_layout, search_nucleus, to_key, weights

CHUNKS = 16  # rows the head leaves are searched max(4, N // CHUNKS) at a time
HEAD = 64  # blocks gathered and tokens sorted per row: nuclei of up to HEAD tokens end in the head


class Head(NamedTuple):
    logit: jax.Array  # [N, c] float32, descending, ties by index
    index: jax.Array  # [N, c] int32
    sure: jax.Array  # [N, c] bool: above `bound`, so the token stands where it does in the whole row's ranking
    max: jax.Array  # [N] float32: each row's largest logit


def head_layout(vocab: int, b: int = HEAD) -> tuple[int, int]:
    """(block size, blocks): ~48 tokens a block, a divisor of V if one is near (else padded), or one
    block when V is small."""
    return (vocab, 1) if vocab <= 4 * b else divisor_blocks(vocab, 48, 24, 96, 48)


def row_head(logits: jax.Array, b: int = HEAD) -> Head:
    """The first min(b, V) tokens of each row of logits [N, V] in rank order, and which are sure."""
    n, vocab = logits.shape
    size, blocks = head_layout(vocab, b)
    xb = blocked(logits, -jnp.inf, (size, blocks))
    k = min(b, blocks)
    # the barriers keep XLA from folding the slices below into top_k (then a full sort on CPU, 30x slower)
    top, block = top_k_barred(jnp.max(xb, axis=-1), min(k + 1, blocks))
    bound = from_key(to_key(top[:, k])) if blocks > k else jnp.full((n,), -jnp.inf)
    block = jnp.sort(block[:, :k], axis=1)  # index order, so positions below follow indices
    cand = jnp.take_along_axis(xb, block[:, :, None], axis=1).reshape(n, k * size)
    pos = (block[:, :, None] * size + jnp.arange(size)).reshape(n, k * size)
    # keys make -0.0, +0.0 and denormals one value, as the search's thresholds do
    cand = jnp.where(pos < vocab, from_key(to_key(cand)), -jnp.inf)
    logit, j = top_k_barred(cand, min(b, k * size))
    index = jnp.take_along_axis(pos, j, axis=1).astype(jnp.int32)
    return Head(logit, index, logit > bound[:, None], top[:, 0])


def _with_nucleus(logits, inv_t, top_p, cap: int, use_head: Callable, use_search: Callable, extra=None):
    """Per-row outputs from each row's nucleus: use_head(head, kept weights [N, c], extra) where the head
    holds it, else use_search(logits, m, inv_t, nucleus, extra) (top_p_search.py). extra: per-row arrays."""
    n, vocab = logits.shape
    inv = jnp.broadcast_to(jnp.asarray(inv_t, jnp.float32), (n,))
    head = row_head(logits)
    m = head.max  # from top_k: after a max reduction, XLA would fuse this pass into a slower kernel
    total = fused_sum(weights(logits, m, inv))
    need = top_p * total
    w_head = weights(head.logit, m, inv)
    reached = jnp.cumsum(w_head, axis=1)
    kept_w = jnp.where(reached - w_head < need[:, None], w_head, 0.0)
    at_head = jnp.any(head.sure & (reached >= need[:, None]), axis=1)  # the cut is on a sure token

    def heads():
        return use_head(head, kept_w, extra)

    def searched(rows=None):
        take = (lambda a: a) if rows is None else (lambda a: a[rows])
        p = top_p if isinstance(top_p, float) else take(jnp.broadcast_to(top_p, (n,)))
        sub = [take(a) for a in (logits, m, inv, total)]
        nucleus = search_nucleus(*sub, p, cap)
        return use_search(*sub[:3], nucleus, jax.tree.map(take, extra))

    chunk = max(4, n // CHUNKS)

    def some_rows():  # search only the rows that need it, `chunk` at a time (the last chunk may hold others)
        order = jnp.argsort(at_head)

        def one_chunk(i, out):
            rows = jax.lax.dynamic_slice(order, (i * chunk,), (chunk,))
            return jax.tree.map(lambda o, sub: o.at[rows].set(sub), out, searched(rows))

        return jax.lax.fori_loop(0, (misses + chunk - 1) // chunk, one_chunk, heads())

    misses = jnp.sum(~at_head)
    if chunk * 2 > n:
        return jax.lax.cond(misses == 0, heads, searched)
    # all rows at once when many need it: one batched search costs less than several chunks
    return jax.lax.switch(jnp.where(misses == 0, 0, jnp.where(misses * 2 <= n, 1, 2)), [heads, some_rows, searched])


def top_p_draw(logits: jax.Array, inv_t, u: jax.Array, top_p: float, cap: int = 256):
    """Exact draw from the top-p nucleus of softmax(logits * inv_t): (tokens [N] int32, log-probs [N]).

    u [N, 2] uniforms in [0, 1). cap (static, >= 1) bounds the tokens the search sorts per row.
    """
    def from_head(head: Head, kept_w, u):
        j = pick(kept_w, u[:, 0])[:, None]
        chosen = jnp.take_along_axis(kept_w, j, axis=1)[:, 0]
        return jnp.take_along_axis(head.index, j, axis=1)[:, 0], jnp.log(chosen) - jnp.log(jnp.sum(kept_w, axis=1))

    def from_search(logits, m, inv_t, nucleus: Nucleus, u):
        n, vocab = logits.shape
        size, _ = gather_layout(vocab)
        by_thresholds, listed = jnp.sum(nucleus.block_mass, axis=1), jnp.sum(nucleus.cand_w, axis=1)
        # one part or the other by mass; u[:, 0], rescaled, then draws inside the part
        share = by_thresholds / (by_thresholds + listed)
        u0 = u[:, 0]
        block = pick(nucleus.block_mass, jnp.where(share > 0, u0 / share, 0.0))
        index = block[:, None] * size + jnp.arange(size)
        x = jnp.take_along_axis(logits, jnp.minimum(index, vocab - 1), axis=1)
        inside = jnp.where(by_threshold(nucleus, to_key(x), index) & (index < vocab), weights(x, m, inv_t), 0.0)
        offset = pick(inside, u[:, 1])[:, None]
        tok1 = jnp.take_along_axis(index, offset, axis=1)[:, 0]
        w1 = jnp.take_along_axis(inside, offset, axis=1)[:, 0]
        j = pick(nucleus.cand_w, jnp.where(share < 1, (u0 - share) / (1 - share), 0.0))[:, None]
        tok2 = jnp.take_along_axis(nucleus.cand_index, j, axis=1)[:, 0]
        w2 = jnp.take_along_axis(nucleus.cand_w, j, axis=1)[:, 0]
        first = u0 < share
        return (jnp.where(first, tok1, tok2).astype(jnp.int32),
                jnp.log(jnp.where(first, w1, w2)) - jnp.log(by_thresholds + listed))

    return _with_nucleus(logits.astype(jnp.float32), inv_t, top_p, cap, from_head, from_search, u)


def nucleus_mask(logits: jax.Array, inv_t, top_p, cap: int = 256) -> jax.Array:
    """[N, V] bool: each row's top-p nucleus of softmax(logits * inv_t); top_p a float or one per
    row in (0, 1) (the trainer scores samples under the distribution they were drawn from)."""
    n, vocab = logits.shape
    rows = jnp.arange(n)[:, None]

    def from_head(head: Head, kept_w, _):
        return jnp.zeros((n, vocab), bool).at[rows, head.index].max(kept_w > 0)

    def from_search(logits, m, inv_t, nucleus: Nucleus, _):
        part = by_threshold(nucleus, to_key(logits), jnp.arange(vocab, dtype=jnp.int32))
        return part.at[jnp.arange(part.shape[0])[:, None], nucleus.cand_index].max(nucleus.cand_kept)

    return _with_nucleus(logits.astype(jnp.float32), inv_t, top_p, cap, from_head, from_search)
