"""The clipped policy-gradient loss of AT-GRPO, with its diagnostics."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from atgrpo_jax.registry import Registry
from atgrpo_jax.typed_config import Section, at_least, key, non_negative, positive, within

# name -> weights(mask, sample_len) such that the aggregate of x over mask is (w * x).sum();
# sample_len [same shape]: the number of masked tokens of the sequence each token belongs to.
AGGREGATIONS: Registry = Registry("loss.aggregation")


@AGGREGATIONS.register("token-mean")
def token_mean(mask: jax.Array, sample_len: jax.Array) -> jax.Array:
    """Every token of the mini-batch weighs the same: 1 / tokens (the paper's)."""
    m = mask.astype(jnp.float32)
    return m / jnp.maximum(m.sum(), 1.0)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(mask: jax.Array, sample_len: jax.Array) -> jax.Array:
    """Each sequence's token mean, then the mean over sequences: every sample weighs the same."""
    m = mask.astype(jnp.float32)
    per_seq = m / jnp.maximum(sample_len, 1.0)  # sums to 1 over each sequence with a token
    return per_seq / jnp.maximum(per_seq.sum(), 1.0)


IS_CORRECTIONS = ("none", "truncated", "masked")
RATIO_LEVELS = ("token", "sequence")


def is_weights(cfg: "LossSettings", old_logp, sampler_logp):
    """Per-token importance weights of the trainer's (old) distribution over the sampler's: the two differ
    when the sampler runs in another precision or kernel (`logprob_gap`). Truncated importance sampling
    (TIS, Yao et al. 2025) caps pi_old / pi_sampler at C; masked (MIS) drops the tokens whose ratio passes
    C. Weights are data, not differentiated. None when the correction is off."""
    if cfg.is_correction == "none":
        return None
    ratio = jnp.exp(old_logp - sampler_logp)
    if cfg.is_correction == "truncated":
        return jnp.minimum(ratio, cfg.is_cap)
    return (ratio <= cfg.is_cap).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class LossSettings(Section):
    """The clipped policy-gradient loss (the config's `loss` section; atgrpo_jax/typed_config.py)."""

    PATH = "loss"

    eps_low: float = key(0.2, "clip the ratio below at 1 - eps_low", check=within(0, 1, high_open=True))
    eps_high: float = key(0.2, "clip the ratio above at 1 + eps_high", check=non_negative)
    dual_clip: float = key(0.0, "c > 1: dual clip for negative advantages; 0 = off",
                           check=(lambda v: v == 0 or v > 1, "must be 0 (off) or > 1, got {value}"))
    aggregation: str = key("token-mean", "a name in atgrpo_jax.algo.loss.AGGREGATIONS (token-mean, "
                           "seq-mean-token-mean)", choices=AGGREGATIONS.names)
    kl_coef: float = key(0.0, "weight of the k3 KL to the starting policy (0: no reference kept)")
    entropy_coef: float = key(0.0, "weight of the entropy bonus")
    is_correction: str = key("none", '"truncated" (TIS) / "masked" (MIS): weigh tokens by pi_trainer / '
                             "pi_sampler, capped at loss.is_cap or dropped above it, for a sampler that runs in "
                             "another precision (logprob_gap > 0) or older weights (system.staleness: the ratio is "
                             "then clipped around the recomputed old log-probs, decoupled PPO)", choices=IS_CORRECTIONS)
    is_cap: float = key(2.0, "C of loss.is_correction (>= 1)", check=at_least(1))
    ratio_level: str = key("token", "\"sequence\": GSPO's ratio and clip per sample (its mean token log-ratio); "
                           "GSPO's paper clips at eps_low 3e-4, eps_high 4e-4 and takes seq-mean-token-mean",
                           choices=RATIO_LEVELS)
    logprob_chunk: int = key(512, "tokens per chunk of the LM head in the update ([chunk, vocab] logits at a time)",
                             check=positive)


def aggregation_weights(mask: jax.Array, how: str, sample_len: jax.Array | None = None) -> jax.Array:
    """w (mask's shape) such that the aggregate `how` of x over mask is (w * x).sum().

    Rows of mask [B, T] are the sequences, unless `sample_len` gives, per token, the
    number of masked tokens of the sequence it belongs to (packed layouts)."""
    if sample_len is None:
        sample_len = jnp.broadcast_to(mask.astype(jnp.float32).sum(-1, keepdims=True), mask.shape)
    return AGGREGATIONS[how](mask, sample_len)


# An old log-prob of +inf stands for "not computed": the update's first optimizer step on its own samples
# takes the old log-probs from its own forward pass (train/pending.py:first_step_is_on_policy), so one
# compiled update serves every mini-batch. A real log-prob is never above 0; a NaN stays a NaN.
OWN_OLD_LOGP = float("inf")


def resolved_old(old_logp, logp):
    """The old log-probs, each OWN_OLD_LOGP entry replaced by the (constant) log-prob computed now."""
    return jnp.where(old_logp == OWN_OLD_LOGP, jax.lax.stop_gradient(logp), old_logp)


def clipped_surrogate(cfg: LossSettings, logp, old_logp, adv):
    """Per-token clipped policy-gradient loss and where a clip is active."""
    ratio = jnp.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    pg = jnp.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    if cfg.dual_clip:
        bound = -adv * cfg.dual_clip
        is_clipped = is_clipped | ((adv < 0) & (pg > bound))
        pg = jnp.where(adv < 0, jnp.minimum(pg, bound), pg)
    return pg, is_clipped


def sequence_log_ratio(log_ratio, sample, scored):
    """Per token, the mean log-ratio of its sample's scored tokens (GSPO's log s_i, Zheng et al. 2025):
    log_ratio, sample (each token's sample id, -1 none) and scored share one shape."""
    flat_ids = jnp.where(scored & (sample >= 0), sample, -1).reshape(-1)
    n = flat_ids.shape[0]  # ids are < the number of tokens; -1 becomes n, which segment_sum drops
    ids = jnp.where(flat_ids < 0, n, flat_ids)
    total = jax.ops.segment_sum(jnp.where(scored, log_ratio, 0.0).reshape(-1), ids, n)
    count = jax.ops.segment_sum(jnp.ones_like(ids, jnp.float32), ids, n)
    mean = total / jnp.maximum(count, 1.0)
    return jnp.where(scored, mean[jnp.minimum(ids, n - 1)].reshape(log_ratio.shape), 0.0)


def sequence_terms(cfg: LossSettings, seq_log_ratio, adv):
    """GSPO's clipped surrogate of each token's sample, f(log s_i), and its derivative f'(log s_i).

    With weights w constant within a sample (every aggregation here), sum_t w_t f(log s_i) has, for
    token t, the gradient w_t f'(log s_i) d logp_t: log s_i is the mean of the sample's log-ratios, and
    the sample's w_t sum to its weight times |y_i|. So `token_loss_terms` takes the term
    w_t (f + f' (logp_t - stop_gradient(logp_t))): GSPO's value and gradient, one token at a time."""
    f = lambda x: clipped_surrogate(cfg, x, jnp.zeros_like(x), adv)[0]  # noqa: E731
    return jax.jvp(f, (seq_log_ratio,), (jnp.ones_like(seq_log_ratio),))


def k3_kl(ref_logp, logp):
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0  # k3: unbiased, non-negative


def token_loss_terms(cfg: LossSettings, logp, entropy, x: dict):
    """Per-token terms whose sum is weighted_policy_loss's loss. x holds, per token,
    "old" (old log-prob, or OWN_OLD_LOGP), "adv", "w" (aggregation_weights), "ref" if kl_coef, "is" (is_weights) if
    the correction is on, and "seq_f", "seq_df" (`sequence_terms`) with the sequence-level ratio."""
    if "seq_f" in x:  # GSPO: the sample's surrogate, differentiated through this token's log-prob
        pg = x["seq_f"] + x["seq_df"] * (logp - jax.lax.stop_gradient(logp))
    else:
        pg, _ = clipped_surrogate(cfg, logp, resolved_old(x["old"], logp), x["adv"])
    if "is" in x:
        pg = x["is"] * pg
    if cfg.kl_coef:
        pg = pg + cfg.kl_coef * k3_kl(x["ref"], logp)
    if cfg.entropy_coef:
        pg = pg - cfg.entropy_coef * entropy
    return x["w"] * pg


def weighted_policy_loss(cfg: LossSettings, w, logp, old_logp, adv, ref_logp=None, entropy=None, is_w=None,
                         seq_log_ratio=None):
    """Clipped surrogate (+ k3 KL, - entropy bonus) with its aggregation given as per-token weights w
    (`aggregation_weights`) and, with the correction on, the importance weights is_w (`is_weights`);
    returns (loss, metrics). Every argument has one shape (any layout of the tokens: [B, T] rows, or the
    packed [R, M] entries). seq_log_ratio (`sequence_log_ratio`): the clip and the ratio are each
    token's sample's (GSPO); None: each token's own."""
    log_ratio = logp - old_logp
    if seq_log_ratio is None:
        pg, is_clipped = clipped_surrogate(cfg, logp, old_logp, adv)
        ratio = jnp.exp(log_ratio)
    else:
        pg, is_clipped = clipped_surrogate(cfg, seq_log_ratio, jnp.zeros_like(seq_log_ratio), adv)
        ratio = jnp.exp(seq_log_ratio)
    f = lambda x: (w * x).sum()
    loss = f(pg if is_w is None else is_w * pg)
    metrics = {
        "pg_loss": loss,
        "clip_frac": f(is_clipped.astype(jnp.float32)),
        "approx_kl": f(0.5 * log_ratio**2),
        "ratio_mean": f(ratio),
    }
    if is_w is not None:
        metrics["is_weight_mean"] = f(is_w)
    if cfg.kl_coef:
        metrics["kl_ref"] = f(k3_kl(ref_logp, logp))
        loss = loss + cfg.kl_coef * metrics["kl_ref"]
    if entropy is not None:
        metrics["entropy"] = f(entropy)
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * metrics["entropy"]
    metrics["loss"] = loss
    return loss, metrics
