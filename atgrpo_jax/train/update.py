"""One policy's train state and its jitted update.

A policy is a Qwen3 (plus, in the LoRA regime, its adapters); its state is a
plain pytree: trainable params, optimizer state, step. The functions here are
built once per policy (`make_update_fns`) and jitted with donated buffers.

Two batch layouts:
- `Batch`, one row per sample ([N, L], right-padded): tokens (prompt then
  response), valid, is_resp (the tokens trained on), old_logp, adv [N],
  ref_logp. Log-probs at column j score token j (column 0 never is a response).
- `Packed` (what the trainer feeds, built by `train.batch.pack_minibatch`): each
  row [R, W] holds one prompt once, then the responses to it (J slots), so a
  group's K samples share one forward pass of their prompt. Scored tokens are
  laid out [R, J, T] (slot j's t-th response token): `pred` is the column whose
  hidden state predicts it, `target` its id, `scored` marks real ones.
A `Batch` is converted to a `Packed` one (J = 1) inside the jitted functions.
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


class Packed(NamedTuple):
    tokens: jax.Array  # [R, W] int
    positions: jax.Array  # [R, W] int: a response continues its prompt's positions
    segment: jax.Array  # [R, W] int: 0 prompt, j + 1 response slot j, -1 padding
    pred: jax.Array  # [R, J, T] int: column of the hidden state that scores the token
    target: jax.Array  # [R, J, T] int
    scored: jax.Array  # [R, J, T] bool
    adv: jax.Array  # [R, J] (or [R, J, T])
    old_logp: jax.Array | None = None  # [R, J, T]
    ref_logp: jax.Array | None = None


def packed_from_rows(b: Batch) -> Packed:
    """A one-sample-per-row batch as a Packed one: J = 1, the prompt unshared."""
    n, l = b.tokens.shape
    scored_cols = lambda x: None if x is None else x[:, None, 1:]  # column j scores token j
    return Packed(b.tokens, jnp.maximum(jnp.cumsum(b.valid, axis=1) - 1, 0), jnp.where(b.valid, 0, -1),
                  jnp.broadcast_to(jnp.arange(l - 1, dtype=jnp.int32), (n, 1, l - 1)), scored_cols(b.tokens),
                  scored_cols(b.is_resp), b.adv[:, None] if b.adv.ndim == 1 else scored_cols(b.adv),
                  scored_cols(b.old_logp), scored_cols(b.ref_logp))


def rows_from_packed(x: jax.Array) -> jax.Array:
    """[N, 1, L - 1] scored values of `packed_from_rows` back to [N, L] (column 0 is 0)."""
    x = x[:, 0]
    return jnp.concatenate([jnp.zeros((x.shape[0], 1), x.dtype), x], axis=1)


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


def scoring_states(model, p: Packed) -> jax.Array:
    """[R, J * T, D]: the hidden state that predicts each scored token (a gather
    within each row, so rows sharded over devices stay where they are)."""
    h, _ = model.hidden_states(p.tokens, p.positions, segments=p.segment)
    r, j, t = p.pred.shape
    return jnp.take_along_axis(h, p.pred.reshape(r, j * t, 1), axis=1)


def packed_logprobs(model, p: Packed, chunk: int) -> jax.Array:
    """log p of every scored slot, [R, J, T] (unscored slots hold junk)."""
    r, j, t = p.pred.shape
    logp, _ = token_logprobs(scoring_states(model, p), model.head_weight(), p.target.reshape(r, j * t), chunk)
    return logp.reshape(r, j, t)


def make_update_fns(graphdef, frozen, tx, loss_cfg: LossConfig, chunk: int):
    """(logprobs_fn, update_fn) for one policy.

    `graphdef` and `frozen` (the non-trainable part of the model state, e.g. a
    LoRA base; may be empty) come from `nnx.split`. logprobs_fn(params, packed)
    -> logp [R, J, T], or logprobs_fn(params, tokens, valid) -> [N, L] for
    rows; update_fn(state, batch: Packed | Batch) -> (state, metrics), which
    skips the step (and says so in metrics["skipped"]) when the loss or the
    gradient is not finite, so a NaN never reaches the params.
    """

    def model_of(params):
        return nnx.merge(graphdef, params, frozen)

    @jax.jit
    def packed_logprobs_fn(params, packed: Packed):
        return packed_logprobs(model_of(params), packed, chunk)

    @jax.jit
    def rows_logprobs_fn(params, tokens, valid):
        return rows_from_packed(packed_logprobs(model_of(params), packed_from_rows(
            Batch(tokens, valid, valid, None, jnp.zeros(tokens.shape[0]))), chunk))

    def logprobs_fn(params, batch, valid=None):
        """[R, J, T] for a Packed batch; [N, L] for (tokens, valid) rows."""
        return packed_logprobs_fn(params, batch) if isinstance(batch, Packed) else \
            rows_logprobs_fn(params, batch, valid)

    # The head is trained unless it sits in the frozen part (a LoRA base).
    train_head = not jax.tree.leaves(frozen)

    def loss_fn(params, batch: Batch | Packed):
        """policy_loss, with its gradient through the LM head fused into the
        chunked log-prob pass (the loss is a weighted sum of per-token terms)."""
        p = batch if isinstance(batch, Packed) else packed_from_rows(batch)
        model = model_of(params)
        r, j, t = p.pred.shape
        seqs = lambda x: x.reshape(r * j, *x.shape[2:])  # one row per sample, for policy_loss
        adv = p.adv[..., None] if p.adv.ndim == 2 else p.adv
        per_token = {"old": p.old_logp, "adv": jnp.broadcast_to(adv, p.pred.shape),
                     "w": aggregation_weights(seqs(p.scored), loss_cfg.aggregation)}
        if loss_cfg.kl_coef:
            per_token["ref"] = p.ref_logp
        per_token = {k: v.reshape(r, j * t) for k, v in per_token.items()}
        loss, (logp, ent) = fused_head_loss(
            scoring_states(model, p), model.head_weight(), p.target.reshape(r, j * t), per_token,
            lambda lp, en, x: token_loss_terms(loss_cfg, lp, en, x), chunk, head_grad=train_head)
        ref = None if p.ref_logp is None else seqs(p.ref_logp)
        _, metrics = policy_loss(loss_cfg, logp.reshape(r * j, t), seqs(p.old_logp), seqs(p.adv), seqs(p.scored),
                                 ref, ent.reshape(r * j, t))  # diagnostics (not differentiated)
        return loss, dict(metrics, loss=loss)

    @jax.jit
    def update_fn(state: TrainState, batch: Packed | Batch):
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
