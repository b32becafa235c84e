"""The advantage estimators (docs/guides/estimators.md) against plain NumPy loops, through score_groups
(what "the batch" of a batch estimator is) and through the config and a short training run."""
import math
import os
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

from atgrpo_jax.algo.advantages import BATCH_ADVANTAGES, estimator_names, group_advantages, is_batch_estimator

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "train"))
from tiny_config import tiny  # noqa: E402

EPS = 1e-6
NEW = ("rloo", "magrpo", "reinforce_pp", "dr_mas")


def live_of(mask, g):
    return [i for i in range(mask.shape[1]) if mask[g, i]]


def np_rloo(rewards, mask, agent=None):
    out = np.zeros(rewards.shape)
    for g in range(rewards.shape[0]):
        idx = live_of(mask, g)
        if len(idx) < 2:
            continue
        for i in idx:
            others = [rewards[g, j] for j in idx if j != i]
            out[g, i] = rewards[g, i] - sum(others) / len(others)
    return out


def np_magrpo(rewards, mask, agent=None):
    out = np.zeros(rewards.shape)
    for g in range(rewards.shape[0]):
        idx = live_of(mask, g)
        if len(idx) < 2:
            continue
        mean = sum(rewards[g, i] for i in idx) / len(idx)
        for i in idx:
            out[g, i] = rewards[g, i] - mean
    return out


def np_reinforce_pp(rewards, mask, agent=None):
    centered = {}
    for g in range(rewards.shape[0]):
        idx = live_of(mask, g)
        if len(idx) < 2:
            continue
        mean = sum(rewards[g, i] for i in idx) / len(idx)
        for i in idx:
            centered[g, i] = rewards[g, i] - mean
    out = np.zeros(rewards.shape)
    n = len(centered)
    if n < 2:
        return out
    mean = sum(centered.values()) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in centered.values()) / (n - 1))
    for (g, i), v in centered.items():
        out[g, i] = (v - mean) / (std + EPS)
    return out


def np_dr_mas(rewards, mask, agent):
    std = {}
    for a in set(agent.tolist()):
        values = [rewards[g, i] for g in range(rewards.shape[0]) if agent[g] == a for i in live_of(mask, g)]
        if len(values) < 2:
            std[a] = 0.0
            continue
        mean = sum(values) / len(values)
        std[a] = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    out = np.zeros(rewards.shape)
    for g in range(rewards.shape[0]):
        idx = live_of(mask, g)
        if len(idx) < 2:
            continue
        mean = sum(rewards[g, i] for i in idx) / len(idx)
        for i in idx:
            out[g, i] = (rewards[g, i] - mean) / (std[agent[g]] + EPS)
    return out


REFERENCE = {"rloo": np_rloo, "magrpo": np_magrpo, "reinforce_pp": np_reinforce_pp, "dr_mas": np_dr_mas}


def random_groups(seed, g=80, k=6, agents=3):
    """[G, K] rewards at each agent's own scale, random masks; groups with 0 and 1 live samples, groups
    whose rewards are all equal, and 0/1 rewards in some; agent [G] in -1 .. agents - 1."""
    rng = np.random.RandomState(seed)
    agent = rng.randint(-1, agents, size=g)
    scale = np.array([1.0, 10.0, 0.1, 3.0])[agent + 1]
    rewards = (rng.randn(g, k) * scale[:, None] + agent[:, None]).astype(np.float32)
    rewards[:8] = rng.randint(0, 2, size=(8, k))  # success rewards
    rewards[8:12] = 2.5  # no spread
    mask = rng.rand(g, k) > 0.35
    mask[12:18] = False  # finished tasks: no live sample
    mask[18:24] = False
    mask[18:24, rng.randint(0, k)] = True  # one live sample
    return rewards, mask, agent


@pytest.mark.parametrize("estimator", NEW)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_estimator_equals_a_numpy_loop(estimator, seed):
    rewards, mask, agent = random_groups(seed)
    got = np.asarray(group_advantages(jnp.asarray(rewards), jnp.asarray(mask), estimator, agent))
    want = REFERENCE[estimator](rewards.astype(np.float64), mask, agent)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    assert np.all(got[~mask] == 0) and np.all(got[12:24] == 0)  # masked samples, groups of 0 or 1 live
    assert np.isfinite(got).all()


def test_estimators_are_of_the_right_kind_and_rloo_is_unscaled():
    assert set(NEW) <= set(estimator_names()) and {"grpo", "drgrpo"} <= set(estimator_names())
    assert set(BATCH_ADVANTAGES) == {"reinforce_pp", "dr_mas"}
    assert not any(is_batch_estimator(n) for n in ("grpo", "drgrpo", "rloo", "magrpo"))
    r = jnp.array([[1.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(group_advantages(r, jnp.ones((1, 4), bool), "rloo"), [[1.0, -1 / 3, -1 / 3, -1 / 3]],
                               rtol=1e-6)
    mask = jnp.array([[True, True, True, False]])  # the masked sample is no one's baseline
    np.testing.assert_allclose(group_advantages(r, mask, "rloo"), [[1.0, -0.5, -0.5, 0.0]], rtol=1e-6)


@pytest.mark.parametrize("estimator", ["reinforce_pp", "dr_mas"])
def test_batch_estimators_give_zero_not_nan_without_signal(estimator):
    for rewards, mask in [(np.ones((3, 4)), np.ones((3, 4), bool)),  # no spread anywhere
                          (np.arange(12.0).reshape(3, 4), np.eye(3, 4, dtype=bool)),  # groups of one
                          (np.zeros((0, 4)), np.zeros((0, 4), bool))]:  # no group
        got = np.asarray(group_advantages(jnp.asarray(rewards, jnp.float32), jnp.asarray(mask), estimator,
                                          np.zeros(len(rewards), np.int32)))
        assert got.shape == rewards.shape and np.all(got == 0)


def test_dr_mas_gives_each_agent_its_own_scale():
    """Two agents with the same groups at reward scales 1 and 100 get the same advantages."""
    rewards, mask, _ = random_groups(3, g=20, agents=1)
    both = np.concatenate([rewards, 100 * rewards])
    agent = np.repeat([0, 1], 20)
    got = np.asarray(group_advantages(jnp.asarray(both), jnp.asarray(np.concatenate([mask, mask])), "dr_mas", agent))
    np.testing.assert_allclose(got[:20], got[20:], rtol=1e-4, atol=1e-5)


# score_groups: three agents, a and b on policy 0, c on policy 1


AGENTS = ("a", "b", "c")


def fake_run(**algo):
    from atgrpo_jax.train.config import base_config
    from atgrpo_jax.train.validate import resolve

    c = base_config()
    c.algo.update(**algo)
    return types.SimpleNamespace(config=resolve(c, weights=False), policies=[0, 1], policy_of_agent=np.array([0, 0, 1]),
                                 sampling=[types.SimpleNamespace(max_new_tokens=16)] * 3,
                                 workflow=types.SimpleNamespace(agents=[types.SimpleNamespace(name=n) for n in AGENTS]))


def fake_samples(seed, g=40, k=4):
    rewards, mask, _ = random_groups(seed, g=g, k=k)
    agent = np.random.RandomState(seed + 100).randint(0, 3, size=g)
    return types.SimpleNamespace(reward=rewards, mask=mask, agent=agent, sample_agent=np.repeat(agent[:, None], k, 1),
                                 response_len=np.ones((g, k), np.int32), task=np.arange(g) // 3,
                                 turn=np.zeros(g, np.int32), num_groups=g)


def only(samples, rows):
    return types.SimpleNamespace(**{name: value[rows] if isinstance(value, np.ndarray) else int(rows.sum())
                                    for name, value in vars(samples).items()})


@pytest.mark.parametrize("estimator", ["reinforce_pp", "dr_mas"])
def test_a_batch_estimators_batch_is_each_policys_groups_of_the_step(estimator):
    from atgrpo_jax.train.groups import score_groups

    run, samples = fake_run(advantage=estimator), fake_samples(4)
    adv = score_groups(run, samples, 1).adv
    for policy in (0, 1):
        rows = run.policy_of_agent[samples.agent] == policy
        want = REFERENCE[estimator](samples.reward[rows].astype(np.float64), samples.mask[rows], samples.agent[rows])
        np.testing.assert_allclose(adv[rows], want, rtol=2e-5, atol=2e-5)
        # a policy's advantages without the other policy's samples (an early update) are the same
        np.testing.assert_array_equal(score_groups(run, only(samples, rows), 1).adv, adv[rows])
    everything = REFERENCE[estimator](samples.reward.astype(np.float64), samples.mask, samples.agent)
    if estimator == "reinforce_pp":  # not whitened over both policies' groups together
        assert not np.allclose(adv, everything, atol=1e-3)


def test_role_estimators_of_both_kinds_mix_in_one_step():
    """Agent a by reinforce_pp (its batch: policy 0's groups that use it, a's alone, as b uses rloo),
    b by the run's rloo, c by dr_mas."""
    from atgrpo_jax.train.groups import score_groups

    run, samples = fake_run(advantage="rloo", role_advantage={"a": "reinforce_pp", "c": "dr_mas"}), fake_samples(5)
    adv = score_groups(run, samples, 1).adv
    r, m = samples.reward.astype(np.float64), samples.mask
    for agent, reference in enumerate([np_reinforce_pp, np_rloo, np_dr_mas]):
        rows = samples.agent == agent
        np.testing.assert_allclose(adv[rows], reference(r[rows], m[rows], samples.agent[rows]), rtol=2e-5, atol=2e-5)
    grpo = score_groups(fake_run(advantage="grpo"), samples, 1).adv
    with_role = score_groups(fake_run(advantage="grpo", role_advantage={"c": "magrpo"}), samples, 1).adv
    rows = samples.agent == 2
    np.testing.assert_array_equal(with_role[~rows], grpo[~rows])
    np.testing.assert_allclose(with_role[rows], np_magrpo(r[rows], m[rows]), rtol=2e-5, atol=2e-5)


def test_dynamic_samplings_left_out_groups_are_outside_the_batch():
    from atgrpo_jax.train.groups import score_groups

    run, samples = fake_run(advantage="reinforce_pp"), fake_samples(6)
    chosen = np.random.RandomState(0).rand(len(samples.agent)) > 0.4
    adv = score_groups(run, samples, 1, chosen).adv
    assert np.all(adv[~chosen] == 0)
    for policy in (0, 1):
        rows = (run.policy_of_agent[samples.agent] == policy) & chosen
        want = np_reinforce_pp(samples.reward[rows].astype(np.float64), samples.mask[rows])
        np.testing.assert_allclose(adv[rows], want, rtol=2e-5, atol=2e-5)


def test_the_reference_lumped_groups_feed_a_batch_estimator_their_joined_rows():
    from atgrpo_jax.train.groups import lump, lumped_ids, score_groups

    run, samples = fake_run(advantage="dr_mas"), fake_samples(7, g=24)
    samples.agent = np.repeat(np.arange(3), 8)  # lumped groups (task // K, agent, turn) of one agent each
    samples.sample_agent = np.repeat(samples.agent[:, None], 4, 1)
    c = run.config  # as resolved, but with the reference's lumped groups on
    run.config = types.SimpleNamespace(**{f: getattr(c, f) for f in ("algo", "rollout", "role_schedule")},
                                       reference=types.SimpleNamespace(lumped_groups=True))
    adv = score_groups(run, samples, 1).adv
    ids = lumped_ids(samples, run.config.rollout.k)
    joined, where = lump(samples.reward.astype(np.float64), ids)
    joined_mask, _ = lump(samples.mask, ids, False)
    first = np.array([np.flatnonzero(ids == i)[0] for i in range(joined.shape[0])])
    agent = samples.agent[first]
    want = np.zeros(joined.shape)
    for policy in (0, 1):
        rows = run.policy_of_agent[agent] == policy
        want[rows] = np_dr_mas(joined[rows], joined_mask[rows], agent[rows])
    np.testing.assert_allclose(adv, want.reshape(-1)[where], rtol=2e-5, atol=2e-5)


# through the config and a training run


@pytest.mark.parametrize("name", NEW)
def test_each_name_resolves_as_the_runs_and_a_roles_estimator(name):
    from atgrpo_jax import cli
    from atgrpo_jax.train.validate import resolve

    c = tiny()
    cli.apply_overrides(c, [("algo.advantage", name), ("algo.role_advantage.planner", name)])
    resolved = resolve(c, weights=False)
    assert resolved.algo.advantage == name and resolved.algo.role_advantage == {"planner": name}


def test_an_unknown_name_lists_both_kinds():
    from atgrpo_jax.train.config import ConfigError
    from atgrpo_jax.train.validate import resolve

    with pytest.raises(ConfigError, match=r"algo.role_advantage.planner: unknown 'dr_mass' \(did you mean 'dr_mas'\?\)"
                                          r"; known: .*rloo.*reinforce_pp"):
        resolve(tiny(**{"algo.role_advantage": {"planner": "dr_mass"}}), weights=False)
    with pytest.raises(KeyError, match=r"unknown 'reinforce_p' \(did you mean 'reinforce_pp'\?\).*batch-level: "
                                       r"dr_mas, reinforce_pp"):
        group_advantages(jnp.zeros((1, 2)), jnp.ones((1, 2), bool), "reinforce_p")


def finite_losses(workdir):
    from atgrpo_jax.train.metrics_files import read_metrics

    rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2]
    return all(math.isfinite(r["loss"]) for r in rows) and all(math.isfinite(r["adv_abs_mean"]) for r in rows)


def test_two_demo_steps_train_with_rloo_and_a_batch_estimator_for_the_planner(tmp_path):
    from atgrpo_jax.train import loop

    loop.run_training(tiny(**{"train.steps": 2, "train.eval_every": 0, "train.checkpoint_every": 0,
                              "algo.advantage": "rloo", "algo.role_advantage": {"planner": "reinforce_pp"}}),
                      str(tmp_path / "run"))
    assert finite_losses(str(tmp_path / "run"))


@pytest.mark.full  # tiers.py: ~9 s; the rloo + reinforce_pp run above keeps the family in the default tier
def test_two_demo_steps_train_with_dr_mas(tmp_path):
    from atgrpo_jax.train import loop

    loop.run_training(tiny(**{"train.steps": 2, "train.eval_every": 0, "train.checkpoint_every": 0,
                              "algo.advantage": "dr_mas", "algo.role_advantage": {"executor": "magrpo"}}),
                      str(tmp_path / "run"))
    assert finite_losses(str(tmp_path / "run"))


@pytest.mark.parametrize("estimator", sorted(estimator_names()))
def test_a_per_group_counterfactual_baseline_changes_no_estimators_advantages(estimator):
    """Why there is no `counterfactual` estimator under tree sampling (docs/guides/estimators.md): a
    group's K samples differ only in its agent's action, so "that agent removed" is one outcome per group,
    and subtracting one number per group (the difference reward r - R_without) moves no advantage."""
    rewards, mask, agent = random_groups(4)
    without = np.random.RandomState(5).randn(len(rewards), 1).astype(np.float32) * 3.0
    plain, credited = (np.asarray(group_advantages(jnp.asarray(r), jnp.asarray(mask), estimator, agent))
                       for r in (rewards, rewards - without))
    if estimator == "dr_mas":  # its per-agent scale is taken around the agent's mean over groups: the
        # shift moves that scale, not the direction of any group's advantages
        plain, credited = (a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12) for a in (plain, credited))
    np.testing.assert_allclose(credited, plain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("estimator", sorted(estimator_names()))
@pytest.mark.parametrize("k", [3, 5, 6])
def test_a_group_of_equal_rewards_gets_exactly_zero(estimator, k):
    """Equal rewards carry no signal, whatever float32 makes of their mean (K not a power of two)."""
    rewards = np.repeat(np.random.RandomState(k).uniform(-2, 2, size=(500, 1)), k, axis=1).astype(np.float32)
    rewards[:, 0] = np.where(np.arange(500) % 7 == 0, 9.0, rewards[:, 0])  # a first sample masked out below
    mask = np.ones(rewards.shape, bool)
    mask[::7, 0] = False
    got = np.asarray(group_advantages(jnp.asarray(rewards), jnp.asarray(mask), estimator, np.zeros(500, np.int32)))
    assert np.all(got == 0)


def test_ccpos_event_bonus_on_pass_fail_outcomes_leaves_grpo_unchanged():
    """CCPO's bonus (+lambda where the team passed and the agent-removed baseline failed, -lambda where it
    failed and the baseline passed) on +-1 outcomes with one baseline per group is an increasing affine
    map of each group's rewards: GRPO's advantages are the same."""
    rng = np.random.RandomState(6)
    joint = rng.choice([-1.0, 1.0], size=(40, 6)).astype(np.float32)
    baseline = rng.uniform(-1, 1, size=(40, 1))  # the group mean of the agent-removed outcomes
    bonus = ((joint > 0) & (baseline < 0)).astype(np.float32) - ((joint < 0) & (baseline > 0))
    mask = jnp.ones(joint.shape, bool)
    plain, credited = (np.asarray(group_advantages(jnp.asarray(r), mask, "grpo")) for r in (joint, joint + 0.2 * bonus))
    np.testing.assert_allclose(credited, plain, rtol=1e-4, atol=1e-4)
    assert not np.allclose(joint + 0.2 * bonus, joint)  # the bonus did change the rewards
