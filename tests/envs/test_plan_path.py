"""Plan-Path: JAX stepper vs the plain-Python reference, generator, BFS optimum, notation."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # grid_helpers (importlib import mode)
from grid_helpers import batched_reset, compare_with_reference, level  # noqa: E402

from atgrpo_jax.envs import grid, plan_path, solvers  # noqa: E402
from atgrpo_jax.envs.reference_steppers import PlanPathRef  # noqa: E402

P = plan_path.Params()
N_LEVELS = 1500


@pytest.fixture(scope="module")
def train_levels():
    return batched_reset(plan_path, P, N_LEVELS, seed=0, split="train")


@pytest.fixture(scope="module")
def test_levels():
    return batched_reset(plan_path, P, 300, seed=0, split="test")


def _actions(states, rng, length=24):
    """Random moves (with pads and invalid codes); a third start with an optimal path."""
    n = len(np.asarray(states.done))
    acts = rng.integers(-1, 5, size=(n, length))
    for i in range(0, n, 3):
        s = level(states, i)
        path = solvers.plan_path_shortest(s.walls, s.pos, s.goal)
        if i % 2 == 0:  # one extra move or a detour breaks optimality on purpose
            path = [grid.LEFT, grid.RIGHT][: 1 + (i % 4 == 0)] + path
        acts[i, : min(len(path), length)] = path[:length]
    return acts


def test_generated_levels_are_solvable_with_the_stored_optimum(train_levels):
    for i in range(N_LEVELS):
        s = level(train_levels, i)
        dist = solvers.plan_path_distance(s.walls, s.start, s.goal)
        assert dist is not None and dist >= 1, plan_path.render(s)
        assert int(s.optimal) == dist
        assert not s.walls[tuple(s.start)] and not s.walls[tuple(s.goal)]
    # walls appear at about the configured rate
    assert abs(np.asarray(train_levels.walls).mean() - P.wall_prob) < 0.02


def test_jax_stepper_matches_reference(train_levels):
    rng = np.random.default_rng(0)
    acts = _actions(train_levels, rng)
    successes = compare_with_reference(plan_path, PlanPathRef, P, train_levels, acts)
    assert successes > N_LEVELS // 5  # the optimal prefixes reach the goal


def test_hand_computed_rewards_optimal_bonus_and_timeout():
    params = plan_path.Params(height=3, width=3, max_steps=5)
    s = plan_path.from_ascii("S.#\n..#\n..G", params)
    assert int(s.optimal) == 4
    # D D R R: each move -0.01 + (0.99 * Phi' - Phi); the last adds +1 goal and +0.5 optimal
    _, r_opt, done, info = plan_path.step(s, jnp.array([1, 1, 3, 3, -1]), params)
    assert bool(done) and bool(info["success"])
    np.testing.assert_allclose(info["rewards"], [1.02, 1.01, 1.00, 2.49, 0.0], atol=1e-6)
    # R L D D R R: same end, two moves longer, no optimal bonus
    _, r_long, _, _ = plan_path.step(s, jnp.array([3, 2, 1, 1, 3, 3]), params._replace(max_steps=100))
    assert float(r_long) == pytest.approx(1.02 - 0.97 + 1.02 + 1.01 + 1.00 + 1.99, abs=1e-5)
    # five wasted moves (-0.1 + 0.04 shaping each) end the episode with r_fail = -1
    new, _, done, info = plan_path.step(s, jnp.array([0, 0, 0, 0, 0, 0]), params)
    assert bool(done) and not bool(info["success"]) and int(new.steps) == 5 and int(new.invalid) == 5
    np.testing.assert_allclose(info["rewards"], [-0.06] * 4 + [-1.06, 0.0], atol=1e-6)


def test_scalar_action_equals_length_one_array(train_levels):
    s = jax.tree.map(lambda x: x[:6], train_levels)
    acts = jnp.arange(-1, 5)
    scalar = jax.jit(jax.vmap(lambda st, a: plan_path.step(st, a, P)))(s, acts)
    array = jax.jit(jax.vmap(lambda st, a: plan_path.step(st, a, P)))(s, acts[:, None])
    for x, y in zip(jax.tree.leaves(scalar[:3]), jax.tree.leaves(array[:3])):
        assert np.array_equal(x, y)


def test_train_valid_and_test_levels_are_disjoint(train_levels, test_levels):
    def bucket(states, i):
        s = level(states, i)
        return grid.level_bucket_np([s.walls, s.start, s.goal])

    valid_levels = batched_reset(plan_path, P, 300, seed=0, split="valid")
    assert all(bucket(train_levels, i) >= 2 for i in range(300))
    assert all(bucket(valid_levels, i) == 1 for i in range(300))
    assert all(bucket(test_levels, i) == 0 for i in range(300))
    train = {plan_path.render(level(train_levels, i)) for i in range(N_LEVELS)}
    valid = {plan_path.render(level(valid_levels, i)) for i in range(300)}
    test = {plan_path.render(level(test_levels, i)) for i in range(300)}
    assert len(test) == 300 and len(valid) == 300 and not train & test and not train & valid and not valid & test
    # the JAX hash agrees with its NumPy mirror
    s = level(train_levels, 7)
    assert int(grid.level_bucket([jnp.asarray(s.walls), jnp.asarray(s.start), jnp.asarray(s.goal)])) == bucket(
        train_levels, 7)


def test_ascii_round_trip_and_errors(train_levels):
    for i in range(50):
        text = plan_path.render(level(train_levels, i))
        assert plan_path.render(plan_path.from_ascii(text)) == text
    on_goal = plan_path.from_ascii("*.\n..", plan_path.Params(height=2, width=2))
    assert bool(on_goal.done) and bool(on_goal.success)
    assert plan_path.render(on_goal) == "*.\n.."
    for bad in ["S.\n.G", "S..\n.X.\n..G", "S..\n...\n...", "S.G\n...\n..G", "S.#\n.#.\n#.G"]:
        with pytest.raises(ValueError):
            plan_path.from_ascii(bad, plan_path.Params(height=3, width=3))
