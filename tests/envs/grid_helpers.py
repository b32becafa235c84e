"""Shared helpers of the grid-game tests: batched reset/step and reference replay."""
from __future__ import annotations

import string

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs import grid


def batched_reset(module, params, n: int, seed: int, split=None):
    """n levels from jit(vmap(reset)) with keys derived from `seed`."""
    fn = jax.jit(jax.vmap(lambda k: module.reset(k, params, split)))
    return fn(jax.random.split(jax.random.PRNGKey(seed), n))


def batched_step(module, params):
    return jax.jit(jax.vmap(lambda s, a: module.step(s, a, params)))


def level(states, i: int):
    return grid.unstack_state(states, i)


def compare_with_reference(module, ref_cls, params, states, actions, step_fn=None):
    """Step every level with its action row in JAX (vmap+jit) and in the reference.

    Asserts per-move rewards agree within 1e-6 (plus float32 relative error),
    and that the final states and done/success flags are equal. Returns the
    number of successes.
    """
    step_fn = step_fn or batched_step(module, params)
    new, total, done, info = step_fn(states, jnp.asarray(actions, jnp.int32))
    new = jax.tree.map(np.asarray, new)
    per_move = np.asarray(info["rewards"])
    np.testing.assert_allclose(np.asarray(total), per_move.sum(1), rtol=1e-5, atol=1e-5)
    successes = 0
    for i in range(actions.shape[0]):
        ref = ref_cls(level(states, i), params)
        rewards = np.array(ref.step_many(actions[i]))
        np.testing.assert_allclose(per_move[i], rewards, rtol=1e-6, atol=1e-6, err_msg=f"level {i}")
        for field, value in ref.arrays().items():
            assert np.array_equal(np.asarray(getattr(new, field))[i], value), (field, i)
        assert bool(np.asarray(done)[i]) == ref.done and bool(np.asarray(info["success"])[i]) == ref.success
        successes += ref.success
    return successes


# Hostile plan answers and what actions_from_answer makes of them (None: nothing parses).
HOSTILE = {
    "empty": "",
    "huge": "x" * 1_000_000,
    "huge_then_answer": "y" * 1_000_000 + '\n#### ["R"]',
    "unicode": "ünïcødé ☃ 🚀 \u202e\n#### [\"Ｕ\"]",
    "unbalanced": '#### ["U", "R"',
    "unbalanced_code": "```python\nprint(1)\n#### [\"U\"]",
    "several": '#### ["U"]\nthinking again...\n#### ["R", "R"]',
    "injected_in_code": '#### ["D"]\n```python\n#### ["L", "L"]\n```',
    "only_in_code": '```python\n#### ["L"]\n```',
    "empty_list": "#### []",
    "nested": "#### " + "[" * 3000 + "]" * 3000,
    "not_moves": '#### ["jump", 3, null]',
    "nul_bytes": '\x00\x00#### ["U"]\x00',
}
EXPECTED = {
    "empty": None, "huge": None, "huge_then_answer": [3], "unicode": [grid.INVALID],
    "unbalanced": None, "unbalanced_code": None, "several": [3, 3], "injected_in_code": [1],
    "only_in_code": None, "empty_list": None, "nested": None,
    "not_moves": [grid.INVALID] * 3, "nul_bytes": None,
}


def fuzz_strings(n, seed):
    """n random answers: pieces of the formats the parsers look for, or random characters."""
    rng = np.random.default_rng(seed)
    pieces = ["####", "[", "]", '"U"', "'R'", ",", "```", "```python\n", "\n", "**Actions List**:", "UDLR",
              "D", "[[0, 1, 2]]", "\\", "{", "}", "null", "1e309", "☃", "\x00", " ", "0123", "(", ")"]
    alphabet = list(string.printable) + ["é", "中", "🚀", "\u202e"]
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            out.append("".join(rng.choice(pieces, size=rng.integers(0, 30))))
        else:
            out.append("".join(rng.choice(alphabet, size=rng.integers(0, 200))))
    return out
