"""Sokoban: JAX stepper vs the plain-Python reference, reverse-play generator, XSB, Boxoban."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # grid_helpers (importlib import mode)
from grid_helpers import batched_reset, batched_step, compare_with_reference, level  # noqa: E402

from atgrpo_jax.envs import grid, sokoban, solvers  # noqa: E402
from atgrpo_jax.envs.reference_steppers import SokobanRef  # noqa: E402

P = sokoban.Params()
N_LEVELS = 1200
BOXOBAN_STEP = batched_step(sokoban, sokoban.BOXOBAN)  # compiled once for both files


@pytest.fixture(scope="module")
def levels():
    return batched_reset(sokoban, P, N_LEVELS, seed=0, split="train")


@pytest.fixture(scope="module")
def solutions(levels):
    out = []
    for i in range(N_LEVELS):
        s = level(levels, i)
        out.append(solvers.sokoban_solve(s.walls, s.goals, s.boxes, s.player))
    return out


def test_generated_levels_are_solvable_and_scrambled(levels, solutions):
    lengths = []
    for i in range(N_LEVELS):
        s = level(levels, i)
        assert solutions[i] is not None, sokoban.render(s)
        lengths.append(len(solutions[i]))
        assert s.boxes.sum() == 1 and s.goals.sum() == 1
        (box,), (goal,) = np.argwhere(s.boxes), np.argwhere(s.goals)
        assert np.abs(box - goal).sum() >= P.min_box_distance
        assert not s.walls[tuple(s.player)] and not s.boxes[tuple(s.player)]
        assert s.walls[0].all() and s.walls[-1].all() and s.walls[:, 0].all() and s.walls[:, -1].all()
        assert not bool(s.done)
    assert np.mean(lengths) > 3  # not only one-push levels
    # the solver's plan really solves the level in the JAX stepper
    plans = grid.pad_actions(solutions[:64], 16)
    _, _, done, info = batched_step(sokoban, P)(jax.tree.map(lambda x: x[:64], levels), jnp.asarray(plans))
    assert np.all(done) and np.all(info["success"])


def test_jax_stepper_matches_reference(levels, solutions):
    rng = np.random.default_rng(1)
    length = 30
    acts = rng.integers(-1, 5, size=(N_LEVELS, length))
    for i in range(0, N_LEVELS, 3):  # solutions, some with a random detour first
        plan = [int(a) for a in rng.integers(0, 4, size=i % 4)] + solutions[i]
        acts[i, : min(len(plan), length)] = plan[:length]
    successes = compare_with_reference(sokoban, SokobanRef, P, levels, acts)
    assert successes > N_LEVELS // 8


def test_timeout_and_box_off_goal_rewards():
    params = P._replace(max_steps=4)
    s = sokoban.from_ascii("######\n#    #\n# *@ #\n#  $.#\n#    #\n######", params)
    # L pushes the box off its goal: -0.01 - 0.5 + 0.1 * (0.99 * -2 - -1); then three wasted U U U.
    # Box (2,2) -> (2,1): its nearest goal is (2,2) at distance 1 (the other box is 1 away from (3,4)).
    step = jax.jit(sokoban.step, static_argnums=2)
    new, _, done, info = step(s, jnp.array([2, 0, 0, 0, 0]), params)
    ref = SokobanRef(s, params)
    expected = ref.step_many([2, 0, 0, 0, 0])
    np.testing.assert_allclose(info["rewards"], expected, atol=1e-6)
    assert expected[0] == pytest.approx(-0.01 - 0.5 + 0.1 * (0.99 * -2 - (-1)))
    assert bool(done) and not bool(info["success"]) and expected[3] < -5 and expected[4] == 0.0
    # walk around and push the other box right onto its goal: solved, +1 and +10 on the last move
    _, _, done, info = step(s, jnp.array([3, 1, 1, 2, 2, 0, 3]), P)
    assert bool(done) and bool(info["success"])
    assert float(info["rewards"][-1]) == pytest.approx(-0.01 + 1 + 0.1 * (0.99 * 0 - (-1)) + 10, abs=1e-5)


@pytest.mark.parametrize("which", ["unfiltered_test", "medium_valid"])
def test_boxoban_levels_round_trip_and_step(which):
    texts = sokoban.load_boxoban(which)
    assert len(texts) == 1000
    states = []
    for text in texts:
        s = sokoban.from_ascii(text, sokoban.BOXOBAN)
        assert sokoban.render(s) == text
        assert int(s.boxes.sum()) == 4 and int(s.goals.sum()) == 4
        states.append(s)
    batch = grid.stack_states(states[:300])
    acts = np.random.default_rng(2).integers(-1, 5, size=(300, 40))
    compare_with_reference(sokoban, SokobanRef, sokoban.BOXOBAN, batch, acts, step_fn=BOXOBAN_STEP)


def test_xsb_round_trip_and_errors(levels):
    for i in range(50):
        text = sokoban.render(level(levels, i))
        assert sokoban.render(sokoban.from_ascii(text)) == text
    small = sokoban.Params(height=3, width=4)
    assert sokoban.render(sokoban.from_ascii("####\n#+*#\n####", small)) == "####\n#+*#\n####"
    assert bool(sokoban.from_ascii("####\n#+*#\n####", small).success)
    for bad in ["####\n#  #\n####", "####\n#@@#\n####", "####\n#@x#\n####", "###\n#@#\n###"]:
        with pytest.raises(ValueError):
            sokoban.from_ascii(bad, small)
    with pytest.raises(ValueError):
        sokoban.load_boxoban("hard")
