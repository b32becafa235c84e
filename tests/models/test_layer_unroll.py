"""Unrolled decoder layers in one-token steps (`model.decode_unroll`): the same tokens and
log-probs as the rolled loop, no loop left in the step, and the auto choice per platform."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.qwen3 import layer_unroll
from atgrpo_jax.models.strategies import KVCache
from atgrpo_jax.sampling import generate

CFG = get_preset("test-tiny").replace(num_layers=3)


def with_unroll(model: Qwen3, n: int) -> Qwen3:
    """The same weights under another decode_unroll."""
    other = Qwen3(model.cfg.replace(decode_unroll=n), rngs=nnx.Rngs(1))
    nnx.update(other, nnx.state(model))
    return other


def loops_in_step(model: Qwen3, t: int) -> int:
    """While loops in the lowered forward pass of t new tokens per row into a cache."""
    cache = KVCache.init(model.cfg, 2, 8)
    tokens = jnp.zeros((2, t), jnp.int32)
    text = jax.jit(lambda c: model(tokens, tokens, jnp.ones(tokens.shape, bool), c)).lower(cache).as_text()
    return text.count("stablehlo.while")


def test_auto_unrolls_every_layer_of_a_one_token_step_on_accelerators_only():
    assert layer_unroll(CFG, 1, "gpu") == layer_unroll(CFG, 1, "tpu") == 3
    assert layer_unroll(CFG, 1, "cpu") == 1
    assert layer_unroll(CFG, 16, "gpu") == 1  # prefill and the update keep the rolled loop
    assert layer_unroll(CFG.replace(decode_unroll=2), 1, "cpu") == 2
    assert layer_unroll(CFG.replace(decode_unroll=8), 1, "cpu") == 3
    with pytest.raises(ValueError, match="decode_unroll must be >= 0"):
        CFG.replace(decode_unroll=-1)


def test_an_unrolled_decode_step_has_no_layer_loop_and_prefill_keeps_it():
    model = Qwen3(CFG, rngs=nnx.Rngs(0))
    unrolled = with_unroll(model, 3)
    assert loops_in_step(model, 1) == 1
    assert loops_in_step(unrolled, 1) == 0
    assert loops_in_step(unrolled, 4) == 1


def test_unrolled_layers_sample_the_same_tokens_and_logprobs():
    model = Qwen3(CFG, rngs=nnx.Rngs(0))
    prompts = [list(np.random.RandomState(s).randint(1, CFG.vocab_size, n)) for s, n in enumerate((5, 9, 2))]
    outs = [generate(m, prompts, max_new_tokens=10, key=jax.random.key(3), temperature=1.0, num_branches=2)
            for m in (model, with_unroll(model, 3), with_unroll(model, 2))]
    for out in outs[1:]:
        np.testing.assert_array_equal(out.tokens, outs[0].tokens)
        np.testing.assert_allclose(out.logprobs, outs[0].logprobs, atol=1e-5)
