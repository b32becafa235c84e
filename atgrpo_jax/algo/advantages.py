"""Agent- and turn-wise group advantages, reward mixing and group filters.

Tree sampling gives every group (task, agent, turn) exactly K samples, so the
rewards of G groups form a dense [G, K] array; `mask` marks samples that exist
(a task that ended earlier leaves a masked row). One vmapped function
normalizes each row. Estimators are named variants, chosen by `config.algo.advantage` (and per agent
by `config.algo.role_advantage`), of two kinds:

- a row estimator (`ADVANTAGES`) sees one group, (rewards [K], mask [K]) -> [K];
- a batch estimator (`BATCH_ADVANTAGES`) sees every group of a batch at once, (rewards [G, K], mask [G, K],
  agent [G]) -> [G, K], for statistics over more than one group (REINFORCE++'s whitening, Dr. MAS's
  per-agent scale). The batch is what the caller hands it: `train.groups.score_groups` hands it, per
  policy, the step's groups of that policy that use the estimator (docs/guides/estimators.md).

`estimator_names()` lists both kinds (what config validation checks against).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.registry import Registry, UnknownName, closest

EPS = 1e-6
ADVANTAGES: Registry = Registry("algo.advantage")  # name -> row function (rewards [K], mask [K]) -> [K]
# name -> batch function (rewards [G, K], mask [G, K], agent [G] int) -> [G, K]
BATCH_ADVANTAGES: Registry = Registry("algo.advantage")


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
    """(r - mean) on the live samples (0 elsewhere), and how many are live. Exactly 0 for a group whose live
    rewards are all equal (see `_group_centered`)."""
    centered, _ = _group_centered(r[None], m[None])
    return centered[0], m.sum()


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


@ADVANTAGES.register("rloo")
def rloo(r: jax.Array, m: jax.Array) -> jax.Array:
    """REINFORCE leave-one-out, unscaled: r_i - mean of the group's other live samples, which is
    n / (n - 1) * (r_i - mean) over the n live ones; 0 in a group of one."""
    m = m.astype(r.dtype)
    centered, n = _centered(r, m)
    return jnp.where(n > 1, centered * n / jnp.maximum(n - 1.0, 1.0), 0.0)


@ADVANTAGES.register("counterfactual")
def counterfactual(r: jax.Array, m: jax.Array) -> jax.Array:
    """CCPO's counterfactual credit under tree sampling: given each sample's counterfactual reward (the team's
    outcome at the end of the turn with the later agents' chosen responses replayed on its branch: the
    trainer hands this estimator Samples.counterfactual_reward, rollout/counterfactual.py), that reward minus
    the mean of the group's other live samples, the agent's replaced actions: `rloo` of those rewards."""
    return rloo(r, m)


@ADVANTAGES.register("magrpo")
def magrpo(r: jax.Array, m: jax.Array) -> jax.Array:
    """MAGRPO's group-relative advantage (Liu et al. 2025, CoMLRL's default "mean" mode): r minus the mean
    over the sibling actions at the same node and turn, no std division. A tree-sampled group's live
    samples are those siblings, so this is drgrpo's number; 0 in a group of one."""
    return drgrpo(r, m)


def _group_centered(r: jax.Array, m: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[G, K] r minus its group's mean on the live samples of groups with 2+ of them (0 elsewhere), and
    [G, K] which samples those are (float). The mean is taken of the differences from one live reward
    of the group: equal rewards then center to exactly 0, where a float32 mean of K equal values (K not
    a power of two) is off by an ulp, which GRPO's std division would make an advantage of ~0.1."""
    n = m.sum(axis=1, keepdims=True)
    first = jnp.take_along_axis(r, jnp.argmax(m, axis=1)[:, None], axis=1)  # [G, 1] a live reward
    d = (r - first) * m
    mean = d.sum(axis=1, keepdims=True) / jnp.maximum(n, 1.0)
    based = m * (n > 1)  # a live sample with a group baseline
    return (d - mean) * based, based


@BATCH_ADVANTAGES.register("reinforce_pp")
def reinforce_pp(r: jax.Array, m: jax.Array, agent: jax.Array) -> jax.Array:
    """REINFORCE++ with a group baseline (verl's reinforce_plus_plus_baseline), one value per sample:
    c = r - group mean, then c whitened over every live sample of the batch with a group baseline:
    (c - mean_B c) / (std_B c + 1e-6), std unbiased. Groups of one live sample: 0, and outside B.
    `agent` is not read (the whole batch is one scope)."""
    del agent
    m = m.astype(r.dtype)
    centered, based = _group_centered(r, m)
    n = based.sum()
    mean = centered.sum() / jnp.maximum(n, 1.0)  # 0 up to rounding: each group's c sums to 0
    spread = (centered - mean) * based
    std = jnp.sqrt((spread**2).sum() / jnp.maximum(n - 1.0, 1.0))
    return jnp.where(n > 1, spread / (std + EPS), 0.0)


@BATCH_ADVANTAGES.register("dr_mas")
def dr_mas(r: jax.Array, m: jax.Array, agent: jax.Array) -> jax.Array:
    """Dr. MAS's agent-wise normalization (Feng et al. 2026): (r - group mean) / (std_a + 1e-6), std_a the
    unbiased std of the rewards of every live sample of the group's agent a in the batch (around that
    agent's mean), so each agent's advantages have its own scale. Groups of one live sample: 0 (they
    still count in std_a). agent [G]: any ints (-1, plain GRPO's mixed groups, is one more agent)."""
    m = m.astype(r.dtype)
    centered, based = _group_centered(r, m)
    ids = jnp.asarray(np.unique(np.asarray(agent), return_inverse=True)[1].ravel())
    agents = int(ids.max()) + 1 if ids.size else 1
    count = jax.ops.segment_sum(m.sum(axis=1), ids, num_segments=agents)
    mean = jax.ops.segment_sum((r * m).sum(axis=1), ids, num_segments=agents) / jnp.maximum(count, 1.0)
    square = jax.ops.segment_sum((((r - mean[ids][:, None]) * m) ** 2).sum(axis=1), ids, num_segments=agents)
    std = jnp.sqrt(square / jnp.maximum(count - 1.0, 1.0))[ids][:, None]
    return jnp.where(based > 0, centered / (std + EPS), 0.0)


def estimator_names() -> tuple[str, ...]:
    """Every estimator's name, row ones first (the choices of algo.advantage and algo.role_advantage)."""
    return ADVANTAGES.names() + BATCH_ADVANTAGES.names()


def is_batch_estimator(name: str) -> bool:
    """Whether `name` is a batch estimator (sees every group of a batch; `BATCH_ADVANTAGES`)."""
    return name in BATCH_ADVANTAGES


def group_advantages(rewards: jax.Array, mask: jax.Array, estimator: str = "grpo",
                     agent: jax.Array | None = None) -> jax.Array:
    """The estimator over [G, K] rewards; 0 where masked. A row estimator is applied to each group on its
    own; a batch estimator takes the G groups as its batch, agent [G] the agent of each (None: one agent)."""
    if estimator in BATCH_ADVANTAGES:
        agent = np.zeros(np.shape(rewards)[0], np.int32) if agent is None else agent
        return BATCH_ADVANTAGES[estimator](jnp.asarray(rewards), jnp.asarray(mask), agent)
    if estimator not in ADVANTAGES:
        raise UnknownName(f"algo.advantage: unknown {estimator!r}{closest(estimator, estimator_names())}; known: "
                          f"{', '.join(sorted(ADVANTAGES))}; batch-level: {', '.join(sorted(BATCH_ADVANTAGES))}")
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
