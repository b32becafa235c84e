"""The sft loss and its jitted update: the token-mean negative log-likelihood of the assistant tokens.

A direct loss rather than the policy-gradient update at ratio 1 with unit advantages: that update's
gradient would equal this one only after a second forward pass for the "old" log-probs, and its loss
value would be the surrogate's -1, not the likelihood; this one is one forward and backward pass, and
the `loss` it reports is the NLL itself. It keeps what the train update does for memory and safety: the
LM head's gradient fused into the chunked log-prob pass (algo/logprobs.fused_head_loss) and a step with
a non-finite loss or gradient skipped (train/update.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from atgrpo_jax.algo.logprobs import fused_head_loss, token_logprobs
from atgrpo_jax.train.update import TrainState, apply_if_finite, scoring_states


def sft_loss(model, rows, chunk: int) -> jax.Array:
    """The mean -log p of the scored entries of `rows` (sft.data.Rows, on device) under `model`."""
    w = rows.scored / jnp.maximum(rows.scored.sum(), 1)
    loss, _ = fused_head_loss(scoring_states(model, rows), model.head_weight(), rows.target, {"w": w},
                              lambda lp, ent, x: jnp.where(x["w"] > 0, -x["w"] * lp, 0.0), chunk)
    return loss


def nll_sum(model, rows, chunk: int) -> tuple[jax.Array, jax.Array]:
    """(the sum of -log p over the scored entries, how many there are): held-out batches add up."""
    logp, _ = token_logprobs(scoring_states(model, rows), model.head_weight(), rows.target, chunk)
    return jnp.where(rows.scored, -logp, 0.0).sum(), rows.scored.sum()


def make_sft_fns(graphdef, frozen, tx, chunk: int):
    """(update(state, rows) -> (state, metrics), the state donated; nll(params, rows) -> (sum, count))."""

    def model_of(params):
        return nnx.merge(graphdef, params, frozen)

    @functools.partial(jax.jit, donate_argnums=0)
    def update(state: TrainState, rows):
        loss, grads = jax.value_and_grad(lambda p: sft_loss(model_of(p), rows, chunk))(state.params)
        new_state, grad_norm, ok = apply_if_finite(tx, state, grads, loss)
        return new_state, {"loss": loss, "grad_norm": grad_norm, "skipped": (~ok).astype(jnp.float32)}

    @jax.jit
    def nll(params, rows):
        return nll_sum(model_of(params), rows, chunk)

    return update, nll
