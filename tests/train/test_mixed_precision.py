"""bf16 end to end with float32 master weights: an update of lr x grad far below a bf16 weight's
last bit moves the float32 masters (and would vanish in bf16), the sampler runs a bf16 copy of
exactly the masters, AdamW's moments are float32, export writes the model's param_dtype, and the
planner counts the masters beside the copy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.plan.devices import parse_device
from atgrpo_jax.plan.memory import plan
from atgrpo_jax.train.config import ConfigError, base_config
from atgrpo_jax.train.policies import PolicySpec, build_policies
from atgrpo_jax.bench.rows import rows_packed
from atgrpo_jax.train.update import make_optimizer
from atgrpo_jax.train.validate import resolve
from tiny_config import tiny

CFG = get_preset("test-tiny", num_layers=1, param_dtype="bfloat16", compute_dtype="bfloat16")


def one_policy(master_dtype: str, lr: float = 1e-6):
    c = base_config()
    c.optim.lr = lr
    tx, _ = make_optimizer(c.optim, 10)
    base = Qwen3(CFG, rngs=nnx.Rngs(0))
    layout = resolve(tiny()).policy.routing
    spec = PolicySpec(layout, LossSettings(logprob_chunk=64), master_dtype=master_dtype)
    return build_policies(spec, base, ["a"], tx)[0]


def batch():
    rng = np.random.RandomState(0)
    tokens = jnp.asarray(rng.randint(1, CFG.vocab_size, (2, 12)), jnp.int32)
    mask = jnp.ones((2, 12), bool)
    return rows_packed(tokens, mask, mask.at[:, :4].set(False), jnp.zeros((2, 12)), jnp.array([-1.0, 1.0]))


def floats(tree):
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]


def test_float32_masters_learn_what_bf16_weights_lose():
    p = one_policy("float32")
    assert {x.dtype for x in floats(p.state.params)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in floats(p.state.opt_state)} == {jnp.dtype(jnp.float32)}
    before = [np.asarray(x) for x in floats(p.state.params)]
    m = p.update(batch())
    assert float(m["skipped"]) == 0.0
    after = [np.asarray(x) for x in floats(p.state.params)]
    moved = np.concatenate([(a != b).ravel() for a, b in zip(after, before)])
    assert moved.mean() > 0.5 and max(np.abs(a - b).max() for a, b in zip(after, before)) < 1e-5  # ~lr each
    # the same update made on bf16 weights is lost: bf16 weights of ~0.02 have a last bit of ~1e-4
    bf16 = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16))  # noqa: E731
    kept = np.concatenate([(bf16(a) != bf16(b)).ravel() for a, b in zip(after, before)])
    assert kept.mean() < 0.05

    sampler = p.sampler_model()
    weights = floats(nnx.state(sampler, nnx.Param))
    assert {w.dtype for w in weights} == {jnp.dtype(jnp.bfloat16)}
    for w, master in zip(weights, floats(p.state.params)):
        np.testing.assert_array_equal(np.asarray(w), np.asarray(master.astype(jnp.bfloat16)))
    assert p.sampler_model() is sampler  # cast once per update, not per sampling call
    assert {x.dtype for x in floats(nnx.state(p.export_model(), nnx.Param))} == {jnp.dtype(jnp.bfloat16)}


def test_param_dtype_masters_train_in_bf16():
    p = one_policy("param_dtype")
    assert {x.dtype for x in floats(p.state.params)} == {jnp.dtype(jnp.bfloat16)}
    assert p.sample_dtype is None
    p.update(batch())
    assert {x.dtype for x in floats(p.state.params)} == {jnp.dtype(jnp.bfloat16)}


def test_master_dtype_is_validated():
    c = tiny(**{"optim.master_dtype": "float64"})
    with pytest.raises(ConfigError, match=r"config\.optim\.master_dtype"):
        resolve(c)


def test_planner_counts_masters_and_the_sampler_copy():
    c = base_config()
    c.model.update(preset="qwen3-1.7b", param_dtype="bfloat16", compute_dtype="bfloat16", init="random")
    device, _ = parse_device("v5p")
    n = 1  # one chip: per-device bytes are the whole model
    n_params = get_preset("qwen3-1.7b").num_params()
    masters = plan(resolve(c), device, n)
    assert masters.params == pytest.approx(6 * n_params, rel=1e-3)  # bf16 copy + float32 masters
    assert masters.optimizer == pytest.approx(8 * n_params, rel=1e-3)  # float32 mu and nu
    c.optim.master_dtype = "param_dtype"
    plain = plan(resolve(c), device, n)
    assert plain.params == pytest.approx(2 * n_params, rel=1e-3)
    assert plain.optimizer == pytest.approx(4 * n_params, rel=1e-3)
