"""Rows for benchmarks and tests: a packed mini-batch as the PyTorch baseline's one-sample rows, and
hand-made rows as the trainer's Packed batch (and its update over them)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from atgrpo_jax.train.batch import Minibatch
from atgrpo_jax.train.update import Packed


def as_rows(mb: Minibatch) -> dict:
    """A mini-batch packed one sample per row (`pack(..., slots=1, share_prompts=False)`) as the
    PyTorch baseline's rows: tokens, valid, is_resp [R, W] and adv [R] (empty rows: all False)."""
    segment = mb.packed.segment
    if (segment > 1).any():
        raise ValueError("as_rows: the mini-batch holds several samples in a row (pack it with slots=1)")
    return dict(tokens=mb.packed.tokens, valid=segment >= 0, is_resp=segment > 0, adv=mb.packed.adv[:, 0])


def rows_packed(tokens, valid, is_resp, old_logp, adv, ref_logp=None) -> Packed:
    """Hand-made rows [N, L] (prompt then response, right-padded; log-probs at column j score token j,
    old_logp None: none yet; adv [N] or [N, L]) as a Packed batch of one sample per row (column j + 1
    scored from column j)."""
    n, l = tokens.shape
    scored_cols = lambda x: None if x is None else x[:, 1:]  # noqa: E731
    adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, (n, l))
    ones = jnp.ones((n, l - 1), jnp.float32)  # sampled at temperature 1, no top-p
    return Packed(tokens, jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0), jnp.where(valid, 0, -1),
                  jnp.broadcast_to(jnp.arange(l - 1, dtype=jnp.int32), (n, l - 1)), tokens[:, 1:],
                  is_resp[:, 1:], jnp.broadcast_to(is_resp.sum(1, keepdims=True), (n, l - 1)),
                  adv[:, 1:], ones, ones, scored_cols(old_logp), scored_cols(ref_logp))


def rows_from_packed(x):
    """[N, L - 1] scored values of `rows_packed` back to [N, L] (column 0 is 0)."""
    return jnp.concatenate([jnp.zeros((x.shape[0], 1), x.dtype), x], axis=1)


def rows_update(update_fn):
    """update_fn over hand-made rows, packed inside the jitted step (tests and benchmarks compile the
    update of rows this way): (state, (tokens, valid, is_resp, old_logp, adv[, ref_logp])) -> (state,
    metrics), the state donated."""
    return jax.jit(lambda state, rows: update_fn(state, rows_packed(*rows)), donate_argnums=0)
