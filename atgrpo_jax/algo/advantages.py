"""Agent- and turn-wise group advantages, reward mixing and group filters.

Tree sampling gives every group (task, agent, turn) exactly K samples, so the
rewards of G groups form a dense [G, K] array; `mask` marks samples that exist
(a task that ended earlier leaves a masked row). One vmapped function
normalizes each row.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

EPS = 1e-6


def mix_rewards(local: jax.Array, team: jax.Array, alpha: float = 1.0) -> jax.Array:
    """An agent's training reward: its own reward plus alpha times the team's."""
    return local + alpha * team


def _row_advantage(r: jax.Array, m: jax.Array, use_std: bool) -> jax.Array:
    m = m.astype(r.dtype)
    n = m.sum()
    mean = (r * m).sum() / jnp.maximum(n, 1.0)
    centered = (r - mean) * m
    if use_std:
        std = jnp.sqrt((centered**2).sum() / jnp.maximum(n - 1.0, 1.0))  # unbiased
        centered = centered / (std + EPS)
    return jnp.where(n > 1, centered, 0.0)  # a group of one carries no signal


def group_advantages(rewards: jax.Array, mask: jax.Array, use_std: bool = True) -> jax.Array:
    """A = (r - mean_g) / (std_g + 1e-6) per row of [G, K]; 0 where masked.

    use_std=False gives the mean-only (Dr. GRPO) variant.
    """
    return jax.vmap(lambda r, m: _row_advantage(r, m, use_std))(rewards, mask)


def group_filter(rewards: jax.Array, mask: jax.Array, drop_low_mean_frac: float = 0.0,
                 drop_zero_variance: bool = False) -> jax.Array:
    """[G] bool: groups kept for the update.

    drop_low_mean_frac drops that fraction of the live groups with the lowest
    mean reward (ties broken by group order); drop_zero_variance drops groups
    whose samples all got the same reward (they carry no gradient).
    """
    m = mask.astype(rewards.dtype)
    n = m.sum(axis=1)
    live = n > 0
    mean = (rewards * m).sum(axis=1) / jnp.maximum(n, 1.0)
    keep = live
    if drop_zero_variance:
        spread = jnp.where(mask, rewards, -jnp.inf).max(1) - jnp.where(mask, rewards, jnp.inf).min(1)
        keep = keep & (spread > 0)
    if drop_low_mean_frac > 0:
        num_drop = jnp.floor(drop_low_mean_frac * live.sum()).astype(jnp.int32)
        order = jnp.argsort(jnp.where(live, mean, jnp.inf), stable=True)
        rank = jnp.empty_like(order).at[order].set(jnp.arange(order.shape[0]))
        keep = keep & (rank >= num_drop)
    return keep
