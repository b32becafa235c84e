"""Token log-probs and entropies without the whole [B, T, V] logits tensor.

Rows (tokens) are processed in chunks: each chunk computes its [chunk, V]
float32 logits, reduces them to a log-prob and an entropy per token, and is
rematerialized in the backward pass, so peak memory is one chunk's logits,
not B*T*V*4 bytes (1.2 GB for 8 x 256 tokens at V = 151,669).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _chunk_stats(h, w, targets):
    logits = jnp.einsum("nd,dv->nv", h, w, preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    probs = jnp.exp(logits - lse[:, None])
    entropy = lse - (probs * logits).sum(-1)
    return target_logit - lse, entropy


def token_logprobs(hidden: jax.Array, head: jax.Array, targets: jax.Array,
                   chunk_size: int = 1024) -> tuple[jax.Array, jax.Array]:
    """log p(targets) and entropy per position.

    hidden [B, T, D] (final-normed), head [D, V], targets [B, T] int.
    Returns two float32 [B, T] arrays.
    """
    b, t, d = hidden.shape
    n = b * t
    chunk = min(chunk_size, n)
    pad = (-n) % chunk
    h = jnp.pad(hidden.reshape(n, d), ((0, pad), (0, 0))).reshape(-1, chunk, d)
    y = jnp.pad(targets.reshape(n), (0, pad)).reshape(-1, chunk)
    w = head.astype(hidden.dtype)

    @jax.checkpoint
    def body(_, xs):
        return None, _chunk_stats(xs[0], w, xs[1])

    _, (logp, ent) = jax.lax.scan(body, None, (h, y))
    return logp.reshape(-1)[:n].reshape(b, t), ent.reshape(-1)[:n].reshape(b, t)
