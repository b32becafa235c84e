"""The reference's LoRA (docs/paper.md, "Recipes", row L): A starts as peft's kaiming-uniform, and with one
adapter for all agents (L1 with LoRA) the sampler runs the frozen base, the adapter only scoring and
training; both outcomes asserted, each switch flipped back alone."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.lora import attach_lora, split_lora
from atgrpo_jax.train.config import base_config
from atgrpo_jax.train.policies import PolicySpec, build_policies
from atgrpo_jax.train.section import SHARINGS
from atgrpo_jax.train.update import make_optimizer
from atgrpo_jax.train.validate import resolve
from tiny_config import tiny

CFG = get_preset("test-tiny", num_layers=1)


@functools.lru_cache(maxsize=1)
def base_model() -> Qwen3:
    return Qwen3(CFG, rngs=nnx.Rngs(0))


def a_leaves(a_init: str):
    _, adapters, _ = split_lora(attach_lora(base_model(), 8, 16.0, seed=3, a_init=a_init))
    flat = nnx.to_flat_state(adapters)
    a = [np.asarray(v[...]) for path, v in flat if str(path[-1]).startswith("lora_a_")]
    b = [np.asarray(v[...]) for path, v in flat if str(path[-1]).startswith("lora_b_")]
    return a, b


def test_row_l_lora_a_starts_as_peft_draws_it_under_the_reference():
    for recipe, peft in (("paper", False), ("reference", True)):
        assert resolve(tiny(recipe=recipe)).reference.peft_lora_init is peft
    assert not resolve(tiny(recipe="reference", **{"reference.peft_lora_init": False})).reference.peft_lora_init
    for a_init, var_times_d in (("normal", 1.0), ("peft", 1 / 3)):
        a, b = a_leaves(a_init)
        assert all(not x.any() for x in b)  # B = 0: the adapted model starts as the base
        for x in a:
            d = x.shape[1]  # [layers, d_in, rank]
            assert x.var() * d == pytest.approx(var_times_d, rel=0.15)
            if a_init == "peft":
                assert np.abs(x).max() <= 1 / np.sqrt(d)  # uniform on +-1/sqrt(d_in)
            else:
                assert np.abs(x).max() > 1 / np.sqrt(d)  # a normal's tails pass that bound
    with pytest.raises(ValueError, match="a_init: unknown 'kaiming'"):
        attach_lora(base_model(), 8, 16.0, a_init="kaiming")


def shared_adapter(samples_base: bool):
    tx, _ = make_optimizer(base_config().optim, 10)
    spec = PolicySpec(SHARINGS["shared_lora"], LossSettings(logprob_chunk=64), lora_rank=4, lora_alpha=8.0,
                      samples_base=samples_base)
    policy = build_policies(spec, base_model(), ["a", "b"], tx)[0]
    trained = jax.tree.map(lambda x: x + 0.05, policy.state.params)  # an adapter that has learned something
    policy.load(policy.state._replace(params=trained))
    return policy


def test_row_l_the_shared_adapter_samples_from_the_base_weights_under_the_reference():
    for recipe, base_only in (("paper", False), ("reference", True)):
        assert resolve(tiny(recipe=recipe)).reference.shared_lora_samples_base is base_only
    tokens = jnp.asarray(np.random.RandomState(0).randint(1, CFG.vocab_size, (1, 6)), jnp.int32)

    def logits(model):
        return np.asarray(model(tokens, jnp.arange(tokens.shape[1])[None])[0])

    ours, reference = shared_adapter(False), shared_adapter(True)
    base_logits = logits(base_model())
    np.testing.assert_allclose(logits(reference.sampler_model()), base_logits, atol=1e-5)  # the adapter left out
    assert np.abs(logits(ours.sampler_model()) - base_logits).max() > 1e-3  # the paper's: the adapter merged
    np.testing.assert_allclose(logits(reference.export_model()), logits(ours.export_model()), atol=1e-5)  # trained
