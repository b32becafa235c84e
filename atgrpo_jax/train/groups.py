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

from atgrpo_jax.algo.advantages import group_advantages, group_filter, overlong_penalty
from atgrpo_jax.train.batch import PolicyBatch, Scoring, policy_batch
from atgrpo_jax.train.roles import trained_agents
from atgrpo_jax.train.setup import Run


def group_policies(run: Run, samples, step: int) -> np.ndarray:
    """[G] the policy each group trains at `step` (-1: none, its agent is not trained then; plain GRPO's
    mixed groups: 0)."""
    trained = np.array(trained_agents(run.config, [a.name for a in run.workflow.agents], step))
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
    return jnp.asarray(samples.reward) + penalty, jnp.asarray(samples.mask)


def score_groups(run: Run, samples, step: int, chosen: np.ndarray | None = None) -> Groups:
    """Advantages and filters of step `step`'s `samples` (all of them, or those of some policies alone:
    each group's figures, and the filters ranking within a policy or an agent, depend on its own scope
    only); the agents the step does not train (`roles.trained_agents`) are left out of `trained`.
    chosen [G] bool: the groups dynamic sampling picked; the others are neither kept nor ranked."""
    c = run.config
    rewards, mask = step_rewards(run, samples)
    adv = np.array(group_advantages(rewards, mask, c.algo.advantage))  # (a copy: written below)
    for name, estimator in c.algo.role_advantage.items():  # a group of one agent: that agent's estimator
        mine = samples.agent == [a.name for a in run.workflow.agents].index(name)
        if estimator != c.algo.advantage and mine.any():
            adv[mine] = np.asarray(group_advantages(rewards[mine], mask[mine], estimator))
    mixed = samples.agent < 0  # a group of several agents' samples (plain GRPO by task): a scope of its own
    scope = {"policy": np.where(mixed, len(run.policies), run.policy_of_agent[samples.agent]),
             "agent": np.where(mixed, len(run.workflow.agents), samples.agent), "batch": None}[c.algo.filter_scope]
    filtering = c.rollout.tree or c.algo.filter_plain  # plain GRPO keeps every group unless asked (as the reference)
    low_mean, zero_var = (c.algo.drop_low_mean_frac, c.algo.drop_zero_variance) if filtering else (0.0, False)
    live = mask if chosen is None else mask & jnp.asarray(chosen)[:, None]
    keep = np.asarray(group_filter(rewards, live, low_mean, zero_var, scope))
    trains = np.array(trained_agents(c, [a.name for a in run.workflow.agents], step))
    trained = keep[:, None] & trains[samples.sample_agent]
    if c.algo.drop_overlong:
        trained &= samples.response_len < budgets(run, samples)
    return Groups(adv, keep, trained)


def batch_of(run: Run, step: int, samples, groups: Groups, policy: int) -> PolicyBatch | None:
    """One policy's batch of the step (None: nothing of it kept). Its mini-batch order comes from
    (seed, step, policy) alone, so it is the same whether built with the others or on its own."""
    c = run.config
    rng = np.random.default_rng([c.train.seed, step] + ([policy] if policy else []))
    return policy_batch(samples, groups.adv, groups.trained, run.policy_of_agent == policy, c.optim.mini_batch_size,
                        None if c.reference.unshuffled_minibatches else rng, Scoring.of(run.scored_as))
