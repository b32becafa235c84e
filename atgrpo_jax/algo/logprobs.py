"""Token log-probs and entropies without the whole [B, T, V] logits tensor.

Rows (tokens) are processed in chunks: each chunk computes its [chunk, V]
float32 logits and reduces them to a log-prob and an entropy per token, so
peak memory is one chunk's logits, not B*T*V*4 bytes (1.2 GB for 8 x 256
tokens at V = 151,669).

Two ways to differentiate through it:
- `token_logprobs` rematerializes each chunk's logits in the backward pass
  (any loss of the log-probs; the head matmul runs three times per chunk);
- `fused_head_loss` takes a loss that is a sum of per-token terms and computes
  that loss's gradients for the hidden states and the head inside the forward
  chunk pass, so the backward pass only scales them (the head matmul runs
  once forward and twice for gradients, with no recompute).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def _chunk_stats(h, w, targets):
    logits = jnp.einsum("nd,dv->nv", h, w, preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    probs = jnp.exp(logits - lse[:, None])
    entropy = lse - (probs * logits).sum(-1)
    return target_logit - lse, entropy


def _to_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """[B, T, ...] -> [num_chunks, chunk, ...], zero-padded at the end."""
    n = x.shape[0] * x.shape[1]
    flat = x.reshape(n, *x.shape[2:])
    pad = (-n) % chunk
    flat = jnp.pad(flat, ((0, pad),) + ((0, 0),) * (flat.ndim - 1))
    return flat.reshape(-1, chunk, *x.shape[2:])


def _from_chunks(x: jax.Array, b: int, t: int) -> jax.Array:
    return x.reshape(-1)[:b * t].reshape(b, t)


def token_logprobs(hidden: jax.Array, head: jax.Array, targets: jax.Array,
                   chunk_size: int = 1024) -> tuple[jax.Array, jax.Array]:
    """log p(targets) and entropy per position.

    hidden [B, T, D] (final-normed), head [D, V], targets [B, T] int.
    Returns two float32 [B, T] arrays.
    """
    b, t, _ = hidden.shape
    chunk = min(chunk_size, b * t)
    w = head.astype(hidden.dtype)

    @jax.checkpoint
    def body(_, xs):
        return None, _chunk_stats(xs[0], w, xs[1])

    _, (logp, ent) = jax.lax.scan(body, None, (_to_chunks(hidden, chunk), _to_chunks(targets, chunk)))
    return _from_chunks(logp, b, t), _from_chunks(ent, b, t)


def fused_head_loss(hidden: jax.Array, head: jax.Array, targets: jax.Array, token_inputs: dict,
                    loss_of_tokens: Callable, chunk_size: int = 1024, head_grad: bool = True):
    """(loss, (logp, entropy)) where loss = sum over tokens of loss_of_tokens.

    loss_of_tokens(logp [c], entropy [c], inputs) -> [c] per-token loss terms,
    given one chunk of every [B, T] array in `token_inputs`; padded rows get
    zeros, so the terms must vanish when their inputs are zero (weight them by
    a per-token weight). The loss is differentiable in `hidden` and, if
    `head_grad`, in `head` (pass False for a frozen head: its [D, V] gradient
    is then never computed); logp and entropy [B, T] are returned for
    diagnostics and are not differentiable.
    """
    b, t, _ = hidden.shape
    chunk = min(chunk_size, b * t)
    hs, ys = _to_chunks(hidden, chunk), _to_chunks(targets, chunk)
    xs = jax.tree.map(lambda x: _to_chunks(x, chunk), token_inputs)

    def forward(hs, w):
        def body(dw, c):
            hc, yc, xc = c
            if head_grad:
                (lp, ent), pull = jax.vjp(lambda h, w: _chunk_stats(h, w, yc), hc, w)
            else:
                (lp, ent), pull_h = jax.vjp(lambda h: _chunk_stats(h, w, yc), hc)
                pull = lambda g: (*pull_h(g), None)
            terms, pull_terms = jax.vjp(lambda lp, ent: loss_of_tokens(lp, ent, xc), lp, ent)
            dh, dwc = pull(pull_terms(jnp.ones_like(terms)))
            return (dw + dwc if head_grad else dw), (terms.sum(), dh, lp, ent)

        dw0 = jnp.zeros(w.shape, jnp.float32) if head_grad else jnp.zeros((), jnp.float32)
        dw, (sums, dh, lp, ent) = jax.lax.scan(body, dw0, (hs, ys, xs))
        return (sums.sum(), (lp, ent)), (dh, dw.astype(w.dtype) if head_grad else None)

    @jax.custom_vjp
    def loss_and_stats(hs, w):
        return forward(hs, w)[0]

    w_shape, w_dtype = head.shape, hidden.dtype

    def backward(grads, g):
        dh, dw = grads
        dw = (g[0] * dw).astype(w_dtype) if head_grad else jnp.zeros(w_shape, w_dtype)
        return (g[0] * dh).astype(hs.dtype), dw

    loss_and_stats.defvjp(forward, backward)
    loss, (lp, ent) = loss_and_stats(hs, head.astype(hidden.dtype))
    stats = tuple(jax.lax.stop_gradient(_from_chunks(x, b, t)) for x in (lp, ent))
    return loss, stats
