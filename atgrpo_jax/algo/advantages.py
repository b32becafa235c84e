"""Agent- and turn-wise group advantages, reward mixing and group filters.

Tree sampling gives every group (task, agent, turn) exactly K samples, so the
rewards of G groups form a dense [G, K] array; `mask` marks samples that exist
(a task that ended earlier leaves a masked row). One vmapped function
normalizes each row. Estimators are named variants (`ADVANTAGES`), chosen by
`config.algo.advantage`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.registry import Registry

EPS = 1e-6
ADVANTAGES: Registry = Registry("algo.advantage")  # name -> row function (rewards [K], mask [K]) -> [K]


def mix_rewards(local: jax.Array, team: jax.Array, alpha: float = 1.0) -> jax.Array:
    """An agent's training reward: its own reward plus alpha times the team's."""
    return local + alpha * team


def overlong_penalty(length: jax.Array, budget: jax.Array, buffer: int, factor: float = 1.0) -> jax.Array:
    """DAPO's soft overlong punishment (Yu et al. 2025): 0 up to budget - buffer tokens, then falling
    linearly to -factor at the budget (a response cut there). length, budget: [...] tokens; buffer 0: off."""
    if buffer <= 0:
        return jnp.zeros(jnp.shape(length), jnp.float32)
    over = jnp.asarray(length, jnp.float32) - (jnp.asarray(budget, jnp.float32) - buffer)
    return -factor * jnp.clip(over / buffer, 0.0, 1.0)


def _centered(r: jax.Array, m: jax.Array):
    """(r - mean) on the live samples (0 elsewhere), and how many are live."""
    n = m.sum()
    mean = (r * m).sum() / jnp.maximum(n, 1.0)
    return (r - mean) * m, n


@ADVANTAGES.register("grpo")
def grpo(r: jax.Array, m: jax.Array) -> jax.Array:
    """(r - mean) / (std + 1e-6), unbiased std over the group's live samples."""
    m = m.astype(r.dtype)
    centered, n = _centered(r, m)
    std = jnp.sqrt((centered**2).sum() / jnp.maximum(n - 1.0, 1.0))
    return jnp.where(n > 1, centered / (std + EPS), 0.0)  # a group of one carries no signal


@ADVANTAGES.register("drgrpo")
def drgrpo(r: jax.Array, m: jax.Array) -> jax.Array:
    """r - mean, without the std division (Dr. GRPO): groups with a small spread keep small advantages."""
    centered, n = _centered(r, m.astype(r.dtype))
    return jnp.where(n > 1, centered, 0.0)


def group_advantages(rewards: jax.Array, mask: jax.Array, estimator: str = "grpo") -> jax.Array:
    """The estimator applied to each row of [G, K] rewards; 0 where masked."""
    return jax.vmap(ADVANTAGES[estimator])(rewards, mask)


def group_filter(rewards: jax.Array, mask: jax.Array, drop_low_mean_frac: float = 0.0,
                 drop_zero_variance: bool = False, scope: jax.Array | None = None) -> jax.Array:
    """[G] bool: groups kept for the update.

    drop_low_mean_frac drops that fraction of the live groups with the lowest
    mean reward (ties broken by group order); drop_zero_variance drops groups
    whose samples all got the same reward (they carry no gradient). scope [G] int:
    the low-mean filter ranks groups within each scope separately (e.g. each
    policy's groups, as each model's batch is filtered on its own); None: one scope.
    """
    g = rewards.shape[0]
    scope = jnp.zeros(g, jnp.int32) if scope is None else jnp.asarray(scope, jnp.int32)
    m = mask.astype(rewards.dtype)
    n = m.sum(axis=1)
    live = n > 0
    mean = (rewards * m).sum(axis=1) / jnp.maximum(n, 1.0)
    keep = live
    if drop_zero_variance:
        spread = jnp.where(mask, rewards, -jnp.inf).max(1) - jnp.where(mask, rewards, jnp.inf).min(1)
        keep = keep & (spread > 0)
    if drop_low_mean_frac > 0:
        order = jnp.lexsort((jnp.arange(g), jnp.where(live, mean, jnp.inf), scope))  # by scope, mean, group
        position = jnp.empty_like(order).at[order].set(jnp.arange(g))
        scopes = int(scope.max()) + 1 if g else 1
        first = jax.ops.segment_min(position, scope, num_segments=scopes)  # where each scope starts in `order`
        live_in_scope = jax.ops.segment_sum(live.astype(jnp.int32), scope, num_segments=scopes)
        num_drop = jnp.floor(drop_low_mean_frac * live_in_scope).astype(jnp.int32)
        keep = keep & (position - first[scope] >= num_drop[scope])
    return keep


def first_informative(scope: np.ndarray, informative: np.ndarray, order: np.ndarray, want: np.ndarray) -> np.ndarray:
    """DAPO's dynamic sampling's pick (Yu et al. 2025): [G] bool, in each scope s (scope [G] int, e.g.
    each group's policy; -1: none) its first want[s] informative groups (those with reward variance)
    by `order` [G] (e.g. the rollout round that made each group, then its task), so the batch has the
    size it would have had without filtering and the earliest samples are the ones kept."""
    chosen = np.zeros(len(scope), bool)
    for s, n in enumerate(want):
        mine = np.flatnonzero(informative & (scope == s))
        chosen[mine[np.argsort(order[mine], kind="stable")][:n]] = True
    return chosen
