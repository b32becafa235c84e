"""Counterfactual credit (CCPO) under tree sampling (atgrpo_jax/rollout/counterfactual.py): each branch's
team outcome with the turn's later agents' chosen responses replayed on it, checked against a plain
Python tree rollout of a counting game, then the estimator, the trainer's reward swap and the config rule."""
import jax
import numpy as np
import pytest

from atgrpo_jax.algo.advantages import group_advantages
from atgrpo_jax.envs.workflow import Agent, StepOut, branch
from atgrpo_jax.errors import ConfigError
from atgrpo_jax.rollout.tree import RolloutInputs, TreeRollout
from atgrpo_jax.train.groups import step_rewards
from atgrpo_jax.train.setup import build_run
from atgrpo_jax.train.step import rollout_step, train_step
from atgrpo_jax.train.validate import resolve
from test_reference_tree import scripted
from test_teams import team
from tiny_config import tiny

K, TARGET, ALPHA, TURNS = 3, 6, 0.5, 2
REPLIES = {0: ["1", "4", "2"], 1: ["3", "0", "2"], 2: ["1", "-1", "0"]}  # per agent, branch k's number


class Counting:
    """Agents add numbers to a running total; the team's reward is -|total - TARGET|, reaching it ends the
    episode, and an agent's own reward is its number / 10 (so the best branch is not the team's best)."""

    name, max_turns, splits, test_splits = "counting", TURNS, {}, ()

    def __init__(self, agents: int):
        self.agents = tuple(Agent(f"a{i}", str) for i in range(agents))

    def reset(self, task_ids, split):
        return {"total": np.array([t % 4 for t in task_ids], np.float32), "done": np.zeros(len(task_ids), bool)}

    def prompts(self, state, agent, turn):
        return [[{"role": "user", "content": "add"}]] * len(state["done"])

    def step(self, state, agent, turn, responses):
        values = np.array([[float(t) if t else 0.0 for t in row] for row in responses], np.float32)
        out = branch(state, len(responses[0]))
        out["total"] = np.where(out["done"], out["total"], out["total"] + values)
        out["done"] = out["done"] | (out["total"] == TARGET)
        return StepOut(out, values / 10, -np.abs(out["total"] - TARGET))

    def done(self, state):
        return state["done"]

    success = done  # the target reached


sample_fn = scripted(REPLIES)


def brute_force(start: float, agents: int) -> dict:
    """{(turn, agent): (rewards [K], counterfactual rewards [K])} of one task, by playing the tree in Python:
    a branch's counterfactual outcome is its total after the later agents' chosen numbers of the turn."""
    total, done, out = start, False, {}
    for turn in range(TURNS):
        stages = []  # (agent, each branch's (total, done), the chosen number)
        for a in range(agents):
            if done:
                break
            branches = [(total + float(v), total + float(v) == TARGET) for v in REPLIES[a]]
            reward = [float(v) / 10 + ALPHA * -abs(t - TARGET) for v, (t, _) in zip(REPLIES[a], branches)]
            best = int(np.argmax(reward))
            stages.append((a, branches, float(REPLIES[a][best]), reward))
            total, done = branches[best]
        for i, (a, branches, _, reward) in enumerate(stages):
            cf = []
            for v, (t, d) in zip(REPLIES[a], branches):
                for _, _, chosen, _ in stages[i + 1:]:  # the later agents that acted, with their choices
                    if not d:
                        t, d = t + chosen, t + chosen == TARGET
                cf.append(float(v) / 10 + ALPHA * -abs(t - TARGET))
            out[(turn, a)] = (reward, cf)
    return out


def rollout(agents: int, counterfactual: bool = True, tasks=(0, 1, 2, 3), **schedule):
    inputs = RolloutInputs(Counting(agents), sample_fn, lambda m, a: [1, 2, 3], list(tasks), "train",
                           max_turns=TURNS, alpha=ALPHA, key=jax.random.key(0), counterfactual=counterfactual,
                           **schedule)
    return TreeRollout(K).begin(inputs).run()


@pytest.mark.parametrize("agents", [2, 3])
def test_each_branch_is_credited_with_the_later_agents_chosen_responses_replayed_on_it(agents):
    samples, _ = rollout(agents)
    checked = 0
    for task in range(4):
        want = brute_force(task % 4, agents)
        for (turn, a), (reward, cf) in want.items():
            g = [g for g in range(samples.num_groups)
                 if (samples.task[g], samples.agent[g], samples.turn[g]) == (task, a, turn) and samples.mask[g].any()]
            assert len(g) == 1, (task, a, turn)
            np.testing.assert_allclose(samples.reward[g[0]], reward, atol=1e-6)
            np.testing.assert_allclose(samples.counterfactual_reward[g[0]], cf, atol=1e-6, err_msg=str((task, a, turn)))
            checked += 1
    assert checked == int(samples.mask.any(axis=1).sum())  # every live group, each once
    # the credit differs from the reward somewhere, or the test shows nothing
    assert not np.allclose(samples.counterfactual_reward, samples.reward)
    last = samples.agent == agents - 1  # nobody after the turn's last agent: its reward as it is
    np.testing.assert_array_equal(samples.counterfactual_reward[last], samples.reward[last])


def test_the_replay_changes_nothing_else_and_is_off_unless_asked():
    on, episodes_on = rollout(3)
    off, episodes_off = rollout(3, counterfactual=False)
    for name in ("reward", "local_reward", "team_reward", "mask", "selected", "task", "agent", "turn", "text"):
        np.testing.assert_array_equal(getattr(on, name), getattr(off, name), err_msg=name)
    np.testing.assert_array_equal(episodes_on.success, episodes_off.success)
    np.testing.assert_array_equal(off.counterfactual_reward, off.reward)


def test_cohorts_of_the_asynchronous_schedule_give_the_same_credit():
    from atgrpo_jax.rollout.tree import Schedule
    one, _ = rollout(3)
    split, _ = rollout(3, schedule=Schedule(cohorts=2, asynchronous=True))
    np.testing.assert_allclose(split.counterfactual_reward, one.counterfactual_reward)


def test_the_estimator_is_leave_one_out_over_the_sibling_branches():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(6, K)).astype(np.float32)
    m = rng.random((6, K)) > 0.2
    got = np.asarray(group_advantages(r, m, "counterfactual"))
    for g in range(6):
        live = np.flatnonzero(m[g])
        for k in range(K):
            want = r[g, k] - r[g, [j for j in live if j != k]].mean() if m[g, k] and len(live) > 1 else 0.0
            assert got[g, k] == pytest.approx(want, abs=1e-5)


def test_the_trainer_gives_the_counterfactual_agents_their_counterfactual_rewards_and_trains():
    c = resolve(team(roles=3, regime="shared", **{"algo.role_advantage": {"r0": "counterfactual"}}))
    run = build_run(c)
    ro = rollout_step(run, 1, None)
    rewards, _ = step_rewards(run, ro.samples)
    first = ro.samples.sample_agent == 0
    np.testing.assert_allclose(np.asarray(rewards)[first], ro.samples.counterfactual_reward[first])
    np.testing.assert_allclose(np.asarray(rewards)[~first], ro.samples.reward[~first])
    before = [np.asarray(x) for x in jax.tree.leaves(run.policies[0].state.params)]
    train_step(run, 2)
    after = [np.asarray(x) for x in jax.tree.leaves(run.policies[0].state.params)]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))
    assert all(np.isfinite(a).all() for a in after)


def test_counterfactual_credit_needs_tree_sampling():
    with pytest.raises(ConfigError, match="algo.advantage: counterfactual credit .* rollout.tree=True"):
        resolve(tiny(**{"algo.advantage": "counterfactual", "rollout.tree": False}))
