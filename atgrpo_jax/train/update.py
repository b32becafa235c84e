"""One policy's train state and its jitted update.

A policy is a Qwen3 (plus, with LoRA sharing, its adapters); its state is a
plain pytree: trainable params, optimizer state, step. The functions here are
built once per policy (`make_update_fns`) and jitted with donated buffers.

The batch is `Packed` (built by `train.batch.pack`): each row [R, W] holds one
prompt once, then the responses to it, so a group's K samples share one forward
pass of their prompt. The scored (response) tokens of a row are listed
compactly, [R, M]: `pred` is the column whose hidden state predicts the token,
`target` its id, `scored` marks real entries; only these go through the LM head.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from atgrpo_jax.algo.logprobs import Repeats, SampledFrom, first_seen, fused_head_loss, token_logprobs
from atgrpo_jax.algo.loss import (LossSettings, aggregation_weights, resolved_old, sequence_log_ratio, sequence_terms,
                                  token_loss_terms, weighted_policy_loss)
from atgrpo_jax.models.strategies import causal, packed


class TrainState(NamedTuple):
    params: Any  # trainable nnx.State
    opt_state: Any
    step: jax.Array  # int32: optimizer steps taken


class Packed(NamedTuple):
    tokens: jax.Array  # [R, W] int
    positions: jax.Array  # [R, W] int: a response continues its prompt's positions
    segment: jax.Array  # [R, W] int: 0 prompt, s + 1 the row's s-th response, -1 padding
    pred: jax.Array  # [R, M] int: column of the hidden state that scores the token
    target: jax.Array  # [R, M] int
    scored: jax.Array  # [R, M] bool
    sample_len: jax.Array  # [R, M] int: scored tokens of the token's sample (seq-mean weights)
    adv: jax.Array  # [R, M] float32: the token's advantage
    inv_temp: jax.Array  # [R, M] float32: 1 / the temperature the token was sampled at
    top_p: jax.Array  # [R, M] float32: the top-p it was sampled with (1: none)
    old_logp: jax.Array | None = None  # [R, M]; OWN_OLD_LOGP entries: the update's own (algo/loss.py)
    ref_logp: jax.Array | None = None
    penalty: jax.Array | None = None  # [R, M] float32: the repetition penalty it was sampled with (None: none)
    sample: jax.Array | None = None  # [R, M] int32: the sample each scored token belongs to (with penalty or
    # the sequence-level ratio)
    sample_row: jax.Array | None = None  # [S] int32: the row holding sample s's prompt, -1 none (with penalty)
    is_weight: jax.Array | None = None  # [R, M] float32: importance weight of the sampler mismatch (loss.is_correction)

    def placed(self, place: Callable = jnp.asarray) -> "Packed":
        """Every array `place`d (e.g. onto a policy's mesh); the fields that are None stay None."""
        return jax.tree.map(place, self)


SCHEDULES = ("constant", "cosine")  # optim.schedule: see lr_factor


def lr_factor(step: int, optim, total_steps: int, as_reference_runs: bool = False) -> float:
    """The multiple of optim.lr that training step `step` (1-based) runs at, as verl schedules it:
    its scheduler advances once per training step, so step s reads the factor of s - 1. Warm-up:
    (s - 1) / warmup_steps; then 1 ("constant"), or "cosine" from 1 down to optim.min_lr_ratio at
    `total_steps` (the run's training steps). Unlike verl's constant schedule, which starts at 0
    even without warm-up, "constant" with warmup_steps = 0 starts at 1 (our runs always did).

    as_reference_runs (config.reference.lr_schedule, docs/paper.md "Recipes"): "cosine" as the
    reference system runs it. Its vendored verl warms up from min_lr_ratio, not 0, and it never sets
    the total step count (-1), so the cosine's progress is (s - 1 - warmup) whole half-periods: the
    rate alternates 1, min_lr_ratio, 1, ... after the warm-up."""
    done, warm, floor = step - 1, optim.warmup_steps, optim.min_lr_ratio
    reference_cosine = as_reference_runs and optim.schedule == "cosine"
    if done < warm:
        return floor + (1 - floor) * done / warm if reference_cosine else done / max(1, warm)
    if optim.schedule == "constant":
        return 1.0
    span = max(1, (-1 if reference_cosine else total_steps) - warm)
    progress = (done - warm) / span
    return max(floor if reference_cosine else 0.0, (1 - floor) / 2 * math.cos(math.pi * progress) + (1 + floor) / 2)


def make_optimizer(optim, total_steps: int, as_reference_runs: bool = False, turn: tuple[int, int] = (0, 1)
                   ) -> tuple[optax.GradientTransformation, Callable]:
    """(AdamW with global-norm clipping, lr_at) where lr_at(training step) is the learning rate of that
    step (`lr_factor`). The rate is a hyperparameter in the optimizer state, set once per training step
    (`with_lr`): verl counts its schedule in training steps, not in optimizer steps. `turn` = (k, n): n
    updates per training step share one scheduler and this is the k-th (train/roles.py:scheduler_turns)."""
    k, n = turn

    def lr_at(step: int) -> float:
        return optim.lr * lr_factor((step - 1) * n + k + 1, optim, total_steps, as_reference_runs)

    adamw = optax.inject_hyperparams(optax.adamw)(learning_rate=lr_at(1), b1=optim.b1, b2=optim.b2,
                                                  weight_decay=optim.weight_decay)
    return optax.chain(optax.clip_by_global_norm(optim.grad_clip), adamw), lr_at


def with_lr(state: "TrainState", lr: float) -> "TrainState":
    """`state` whose optimizer takes its next steps at learning rate `lr` (placed as the value it replaces)."""
    clip, adamw = state.opt_state
    old = adamw.hyperparams["learning_rate"]
    new = jax.device_put(np.asarray(lr, old.dtype), old.sharding)
    return state._replace(opt_state=(clip, adamw._replace(hyperparams=dict(adamw.hyperparams, learning_rate=new))))


def sequence_logprobs(model, tokens, valid, chunk: int):
    """Log-prob and entropy of every token given its prefix: [N, L] (column 0 is 0)."""
    positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
    h, _ = model.hidden_states(tokens[:, :-1], positions[:, :-1], causal(valid[:, :-1]))
    logp, ent = token_logprobs(h, model.head_weight(), tokens[:, 1:], chunk)
    pad = jnp.zeros((tokens.shape[0], 1), logp.dtype)
    return jnp.concatenate([pad, logp], 1), jnp.concatenate([pad, ent], 1)


def scoring_states(model, p: Packed) -> jax.Array:
    """[R, M, D]: the hidden state that predicts each scored token (a gather
    within each row, so rows sharded over devices stay where they are)."""
    h, _ = model.hidden_states(p.tokens, p.positions, packed(p.segment))
    return jnp.take_along_axis(h, p.pred[..., None], axis=1)


def repeats_of(p: Packed, how: SampledFrom, vocab: int) -> Repeats | None:
    """The ids each scored token had seen (its row's prompt, its sample's earlier tokens), when the
    sampler penalized repeats (None otherwise: no [S, V] arrays are built)."""
    if not how.repetition_penalty or p.penalty is None:
        return None
    vocab = how.vocab_limit or vocab
    r, m = p.target.shape
    ids = jnp.where(p.segment == 0, p.tokens, vocab)  # prompt columns; the rest out of range, dropped
    row_prompt = jnp.zeros((r, vocab), bool).at[jnp.arange(r)[:, None], ids].set(True, mode="drop")
    prompt_present = jnp.take(row_prompt, jnp.maximum(p.sample_row, 0), axis=0) & (p.sample_row >= 0)[:, None]
    order = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), (r, m))  # a sample's entries are consecutive
    return Repeats(first_seen(prompt_present, p.sample, order, p.target, p.scored), p.sample, order, p.penalty)


def packed_logprobs(model, p: Packed, chunk: int, how: SampledFrom = SampledFrom()) -> jax.Array:
    """log p of every scored entry under its sampling distribution, [R, M] (unscored entries hold junk)."""
    head = model.head_weight()
    return token_logprobs(scoring_states(model, p), head, p.target, chunk, how, p.inv_temp, p.top_p,
                          repeats_of(p, how, head.shape[1]))[0]


def apply_if_finite(tx, state: TrainState, grads, loss):
    """(new state, gradient norm, ok): the optimizer step, or the state as it is when the loss or the
    gradient is not finite (a skipped update). A cond rather than a select per leaf: the step then
    makes one pass over params and moments (CPU: the optimizer alone 1.4x faster)."""
    grad_norm = optax.global_norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def step(args):
        updates, opt_state = tx.update(grads, args[1], args[0])
        return optax.apply_updates(args[0], updates), opt_state
    params, opt_state = jax.lax.cond(ok, step, lambda args: args, (state.params, state.opt_state))
    return TrainState(params, opt_state, state.step + ok.astype(jnp.int32)), grad_norm, ok


def make_update_fns(graphdef, frozen, tx, loss_cfg: LossSettings, chunk: int, how: SampledFrom = SampledFrom(),
                    compiler_options: dict | None = None):
    """(logprobs_fn, update_fn) for one policy; tokens are scored under the distribution the sampler drew
    them from (`how`, and each token's temperature, top-p and repetition penalty in the batch).

    `graphdef` and `frozen` (the non-trainable part of the model state, e.g. a
    LoRA base; may be empty) come from `nnx.split`. logprobs_fn(params, packed)
    -> logp [R, M]; update_fn(state, packed) -> (state, metrics), which
    skips the step (and says so in metrics["skipped"]) when the loss or the
    gradient is not finite, so a NaN never reaches the params. `frozen` reaches the jitted
    programs (`update_steps`) as an argument, never as a constant compiled into them. compiler_options:
    XLA's, for the policy's pool (`sharding.pool_compiler_options`).
    """
    logprobs, update = update_steps(graphdef, tx, loss_cfg, chunk, how, train_head=not jax.tree.leaves(frozen),
                                    compiler_options=compiler_options)
    return (lambda params, packed: logprobs(params, packed, frozen)), \
        (lambda state, batch: update(state, batch, frozen))


def update_steps(graphdef, tx, loss_cfg: LossSettings, chunk: int, how: SampledFrom, train_head: bool,
                 compiler_options: dict | None = None):
    """The jitted logprobs(params, packed, frozen) and update(state, packed, frozen) (the state donated)
    of `make_update_fns`. train_head: the LM head is trained (False: it sits in a frozen LoRA base)."""
    options = compiler_options or None

    def model_of(params, frozen):
        return nnx.merge(graphdef, params, frozen)

    @functools.partial(jax.jit, compiler_options=options)
    def logprobs_fn(params, packed: Packed, frozen):
        """log p [R, M] of the batch's scored entries."""
        return packed_logprobs(model_of(params, frozen), packed, chunk, how)

    def loss_fn(params, p: Packed, frozen):
        """The clipped policy loss, with its gradient through the LM head fused into the
        chunked log-prob pass (the loss is a weighted sum of per-token terms)."""
        model = model_of(params, frozen)
        w = aggregation_weights(p.scored, loss_cfg.aggregation, p.sample_len)
        per_token = {"old": p.old_logp, "adv": p.adv, "w": w}
        if loss_cfg.kl_coef:
            per_token["ref"] = p.ref_logp
        if p.is_weight is not None:
            per_token["is"] = p.is_weight
        head, states = model.head_weight(), scoring_states(model, p)
        sampling = dict(how=how, inv_temp=p.inv_temp, top_p=p.top_p, repeats=repeats_of(p, how, head.shape[1]))
        seq_log_ratio = None
        if loss_cfg.ratio_level == "sequence":  # GSPO: each sample's ratio needs all its tokens' log-probs
            # first, so they take one more (forward-only) pass of the head
            now = token_logprobs(jax.lax.stop_gradient(states), jax.lax.stop_gradient(head), p.target, chunk,
                                 **sampling)[0]
            seq_log_ratio = sequence_log_ratio(now - resolved_old(p.old_logp, now), p.sample, p.scored)
            per_token["seq_f"], per_token["seq_df"] = sequence_terms(loss_cfg, seq_log_ratio, p.adv)
        loss, (logp, ent) = fused_head_loss(
            states, head, p.target, per_token, lambda lp, en, x: token_loss_terms(loss_cfg, lp, en, x), chunk,
            head_grad=train_head, **sampling)
        old = resolved_old(p.old_logp, logp)
        _, metrics = weighted_policy_loss(loss_cfg, w, logp, old, p.adv, p.ref_logp, ent,  # diagnostics
                                          p.is_weight, seq_log_ratio)
        return loss, dict(metrics, loss=loss, old_logp=old)  # old_logp: for the sampler's gap (train/pending.py)

    @functools.partial(jax.jit, donate_argnums=0, compiler_options=options)  # the old state's buffers: the new one's
    def update_fn(state: TrainState, batch: Packed, frozen):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, frozen)
        new_state, grad_norm, ok = apply_if_finite(tx, state, grads, loss)
        metrics = dict(metrics, grad_norm=grad_norm, skipped=(~ok).astype(jnp.float32))
        return new_state, metrics

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
