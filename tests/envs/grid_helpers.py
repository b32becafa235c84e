"""Shared helpers of the grid-game tests: batched reset/step and reference replay."""
from __future__ import annotations

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
