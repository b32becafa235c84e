"""Sudoku 4x4: JAX stepper vs the plain-Python reference, unique puzzles, notation."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # grid_helpers (importlib import mode)
from grid_helpers import batched_reset, compare_with_reference, level  # noqa: E402

from atgrpo_jax.envs import grid, solvers, sudoku  # noqa: E402
from atgrpo_jax.envs.reference_steppers import SudokuRef  # noqa: E402

P = sudoku.Params()
N_LEVELS = 1500


@pytest.fixture(scope="module")
def train_levels():
    return batched_reset(sudoku, P, N_LEVELS, seed=0, split="train")


def test_all_grids_are_the_288_valid_grids():
    grids = sudoku.ALL_GRIDS
    assert grids.shape == (288, 4, 4) and len({g.tobytes() for g in grids}) == 288
    for g in grids[::7]:
        assert solvers.sudoku_count_solutions(g) == 1  # a complete valid grid
    # brute force: an empty grid has exactly 288 completions
    assert solvers.sudoku_count_solutions(np.zeros((4, 4), int), limit=10_000) == 288


def test_generated_puzzles_have_a_unique_solution(train_levels):
    givens = []
    for i in range(N_LEVELS):
        s = level(train_levels, i)
        assert solvers.sudoku_count_solutions(s.puzzle, limit=5) == 1, sudoku.render(s)
        assert solvers.sudoku_solve(s.puzzle) == s.solution.tolist()
        assert np.array_equal(s.grid, s.puzzle) and not bool(s.done)
        givens.append(int((s.puzzle > 0).sum()))
    assert min(givens) >= P.min_givens
    assert len({level(train_levels, i).puzzle.tobytes() for i in range(N_LEVELS)}) > N_LEVELS * 0.9


def test_jax_stepper_matches_reference(train_levels):
    rng = np.random.default_rng(0)
    length = 20
    acts = rng.integers(-1, 66, size=(N_LEVELS, length))
    for i in range(0, N_LEVELS, 2):  # correct placements, shuffled, with a few random ones mixed in
        s = level(train_levels, i)
        cells = [(r, c) for r in range(4) for c in range(4) if s.puzzle[r, c] == 0]
        plan = [sudoku.encode(r, c, int(s.solution[r, c])) for r, c in cells]
        rng.shuffle(plan)
        if i % 4 == 0:
            plan.insert(int(rng.integers(0, len(plan))), int(rng.integers(0, 64)))
        acts[i, : min(len(plan), length)] = plan[:length]
    successes = compare_with_reference(sudoku, SudokuRef, P, train_levels, acts)
    assert successes > N_LEVELS // 4


def test_reference_rewards_match_a_transcription(train_levels):
    """Params.rewards="reference": the reference system's dense scoring, against its plain-Python
    transcription (reference_steppers.SudokuRef) on random and solving placement lists."""
    ref = sudoku.Params(rewards="reference")
    rng = np.random.default_rng(1)
    n, length = 200, 14
    acts = rng.integers(-1, 66, size=(n, length))
    for i in range(0, n, 2):  # the solution's cells in random order, some with a wrong or restated placement
        s = level(train_levels, i)
        plan = [sudoku.encode(r, c, int(s.solution[r, c])) for r in range(4) for c in range(4) if s.puzzle[r, c] == 0]
        rng.shuffle(plan)
        if i % 4 == 0:
            plan.insert(int(rng.integers(0, len(plan))), int(rng.integers(0, 64)))
        acts[i, :min(len(plan), length)] = plan[:length]
    states = jax.tree.map(lambda x: x[:n], train_levels)
    assert compare_with_reference(sudoku, SudokuRef, ref, states, acts) > n // 4
    s = sudoku.from_ascii("12..\n3...\n..4.\n...1")
    _, _, done, info = jax.jit(sudoku.step, static_argnums=2)(s, jnp.array([sudoku.encode(0, 3, 1)] * 50), ref)
    assert not bool(done) and np.allclose(info["rewards"], -0.3)  # no step limit: 50 invalid placements
    # By hand: (0, 2) <- 3, its one candidate: -0.01 + 0.2 + 0.5/16 + 0.02 * 2 (row 0 and column 2 gain a
    # satisfied pair) + 0.1 * 6/16 + 0.05 = 0.34875; restating it then scores 0.
    _, _, _, info = sudoku.step(s, jnp.array([sudoku.encode(0, 2, 3), sudoku.encode(0, 2, 3)]), ref)
    np.testing.assert_allclose(info["rewards"], [0.34875, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match="rewards"):
        sudoku.step(s, 0, sudoku.Params(rewards="paper"))


def test_hand_computed_rewards():
    s = sudoku.from_ascii("12..\n3...\n..4.\n...1")  # solution rows 1234 / 3412 / 2143 / 4321
    assert np.asarray(s.solution).tolist()[:2] == [[1, 2, 3, 4], [3, 4, 1, 2]]
    step = jax.jit(sudoku.step, static_argnums=2)
    right = sudoku.encode(0, 2, 3)
    clash = sudoku.encode(0, 3, 1)  # 1 is already in row 0
    given = sudoku.encode(0, 0, 1)  # re-stating a given: valid, no change
    right2, wrong = sudoku.encode(1, 3, 2), sudoku.encode(1, 3, 4)  # 4 breaks no rule but is wrong
    _, _, done, info = step(s, jnp.array([right, clash, given, right2, wrong, right2, 999, -1]), P)
    expected = [0.09, -0.1, -0.01, 0.09, -0.11, 0.09, -0.1, 0.0]
    np.testing.assert_allclose(info["rewards"], expected, atol=1e-6)
    assert not bool(done)
    solve = [sudoku.encode(r, c, int(s.solution[r, c])) for r in range(4) for c in range(4) if s.puzzle[r, c] == 0]
    _, total, done, info = step(s, jnp.array(solve), P)
    assert bool(done) and bool(info["success"])
    assert float(total) == pytest.approx(len(solve) * 0.09 + 1.0, abs=1e-5)


def test_train_and_test_puzzles_are_disjoint(train_levels):
    test_levels = batched_reset(sudoku, P, 300, seed=0, split="test")
    for i in range(300):
        assert grid.level_bucket_np([level(test_levels, i).puzzle]) == 0
        assert grid.level_bucket_np([level(train_levels, i).puzzle]) != 0
    train = {level(train_levels, i).puzzle.tobytes() for i in range(N_LEVELS)}
    assert not train & {level(test_levels, i).puzzle.tobytes() for i in range(300)}


def test_notation_and_encoding(train_levels):
    for i in range(50):
        text = sudoku.render(level(train_levels, i))
        assert sudoku.render(sudoku.from_ascii(text)) == text
    assert all(sudoku.decode(sudoku.encode(r, c, d)) == (r, c, d)
               for r in range(4) for c in range(4) for d in range(1, 5))
    with pytest.raises(ValueError):
        sudoku.from_ascii("....\n....\n....\n....")  # 288 solutions
    with pytest.raises(ValueError):
        sudoku.from_ascii("11..\n....\n....\n....")  # none
    with pytest.raises(ValueError):
        sudoku.from_ascii("1234\n3412\n2143\n432")
