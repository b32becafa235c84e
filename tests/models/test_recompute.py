"""`model.recompute_elementwise`: the backward pass of a layer recomputes its norms, RoPE and
SwiGLU instead of keeping their intermediates (without `model.remat`, which recomputes the whole
layer). The gradients stay the same, no matmul runs twice, and the update keeps less in memory."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.models import Qwen3, get_preset
from jaxpr_walk import all_eqns
from tiers import full_case

CFG = get_preset("test-tiny").replace(num_layers=3, attention="chunked", attention_block=16)
B, T = 2, 48


def grad_fn(cfg):
    """jit(grad) of a loss over every hidden state, and the parameters it takes (seed 0)."""
    graphdef, params = nnx.split(nnx.jit(lambda: Qwen3(cfg, rngs=nnx.Rngs(0)))())
    tokens = jax.random.randint(jax.random.key(1), (B, T), 0, cfg.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))

    def loss(params):
        hidden, _ = nnx.merge(graphdef, params).hidden_states(tokens, positions)
        return jnp.mean(jnp.square(hidden.astype(jnp.float32)))

    return jax.grad(loss), params


def test_recomputing_keeps_the_gradients_and_runs_no_matmul_twice():
    grads, dots = {}, {}
    for recompute in (False, True):
        fn, params = grad_fn(CFG.replace(recompute_elementwise=recompute))
        grads[recompute] = jax.jit(fn)(params)
        dots[recompute] = sum(e.primitive.name == "dot_general" for e in all_eqns(jax.make_jaxpr(fn)(params).jaxpr))
    for a, b in zip(jax.tree.leaves(grads[False]), jax.tree.leaves(grads[True])):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-9)
    assert dots[True] == dots[False]  # the matmuls inside the recomputed blocks are not run again


@pytest.mark.parametrize("dtype", ["float32", full_case("bfloat16")])
def test_recomputing_shrinks_what_the_backward_pass_keeps(dtype):
    temp = {}
    for recompute in (False, True):
        fn, params = grad_fn(CFG.replace(compute_dtype=dtype, recompute_elementwise=recompute))
        temp[recompute] = jax.jit(fn).lower(params).compile().memory_analysis().temp_size_in_bytes
    # Kept per layer: 20 sequence-sized tensors (6 of them mlp-wide) without, 9 (2 mlp-wide) with.
    assert temp[True] < 0.75 * temp[False], temp
