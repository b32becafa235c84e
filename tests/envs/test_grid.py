"""Shared grid helpers: branch selection, move parsers, the split hash."""
import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs import grid


def test_select_best_branch_picks_argmax_and_broadcasts():
    rng = np.random.default_rng(0)
    tasks, k = 5, 4
    states = {"pos": jnp.asarray(rng.integers(0, 9, (tasks, k, 2))), "done": jnp.asarray(rng.random((tasks, k)) < 0.5),
              "grid": jnp.asarray(rng.random((tasks, k, 3, 3)), jnp.float32)}
    scores = jnp.asarray(rng.normal(size=(tasks, k)), jnp.float32)
    scores = scores.at[2].set(jnp.array([1.0, 3.0, 3.0, 0.0]))  # a tie goes to the first
    picked = jax.jit(jax.vmap(grid.select_best_branch))(states, scores)
    best = np.asarray(scores).argmax(1)
    assert best[2] == 1
    for name, leaf in states.items():
        assert picked[name].shape == leaf.shape
        for t in range(tasks):
            for slot in range(k):
                assert np.array_equal(picked[name][t, slot], leaf[t, best[t]])


def test_move_parsers():
    L = 8
    assert grid.moves_from_list_text('["U", "R", "d", "left"]', L) == [0, 3, 1, 2]
    assert grid.moves_from_list_text("['U','X', 5]", L) == [0, grid.INVALID, grid.INVALID]
    assert grid.moves_from_list_text("[U, R, D]", L) == [0, 3, 1]
    assert grid.moves_from_list_text("U R D", L) == [0, 3, 1]
    assert grid.moves_from_list_text("URDL", L) == [0, 3, 1, 2]
    assert grid.moves_from_list_text("[]", L) == []
    assert grid.moves_from_list_text('["U"] * 20', L) == [0]
    assert grid.moves_from_list_text(str(["R"] * 20), L) == [3] * L  # cut to max_len
    for bad in ["", "[", '["U", "R"', "hello", None, 7, "[" * 5000, "U" * 100]:
        assert grid.moves_from_list_text(bad, L) is None
    assert grid.moves_from_letters(" ud ", 4) == [0, 1]
    assert grid.moves_from_letters("UDLRU", 4) is None and grid.moves_from_letters("UX", 4) is None
    assert grid.letters_of([0, 1, 2, 3, 4, -1]) == "UDLR?"
    padded = grid.pad_actions([[0, 1], None, [3] * 10], 4)
    assert padded.tolist() == [[0, 1, -1, -1], [-1] * 4, [3] * 4]


def test_level_bucket_matches_numpy_and_spreads():
    rng = np.random.default_rng(1)
    levels = [[rng.integers(0, 2, (6, 6)), rng.integers(0, 6, 2)] for _ in range(400)]
    fn = jax.jit(lambda a, b: grid.level_bucket([a, b]))
    jax_buckets = [int(fn(jnp.asarray(a), jnp.asarray(b))) for a, b in levels[:40]]
    np_buckets = [grid.level_bucket_np(x) for x in levels]
    assert jax_buckets == np_buckets[:40]
    counts = np.bincount(np_buckets, minlength=grid.SPLIT_BUCKETS)
    assert counts.min() > 400 / grid.SPLIT_BUCKETS / 2  # no empty or tiny bucket
