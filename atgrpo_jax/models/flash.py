"""Blockwise attention in plain JAX: O(T) memory forward and backward.

The forward walks key blocks per query block with an online softmax and keeps
only the output and each query's log-sum-exp; the backward recomputes each
block's probabilities from them (the FlashAttention recipe) in two passes, one
for dq (query blocks outer) and one for dk, dv (key blocks outer). Nothing of
size [T, S] is ever built, so an 8k-token update fits where the einsum's
[B, H, T, T] scores do not.

Masked scores are set to the float32 minimum, as the einsum path does. Blocks
whose keys all come after every query of the block (the upper triangle of a
causal mask) are skipped, so a query row that may see no key at all (padding,
whose output nobody reads) averages the values of the blocks it visited
rather than of all of them. Keys added to fill the last block are dropped by a
separate in-range factor.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from atgrpo_jax.models.mask import Mask

MIN = jnp.finfo(jnp.float32).min


def chunked_attention(q, k, v, mask: Mask, block: int = 512):
    """q [B,T,H,D]; k, v [B,S,KV,D]; the same result as the einsum, in O(T + S) memory."""
    b, t, h, d = q.shape
    s, kv = k.shape[1], k.shape[2]
    bq, bk = min(block, t), min(block, s)
    tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
    qg = jnp.pad(q.reshape(b, t, kv, h // kv, d), ((0, 0), (0, tp - t), (0, 0), (0, 0), (0, 0)))
    kp, vp = (jnp.pad(x, ((0, 0), (0, sp - s), (0, 0), (0, 0))) for x in (k, v))
    out = _flash(qg, kp, vp, mask.pad(tp, sp), bq, bk, s)
    return out[:, :t].reshape(b, t, h, d)


def _block_scores(qi, kj, mask, i, j, bq, bk, s):
    """Scaled, masked float32 scores [B,KV,G,bq,bk] of query block i against key block j,
    the mask of that block [B,1,1,bq,bk] and the in-range factor of its keys [bk]."""
    q_idx, k_idx = i * bq + jnp.arange(bq), j * bk + jnp.arange(bk)
    allowed = mask.block(q_idx, k_idx)[:, None, None]
    # operand orders are XLA:CPU's fastest (measured per einsum; see attention.dense_attention)
    sc = jnp.einsum("bskd,bqkgd->bkgqs", kj, qi, preferred_element_type=jnp.float32) * (qi.shape[-1] ** -0.5)
    return jnp.where(allowed, sc, MIN), allowed, (k_idx < s).astype(jnp.float32)


def _tie(x, mask):
    """The mask, made to depend on x. Inside a scan over layers the mask is the same in every
    layer, and JAX would otherwise hoist its blocks out of the loop: all of them at once, the
    [T, S] matrix this module exists to avoid."""
    return jax.lax.optimization_barrier((x, mask))


def _visits(mask, i, j, bq, bk):
    """Whether any query of block i may see a key of block j by position (causality)."""
    return j * bk <= jax.lax.dynamic_slice_in_dim(mask.q_slots, i * bq, bq).max()


def _slice(x, i, size, axis=1):
    return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=axis)


def _forward(q, k, v, mask, bq, bk, s):
    """Output [B,Tp,KV,G,D] and log-sum-exp [B,KV,G,Tp] (float32)."""
    b, tp, kv, g, d = q.shape
    nk = k.shape[1] // bk
    q, mask = _tie(q, mask)

    def q_block(i):
        qi = _slice(q, i, bq)

        def visit(carry, j):
            m, l, acc = carry
            kj, vj = _slice(k, j, bk), _slice(v, j, bk)
            sc, _, in_range = _block_scores(qi, kj, mask, i, j, bq, bk, s)
            m_new = jnp.maximum(m, sc.max(-1))
            p = jnp.exp(sc - m_new[..., None]) * in_range
            corr = jnp.exp(m - m_new)
            pv = jnp.einsum("bkgqs,bskd->bkgqd", p.astype(v.dtype), vj, preferred_element_type=jnp.float32)
            return m_new, l * corr + p.sum(-1), acc * corr[..., None] + pv

        def k_step(carry, j):
            return jax.lax.cond(_visits(mask, i, j, bq, bk), visit, lambda c, j: c, carry, j), None

        init = (jnp.full((b, kv, g, bq), -jnp.inf, jnp.float32), jnp.zeros((b, kv, g, bq), jnp.float32),
                jnp.zeros((b, kv, g, bq, d), jnp.float32))
        (m, l, acc), _ = jax.lax.scan(k_step, init, jnp.arange(nk))
        out = (acc / l[..., None]).astype(q.dtype)  # [B,KV,G,bq,D]
        return jnp.moveaxis(out, 3, 1), m + jnp.log(l)

    outs, lses = jax.lax.map(q_block, jnp.arange(tp // bq))  # [nq, B, bq, KV, G, D], [nq, B, KV, G, bq]
    out = jnp.moveaxis(outs, 0, 1).reshape(b, tp, kv, g, d)
    lse = jnp.moveaxis(lses, 0, 3).reshape(b, kv, g, tp)
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _flash(q, k, v, mask, bq, bk, s):
    return _forward(q, k, v, mask, bq, bk, s)[0]


def _flash_fwd(q, k, v, mask, bq, bk, s):
    out, lse = _forward(q, k, v, mask, bq, bk, s)
    return out, (q, k, v, mask, out, lse)


def _flash_bwd(bq, bk, s, res, dout):
    q, k, v, mask, out, lse = res
    dout, mask = _tie(dout, mask)
    b, tp, kv, g, d = q.shape
    nq, nk = tp // bq, k.shape[1] // bk
    scale = d ** -0.5
    dout32 = dout.astype(jnp.float32)
    delta = jnp.einsum("bqkgd,bqkgd->bkgq", dout32, out.astype(jnp.float32))  # rowsum(dO * O)

    def grads_of_block(i, j):
        """Probabilities and score gradients (masked, scaled) of block (i, j)."""
        qi, kj, vj, doi = _slice(q, i, bq), _slice(k, j, bk), _slice(v, j, bk), _slice(dout32, i, bq)
        sc, allowed, in_range = _block_scores(qi, kj, mask, i, j, bq, bk, s)
        p = jnp.exp(sc - _slice(lse, i, bq, axis=3)[..., None]) * in_range
        dp = jnp.einsum("bskd,bqkgd->bkgqs", vj.astype(jnp.float32), doi)
        ds = jnp.where(allowed, p * (dp - _slice(delta, i, bq, axis=3)[..., None]), 0.0) * scale
        return qi, kj, doi, p, ds

    def dq_block(i):
        def visit(acc, j):
            _, kj, _, _, ds = grads_of_block(i, j)
            return acc + jnp.einsum("bskd,bkgqs->bqkgd", kj.astype(jnp.float32), ds)

        def step(acc, j):
            return jax.lax.cond(_visits(mask, i, j, bq, bk), visit, lambda a, j: a, acc, j), None
        acc, _ = jax.lax.scan(step, jnp.zeros((b, bq, kv, g, d), jnp.float32), jnp.arange(nk))
        return acc

    def dkv_block(j):
        def visit(carry, i):
            dk, dv = carry
            qi, _, doi, p, ds = grads_of_block(i, j)
            dv = dv + jnp.einsum("bkgqs,bqkgd->bskd", p, doi)
            dk = dk + jnp.einsum("bkgqs,bqkgd->bskd", ds, qi.astype(jnp.float32))
            return dk, dv

        def step(carry, i):
            return jax.lax.cond(_visits(mask, i, j, bq, bk), visit, lambda c, i: c, carry, i), None
        zeros = jnp.zeros((b, bk, kv, d), jnp.float32)
        (dk, dv), _ = jax.lax.scan(step, (zeros, zeros), jnp.arange(nq))
        return dk, dv

    dq = jnp.moveaxis(jax.lax.map(dq_block, jnp.arange(nq)), 0, 1).reshape(q.shape)
    dk, dv = jax.lax.map(dkv_block, jnp.arange(nk))
    dk, dv = (jnp.moveaxis(x, 0, 1).reshape(k.shape) for x in (dk, dv))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None  # the mask has no gradient


_flash.defvjp(_flash_fwd, _flash_bwd)
