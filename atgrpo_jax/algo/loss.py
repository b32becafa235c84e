"""The clipped policy-gradient loss of AT-GRPO, with its diagnostics."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from atgrpo_jax.registry import Registry

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


def is_weights(cfg: "LossConfig", old_logp, sampler_logp):
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
class LossConfig:
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float = 0.0  # c > 1 enables dual clip for negative advantages; 0 = off
    aggregation: str = "token-mean"  # a name in AGGREGATIONS
    kl_coef: float = 0.0  # k3 KL to a frozen reference; 0 builds no reference
    entropy_coef: float = 0.0
    is_correction: str = "none"  # "truncated" / "masked": weigh each token by `is_weights` (sampler mismatch)
    is_cap: float = 2.0  # C of the correction: weights capped at C (truncated) or tokens over C dropped (masked)

    def __post_init__(self):
        if self.is_correction not in IS_CORRECTIONS:
            raise ValueError(f"loss.is_correction must be one of {IS_CORRECTIONS}, got {self.is_correction!r}")
        if not self.is_cap >= 1.0:
            raise ValueError(f"loss.is_cap must be >= 1, got {self.is_cap}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"loss.aggregation must be one of {AGGREGATIONS.names()}, got {self.aggregation!r}")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"loss.dual_clip must be 0 (off) or > 1, got {self.dual_clip}")
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError(f"loss.eps_low must be in [0, 1) and eps_high >= 0, "
                             f"got {self.eps_low}, {self.eps_high}")


def aggregation_weights(mask: jax.Array, how: str, sample_len: jax.Array | None = None) -> jax.Array:
    """w (mask's shape) such that the aggregate `how` of x over mask is (w * x).sum().

    Rows of mask [B, T] are the sequences, unless `sample_len` gives, per token, the
    number of masked tokens of the sequence it belongs to (packed layouts)."""
    if sample_len is None:
        sample_len = jnp.broadcast_to(mask.astype(jnp.float32).sum(-1, keepdims=True), mask.shape)
    return AGGREGATIONS[how](mask, sample_len)


def clipped_surrogate(cfg: LossConfig, logp, old_logp, adv):
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


def k3_kl(ref_logp, logp):
    d = ref_logp - logp
    return jnp.exp(d) - d - 1.0  # k3: unbiased, non-negative


def token_loss_terms(cfg: LossConfig, logp, entropy, x: dict):
    """Per-token terms whose sum is weighted_policy_loss's loss. x holds, per token,
    "old" (old log-prob), "adv", "w" (aggregation_weights), "ref" if kl_coef and "is" (is_weights) if
    the correction is on."""
    pg, _ = clipped_surrogate(cfg, logp, x["old"], x["adv"])
    if "is" in x:
        pg = x["is"] * pg
    if cfg.kl_coef:
        pg = pg + cfg.kl_coef * k3_kl(x["ref"], logp)
    if cfg.entropy_coef:
        pg = pg - cfg.entropy_coef * entropy
    return x["w"] * pg


def weighted_policy_loss(cfg: LossConfig, w, logp, old_logp, adv, ref_logp=None, entropy=None, is_w=None):
    """Clipped surrogate (+ k3 KL, - entropy bonus) with its aggregation given as per-token weights w
    (`aggregation_weights`) and, with the correction on, the importance weights is_w (`is_weights`);
    returns (loss, metrics). Every argument has one shape (any layout of the tokens: [B, T] rows, or the
    packed [R, M] entries)."""
    log_ratio = logp - old_logp
    pg, is_clipped = clipped_surrogate(cfg, logp, old_logp, adv)
    f = lambda x: (w * x).sum()
    loss = f(pg if is_w is None else is_w * pg)
    metrics = {
        "pg_loss": loss,
        "clip_frac": f(is_clipped.astype(jnp.float32)),
        "approx_kl": f(0.5 * log_ratio**2),
        "ratio_mean": f(jnp.exp(log_ratio)),
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
