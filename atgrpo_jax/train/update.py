"""One policy's train state and its jitted update.

A policy is a Qwen3 (plus, in the LoRA regime, its adapters); its state is a
plain pytree: trainable params, optimizer state, step. The functions here are
built once per policy (`make_update_fns`) and jitted with donated buffers.

Batch layout (all [N, L], right-padded, one row per sample):
  tokens     prompt then response token ids
  valid      True on real tokens
  is_resp    True on response tokens (the ones trained on)
  old_logp   log-prob of each token under the policy before this update
  adv        [N] advantage of the sample (spread over its response tokens)
Log-probs at column j score token j (column 0 is never a response token).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from atgrpo_jax.algo.logprobs import fused_head_loss, token_logprobs
from atgrpo_jax.algo.loss import LossConfig, aggregation_weights, policy_loss, token_loss_terms


class TrainState(NamedTuple):
    params: Any  # trainable nnx.State
    opt_state: Any
    step: jax.Array  # int32: optimizer steps taken


class Batch(NamedTuple):
    tokens: jax.Array
    valid: jax.Array
    is_resp: jax.Array
    old_logp: jax.Array
    adv: jax.Array
    ref_logp: jax.Array | None = None


def make_optimizer(optim, total_steps: int) -> tuple[optax.GradientTransformation, Callable]:
    """AdamW with global-norm clipping; constant lr (after an optional linear
    warm-up) or warm-up then cosine decay to 10% over `total_steps` optimizer steps."""
    warm = optim.warmup_steps
    if optim.schedule == "constant":
        lr = optax.linear_schedule(0.0, optim.lr, warm) if warm else optax.constant_schedule(optim.lr)
    else:
        lr = optax.warmup_cosine_decay_schedule(0.0, optim.lr, warm, max(total_steps, warm + 1),
                                                end_value=0.1 * optim.lr)
    tx = optax.chain(optax.clip_by_global_norm(optim.grad_clip),
                     optax.adamw(lr, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay))
    return tx, lr


def sequence_logprobs(model, tokens, valid, chunk: int):
    """Log-prob and entropy of every token given its prefix: [N, L] (column 0 is 0)."""
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    h, _ = model.hidden_states(tokens[:, :-1], positions[:, :-1], valid[:, :-1])
    logp, ent = token_logprobs(h, model.head_weight(), tokens[:, 1:], chunk)
    pad = jnp.zeros((tokens.shape[0], 1), logp.dtype)
    return jnp.concatenate([pad, logp], 1), jnp.concatenate([pad, ent], 1)


def make_update_fns(graphdef, frozen, tx, loss_cfg: LossConfig, chunk: int):
    """(logprobs_fn, update_fn) for one policy.

    `graphdef` and `frozen` (the non-trainable part of the model state, e.g. a
    LoRA base; may be empty) come from `nnx.split`. logprobs_fn(params, tokens,
    valid) -> logp [N, L]; update_fn(state, batch) -> (state, metrics), which
    skips the step (and says so in metrics["skipped"]) when the loss or the
    gradient is not finite, so a NaN never reaches the params.
    """

    def model_of(params):
        return nnx.merge(graphdef, params, frozen)

    @jax.jit
    def logprobs_fn(params, tokens, valid):
        return sequence_logprobs(model_of(params), tokens, valid, chunk)[0]

    # The head is trained unless it sits in the frozen part (a LoRA base).
    train_head = not jax.tree.leaves(frozen)

    def loss_fn(params, batch: Batch):
        """policy_loss, with its gradient through the LM head fused into the
        chunked log-prob pass (the loss is a weighted sum of per-token terms)."""
        model = model_of(params)
        tokens, valid = batch.tokens, batch.valid
        positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
        h, _ = model.hidden_states(tokens[:, :-1], positions[:, :-1], valid[:, :-1])
        adv = batch.adv[:, None] if batch.adv.ndim == 1 else batch.adv
        per_token = {"old": batch.old_logp, "adv": jnp.broadcast_to(adv, tokens.shape),
                     "w": aggregation_weights(batch.is_resp, loss_cfg.aggregation)}
        if loss_cfg.kl_coef:
            per_token["ref"] = batch.ref_logp
        per_token = {k: v[:, 1:] for k, v in per_token.items()}  # column j scores token j
        loss, (logp, ent) = fused_head_loss(
            h, model.head_weight(), tokens[:, 1:], per_token,
            lambda lp, en, x: token_loss_terms(loss_cfg, lp, en, x), chunk, head_grad=train_head)
        pad = jnp.zeros((tokens.shape[0], 1), logp.dtype)
        logp, ent = jnp.concatenate([pad, logp], 1), jnp.concatenate([pad, ent], 1)
        _, metrics = policy_loss(loss_cfg, logp, batch.old_logp, batch.adv, batch.is_resp,
                                 batch.ref_logp, ent)  # diagnostics (not differentiated)
        return loss, dict(metrics, loss=loss)

    @jax.jit
    def update_fn(state: TrainState, batch: Batch):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        grad_norm = optax.global_norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
        new_state = TrainState(keep(params, state.params), keep(opt_state, state.opt_state),
                               state.step + ok.astype(jnp.int32))
        metrics = dict(metrics, grad_norm=grad_norm, skipped=(~ok).astype(jnp.float32))
        return new_state, metrics

    update_fn = jax.jit(update_fn.__wrapped__, donate_argnums=0)
    return logprobs_fn, update_fn


def init_state(params, tx) -> TrainState:
    """Fresh optimizer state; its scalars (step counts) are replicated on the
    params' mesh, so a restored checkpoint (which commits every leaf to the
    target's sharding) never mixes a one-device scalar with mesh-wide params."""
    state = TrainState(params, tx.init(params), jnp.zeros((), jnp.int32))
    meshes = [x.sharding.mesh for x in jax.tree.leaves(params)
              if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding)]
    if not meshes:
        return state
    replicated = NamedSharding(meshes[0], PartitionSpec())
    place = lambda x: x if not isinstance(x, jax.Array) or isinstance(x.sharding, NamedSharding) \
        else jax.device_put(x, replicated)
    return jax.tree.map(place, state)
