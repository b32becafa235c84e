"""The reference's tree engine (docs/paper.md, "Recipes", X3) as switches: a turn's later agent scored on
copies of the first agent's branch (one shared reward), its samples dropped in a turn that ends the episode,
and groups lumped over K consecutive tasks; each switch's outcome against the paper's tree."""
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from atgrpo_jax.envs.workflow import Agent, StepOut, branch
from atgrpo_jax.rollout.cohort import ReferenceTree
from atgrpo_jax.rollout.samples import SampleOut
from atgrpo_jax.rollout.tree import RolloutInputs, TreeRollout
from atgrpo_jax.train.groups import score_groups
from atgrpo_jax.train.validate import resolve
from tiny_config import tiny

K = 3
ANSWERS = {0: ["1", "4", "2"], 1: ["9", "0", "5"]}  # per agent, branch k's reply (its reward); 9 ends the episode


class Scored:
    """Two agents whose reward is the number they reply; the second's 9 ends the episode."""

    name, max_turns, splits, test_splits = "scored", 2, {}, ()
    agents = (Agent("first", str), Agent("second", str))

    def reset(self, task_ids, split):
        return {"done": np.zeros(len(task_ids), bool)}

    def prompts(self, state, agent, turn):
        return [[{"role": "user", "content": "go"}]] * len(state["done"])

    def step(self, state, agent, turn, responses):
        values = np.array([[float(t) for t in row] for row in responses], np.float32)
        out = branch(state, len(responses[0]))
        out["done"] = out["done"] | ((agent == 1) & (values >= 9))
        return StepOut(out, values, np.zeros_like(values))

    def done(self, state):
        return state["done"]

    def success(self, state):
        return state["done"]


def scripted(replies: dict):
    """A sample function whose branch k of every prompt of agent a replies replies[a][k]."""
    def sample_fn(agent, prompts, k, keys):
        texts = replies[agent] * len(prompts)
        n = len(texts)
        return SampleOut.from_rows(np.ones((n, 1), np.int32), np.ones(n, np.int32), np.zeros((n, 1)), texts, 1)
    return sample_fn


sample_fn = scripted(ANSWERS)


def rollout(**switches):
    inputs = RolloutInputs(Scored(), sample_fn, lambda m, a: [1, 2, 3], [0], "train", max_turns=2, alpha=1.0,
                           key=jax.random.key(0))
    samples, episodes = TreeRollout(K, ReferenceTree(**switches)).begin(inputs).run()
    second = [g for g in range(samples.num_groups) if samples.agent[g] == 1 and samples.mask[g].any()]
    return samples, second, episodes


def test_x3_the_later_agent_shares_the_first_agents_branch_reward_under_the_reference():
    samples, second, episodes = rollout()
    assert samples.reward[second[0]].tolist() == [9, 0, 5] and int(episodes.turns[0]) == 1  # 9 ended it
    samples, second, episodes = rollout(shared_later_reward=True)
    assert [samples.reward[g].tolist() for g in second] == [[0, 0, 0]] * 2  # slot 1, the first agent's pick
    assert [int(samples.selected[g]) for g in second] == [1, 1] and int(episodes.turns[0]) == 2


def test_x3_a_turn_that_ends_the_episode_keeps_only_its_first_agents_samples_under_the_reference():
    samples, second, _ = rollout()
    assert len(second) == 1  # the paper's: the second agent's winning turn is trained on
    samples, second, episodes = rollout(drop_after_done=True)
    assert second == [] and bool(episodes.success[0])  # it still ended the episode; its samples are gone
    assert sum(int(samples.mask[g].sum()) for g in range(samples.num_groups)) == K  # the first agent's three


@pytest.mark.parametrize("recipe", ["paper", "reference"])
def test_x3_groups_of_k_consecutive_tasks_are_lumped_under_the_reference(recipe):
    c = resolve(tiny(recipe=recipe, **{"algo.drop_low_mean_frac": 0.0}))
    k = c.rollout.k
    rewards = np.array([[1, 1], [0, 0], [2, 0], [0, 2]], np.float32)  # tasks 0..3, one agent, turn 0
    samples = SimpleNamespace(reward=rewards, mask=np.ones((4, k), bool), response_len=np.ones((4, k), int),
                              task=np.arange(4), agent=np.zeros(4, int), turn=np.zeros(4, int),
                              sample_agent=np.zeros((4, k), int), num_groups=4)
    run = SimpleNamespace(config=c, sampling=[SimpleNamespace(max_new_tokens=8)] * 2, policies=[None],
                          policy_of_agent=np.zeros(2, int), workflow=SimpleNamespace(agents=Scored.agents))
    adv = score_groups(run, samples, 1).adv
    if recipe == "paper":  # each task its own group: the first two have no variance
        np.testing.assert_allclose(adv[:2], 0.0)
        np.testing.assert_allclose(adv[2:], [[0.7071, -0.7071], [-0.7071, 0.7071]], atol=1e-4)
    else:  # tasks 0 and 1 are one group of four, tasks 2 and 3 another
        np.testing.assert_allclose(adv[:2], [[0.866, 0.866], [-0.866, -0.866]], atol=1e-3)
        np.testing.assert_allclose(adv[2:], [[0.866, -0.866], [-0.866, 0.866]], atol=1e-3)
