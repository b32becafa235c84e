"""The learning-rate schedule as verl computes it: counted in training steps, warm-up then cosine to a floor."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.train.config import ConfigError, base_config
from atgrpo_jax.bench.rows import rows_packed
from atgrpo_jax.train.update import init_state, make_optimizer, make_update_fns, with_lr
from atgrpo_jax.train.validate import resolve


def verl_multiplier(scheduler_steps, warmup, total, floor, waves=0.5):
    """verl's cosine-with-warm-up multiplier (verl/utils/torch_functional.py), restated: a linear
    ramp over the warm-up, then a cosine of `waves` periods over the rest of the run, squeezed from
    [-1, 1] into [floor, 1] and never below 0. verl's LambdaLR reads it after `scheduler_steps` calls
    to scheduler.step(), one per training step, so training step s (1-based) reads s - 1."""
    if scheduler_steps < warmup:
        return scheduler_steps / max(warmup, 1)
    frac = (scheduler_steps - warmup) / max(total - warmup, 1)
    wave = math.cos(2.0 * math.pi * waves * frac)
    low, high = floor, 1.0
    return max(0.0, low + (high - low) * (wave + 1.0) / 2.0)


def optim(**kw):
    o = base_config().optim
    o.update(**kw)
    return o


def test_cosine_with_warmup_equals_verl_at_every_step_of_a_50_step_run():
    o = optim(lr=5e-6, schedule="cosine", warmup_steps=10, min_lr_ratio=0.3)
    _, lr_at = make_optimizer(o, total_steps=50)
    got = np.array([lr_at(s) for s in range(1, 51)])
    want = np.array([5e-6 * verl_multiplier(s - 1, 10, 50, 0.3) for s in range(1, 51)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert got[0] == 0.0 and got[5] == pytest.approx(2.5e-6) and got[10] == pytest.approx(5e-6)  # ramp, then top
    assert np.all(np.diff(got[10:]) < 0) and got[-1] > 0.3 * 5e-6 > got[-1] - 1e-8  # down to just above the floor


@pytest.mark.parametrize("kw", [dict(schedule="cosine", warmup_steps=0, min_lr_ratio=0.0),
                                dict(schedule="cosine", warmup_steps=3, min_lr_ratio=1.0)])
def test_other_cosine_settings_equal_verl(kw):
    _, lr_at = make_optimizer(optim(lr=1.0, **kw), total_steps=20)
    for s in range(1, 21):
        assert lr_at(s) == pytest.approx(verl_multiplier(s - 1, kw["warmup_steps"], 20, kw["min_lr_ratio"]), abs=1e-12)


def test_constant_ramps_over_training_steps_then_holds():
    _, lr_at = make_optimizer(optim(lr=2.0, schedule="constant", warmup_steps=4), total_steps=10)
    assert [lr_at(s) for s in range(1, 8)] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 2.0]
    _, flat = make_optimizer(optim(lr=2.0, schedule="constant", warmup_steps=0), total_steps=10)
    assert flat(1) == 2.0  # no warm-up: the first step trains (verl's constant schedule would start at 0)


def test_the_optimizer_steps_at_the_rate_set_for_the_training_step():
    """AdamW's step is linear in the rate: twice the rate moves every weight twice as far, 0 not at all."""
    graphdef, params = nnx.split(Qwen3(get_preset("test-tiny", num_layers=1), rngs=nnx.Rngs(0)))
    tx, lr_at = make_optimizer(optim(lr=1e-3, schedule="cosine", warmup_steps=2), total_steps=10)
    _, update = make_update_fns(graphdef, nnx.State({}), tx, LossSettings(), 64)
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 50 + 1
    mask = jnp.ones((2, 8), bool)
    batch = rows_packed(tokens, mask, mask.at[:, 0].set(False), jnp.zeros((2, 8)), jnp.array([-1.0, 1.0]))
    before = [np.asarray(x) for x in jax.tree.leaves(params)]

    def moved(lr):
        state, _ = update(with_lr(init_state(params, tx), lr), batch)
        return [np.asarray(b) - a for a, b in zip(before, jax.tree.leaves(state.params))]

    assert lr_at(1) == 0.0 and all((d == 0).all() for d in moved(lr_at(1)))  # verl's first warm-up step
    one, two = moved(1e-2), moved(2e-2)  # large enough that float32 rounding of the weights stays small
    assert max(np.abs(d).max() for d in one) > 1e-3
    for a, b in zip(one, two):
        np.testing.assert_allclose(b, 2 * a, rtol=1e-3, atol=2e-6)


@pytest.mark.parametrize("key, value", [("optim.min_lr_ratio", 1.5), ("optim.min_lr_ratio", -0.1),
                                        ("optim.warmup_steps", -1), ("rollout.repetition_penalty", 0.0),
                                        ("rollout.eval_repetition_penalty", -1.0), ("rollout.eval_top_p", 0.0),
                                        ("rollout.eval_top_k", -1), ("rollout.eval_temperature", -0.5)])
def test_bad_new_settings_name_their_key(key, value):
    """The schedule's and the sampling's keys of issue 24, each refused with its own name."""
    c = base_config()
    c.model.preset = "demo-tiny"
    section, leaf = key.split(".")
    c[section][leaf] = value
    with pytest.raises(ConfigError, match=f"config.{key}:"):
        resolve(c, weights=False)


@pytest.mark.parametrize("key, value", [("repetition_penalty", 0.0), ("eval_top_p", 1.5),
                                        ("eval_repetition_penalty", -2.0)])
def test_bad_per_agent_sampling_names_the_agent(key, value):
    c = base_config()
    c.model.preset = "demo-tiny"
    c.rollout.agents = {"planner": {key: value}}
    with pytest.raises(ConfigError, match="config.rollout.agents.planner:"):
        resolve(c, weights=False)


def test_a_resume_that_changes_the_length_of_a_cosine_says_what_the_rate_becomes():
    from atgrpo_jax.train.start import horizon_note

    optim = base_config().optim
    optim.update(lr=1e-3, schedule="cosine", warmup_steps=0, min_lr_ratio=0.0)
    note = horizon_note(optim, {"train.steps": (100, 200)}, start=100)
    # step 101 of 100 steps is past the end (rate 0); of 200 steps it is half way down the cosine
    assert note == "; the cosine schedule now spans 200 steps: step 101's rate is 0.0005 (was 0)"
    assert horizon_note(optim, {"train.eval_every": (1, 2)}, start=100) == ""
    optim.schedule = "constant"
    assert horizon_note(optim, {"train.steps": (100, 200)}, start=100) == ""
