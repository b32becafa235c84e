"""From a step's samples to what each policy trains on: the rewards advantages and filters see,
the advantages, the groups the filters keep, the agents the step trains, and each policy's batch.

A policy's figures depend on its own groups alone, so they are the same whether computed with the
other policies' samples or, as an early update does, without them.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.algo.advantages import group_advantages, group_filter, is_batch_estimator, overlong_penalty
from atgrpo_jax.train.batch import PolicyBatch, Scoring, policy_batch
from atgrpo_jax.train.setup import Run


def group_policies(run: Run, samples, step: int) -> np.ndarray:
    """[G] the policy each group trains at `step` (-1: none, its agent is not trained then; plain GRPO's
    mixed groups: 0)."""
    trained = np.array(run.config.role_schedule.trains([a.name for a in run.workflow.agents], step))
    agent = np.maximum(samples.agent, 0)
    return np.where(samples.agent < 0, 0, np.where(trained[agent], run.policy_of_agent[agent], -1))


@dataclasses.dataclass
class Groups:
    """A step's samples made ready for the update: advantages, the groups the filters keep, and
    the samples each policy is trained on."""

    adv: np.ndarray  # [G, K]
    keep: np.ndarray  # [G]
    trained: np.ndarray  # [G, K]


def budgets(run: Run, samples) -> np.ndarray:
    """[G, K] the max_new_tokens of each sample's agent."""
    return np.array([s.max_new_tokens for s in run.sampling])[samples.sample_agent]


def step_rewards(run: Run, samples) -> tuple[jax.Array, jax.Array]:
    """([G, K] the rewards advantages and filters see: with the soft overlong penalty, [G, K] live)."""
    c = run.config
    penalty = overlong_penalty(samples.response_len, budgets(run, samples), c.algo.overlong_buffer,
                               c.algo.overlong_penalty)
    # the counterfactual estimator's groups see each sample's counterfactual reward (rollout/counterfactual.py)
    swapped = np.array([c.algo.estimator_of(a.name) == "counterfactual" for a in run.workflow.agents])
    reward = np.where(swapped[samples.sample_agent], samples.counterfactual_reward, samples.reward) \
        if swapped.any() else samples.reward
    return jnp.asarray(reward) + penalty, jnp.asarray(samples.mask)


def lumped_ids(samples, k: int) -> np.ndarray:
    """[G] the reference's group of each tree group: one per (task // k, agent, turn), as its key divides
    the task index by K once more than it should (docs/paper.md, "Recipes", X3), numbered from 0."""
    keys = np.stack([np.asarray(samples.task) // k, samples.agent, samples.turn], axis=1)
    return np.unique(keys, axis=0, return_inverse=True)[1].ravel()


def lump(values: np.ndarray, ids: np.ndarray, fill=0) -> tuple[np.ndarray, np.ndarray]:
    """[G, K] rows joined per id into [M, W] (W: the most rows of one id x K; `fill` beyond), and the
    [G, K] flat index of each entry into [M, W] (to scatter a lumped result back)."""
    g, k = values.shape
    slot = np.zeros(g, np.int64)
    for i in range(g):  # the row's place among its id's rows, in group order
        slot[i] = np.count_nonzero(ids[:i] == ids[i])
    width = (int(slot.max()) + 1 if g else 1) * k
    out = np.full((int(ids.max()) + 1 if g else 0, width), fill, dtype=values.dtype)
    where = (ids[:, None] * width + slot[:, None] * k + np.arange(k)[None]).astype(np.int64)
    out.reshape(-1)[where.ravel()] = values.ravel()
    return out, where


def estimate_advantages(run: Run, rewards: jax.Array, mask: jax.Array, live: jax.Array,
                        agent: np.ndarray) -> np.ndarray:
    """[G, K] the advantages of G groups of one agent each (agent [G]; -1: plain GRPO's mixed groups, which
    take algo.advantage): each group by its agent's estimator (algo.role_advantage, else algo.advantage).

    A row estimator sees each group on its own (`mask` [G, K]: the samples that exist). A batch
    estimator (algo.advantages.BATCH_ADVANTAGES) sees a batch: for each policy, the groups given here of
    that policy's agents that use this estimator (the mixed groups: a batch of their own), with the
    samples `live` [G, K] marks (those of the groups dynamic sampling picked, when it did); the others
    get 0 from it. Given a whole step's groups, a policy's batch is the step's groups of that policy, so
    its advantages are the same whether the other policies' groups are given or not."""
    c = run.config
    names = [a.name for a in run.workflow.agents]
    default = c.algo.advantage
    if is_batch_estimator(default):
        adv = np.zeros(np.shape(rewards), np.float32)
    else:
        adv = np.array(group_advantages(rewards, mask, default))  # (a copy: written below)
    for name, estimator in c.algo.role_advantage.items():  # a group of one agent: that agent's estimator
        mine = agent == names.index(name)
        if estimator != default and mine.any() and not is_batch_estimator(estimator):
            adv[mine] = np.asarray(group_advantages(rewards[mine], mask[mine], estimator))
    own = np.array([c.algo.estimator_of(names[a]) if a >= 0 else default for a in agent], object)
    scope = np.where(agent < 0, len(run.policies), run.policy_of_agent[np.maximum(agent, 0)])
    for estimator in dict.fromkeys(e for e in own if is_batch_estimator(e)):  # (in order, once each)
        for policy in np.unique(scope[own == estimator]):
            batch = (own == estimator) & (scope == policy)
            adv[batch] = np.asarray(group_advantages(rewards[batch], live[batch], estimator, agent[batch]))
    return adv


def score_groups(run: Run, samples, step: int, chosen: np.ndarray | None = None) -> Groups:
    """Advantages and filters of step `step`'s `samples` (all of them, or those of some policies alone:
    each group's figures, and the filters ranking within a policy or an agent, depend on its own scope
    only); the agents the step does not train (`Config.role_schedule`) are left out of `trained`.
    chosen [G] bool: the groups dynamic sampling picked; the others are neither kept nor ranked."""
    c = run.config
    rewards, mask = step_rewards(run, samples)
    if c.reference.lumped_groups and c.rollout.tree and samples.num_groups:
        return _lumped_scores(run, samples, step, rewards, mask, chosen)
    mixed = samples.agent < 0  # a group of several agents' samples (plain GRPO by task): a scope of its own
    live = mask if chosen is None else mask & jnp.asarray(chosen)[:, None]
    adv = estimate_advantages(run, rewards, mask, live, samples.agent)
    scope = {"policy": np.where(mixed, len(run.policies), run.policy_of_agent[samples.agent]),
             "agent": np.where(mixed, len(run.workflow.agents), samples.agent), "batch": None}[c.algo.filter_scope]
    filtering = c.rollout.tree or c.algo.filter_plain  # plain GRPO keeps every group unless asked (as the reference)
    low_mean, zero_var = (c.algo.drop_low_mean_frac, c.algo.drop_zero_variance) if filtering else (0.0, False)
    keep = np.asarray(group_filter(rewards, live, low_mean, zero_var, scope))
    trains = np.array(c.role_schedule.trains([a.name for a in run.workflow.agents], step))
    trained = keep[:, None] & trains[samples.sample_agent]
    if c.algo.drop_overlong:
        trained &= samples.response_len < budgets(run, samples)
    return Groups(adv, keep, trained)


def _lumped_scores(run: Run, samples, step: int, rewards, mask, chosen) -> Groups:
    """`score_groups` over the reference's lumped groups (`lumped_ids`): each lumped group's advantages
    and filter verdict given back to every one of its rows."""
    c = run.config
    ids = lumped_ids(samples, c.rollout.k)
    live = np.asarray(mask) if chosen is None else np.asarray(mask) & np.asarray(chosen)[:, None]
    joined, where = lump(np.asarray(rewards, np.float32), ids)
    joined_mask, _ = lump(np.asarray(mask, bool), ids, False)
    joined_live, _ = lump(live, ids, False)
    first = np.array([np.flatnonzero(ids == i)[0] for i in range(joined.shape[0])])
    adv = estimate_advantages(run, jnp.asarray(joined), jnp.asarray(joined_mask), jnp.asarray(joined_live),
                              samples.agent[first])  # a lumped group is of one agent too
    scope = {"policy": run.policy_of_agent[samples.agent[first]], "agent": samples.agent[first],
             "batch": None}[c.algo.filter_scope]
    keep = np.asarray(group_filter(jnp.asarray(joined), jnp.asarray(joined_live), c.algo.drop_low_mean_frac,
                                   c.algo.drop_zero_variance, scope))[ids]
    trains = np.array(c.role_schedule.trains([a.name for a in run.workflow.agents], step))
    trained = keep[:, None] & trains[samples.sample_agent]
    if c.algo.drop_overlong:
        trained &= samples.response_len < budgets(run, samples)
    return Groups(adv.reshape(-1)[where], keep, trained)


def batch_of(run: Run, step: int, samples, groups: Groups, policy: int) -> PolicyBatch | None:
    """One policy's batch of the step (None: nothing of it kept). Its mini-batch order comes from
    (seed, step, policy) alone, so it is the same whether built with the others or on its own."""
    c = run.config
    rng = np.random.default_rng([c.train.seed, step] + ([policy] if policy else []))
    return policy_batch(samples, groups.adv, groups.trained, run.policy_of_agent == policy, c.optim.mini_batch_size,
                        None if c.reference.unshuffled_minibatches else rng, Scoring.of(run.scored_as))
