"""Decode steps on per-layer weights and caches (`model.decode_unroll` auto on GPU and TPU) or
rolled over the stacked ones (auto on CPU): the same tokens and log-probs, no loop left in the
step, and no stacked weight or cache inside the per-layer decode loop, where slicing a layer out
of a stack copies it at every step."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.qwen3 import decodes_per_layer, layer_unroll
from atgrpo_jax.models.strategies import KVCache
from atgrpo_jax.sampling import decode, generate
from atgrpo_jax.sampling.generate import row_keys_for
from jaxpr_walk import all_eqns, sub_jaxprs

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


def test_auto_runs_one_token_steps_per_layer_on_accelerators_only():
    for platform in ("gpu", "tpu"):
        assert layer_unroll(CFG, 1, platform) == 3 and decodes_per_layer(CFG, platform)
    assert layer_unroll(CFG, 16, "gpu") == 3  # prefill and the update: unrolled on GPUs only
    assert layer_unroll(CFG, 16, "tpu") == 1 and layer_unroll(CFG, 16, "cpu") == 1
    assert layer_unroll(CFG, 1, "cpu") == 1 and not decodes_per_layer(CFG, "cpu")
    assert decodes_per_layer(CFG.replace(compute_dtype="bfloat16"), "cpu")  # AMX matmuls: the copies dominate
    for n, layers in ((1, 1), (2, 2), (8, 3)):
        assert layer_unroll(CFG.replace(decode_unroll=n), 1, "gpu") == layers
        assert decodes_per_layer(CFG.replace(decode_unroll=n), "cpu") == (layers == 3)
    with pytest.raises(ValueError, match="decode_unroll must be >= 0"):
        CFG.replace(decode_unroll=-1)
    assert layer_unroll(CFG.replace(sequence_unroll=2), 16, "gpu") == 2  # prefill and the update, on request
    assert layer_unroll(CFG.replace(sequence_unroll=9), 16, "cpu") == 3
    assert layer_unroll(CFG.replace(sequence_unroll=1), 16, "gpu") == 1
    with pytest.raises(ValueError, match="sequence_unroll must be >= 0"):
        CFG.replace(sequence_unroll=-1)


def test_an_unrolled_update_computes_the_same_loss_and_gradients():
    """`sequence_unroll` changes how the layer loop runs, not what the forward and backward compute."""
    model = Qwen3(CFG, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, CFG.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(12), tokens.shape)

    def loss(params, n):
        m = nnx.merge(graphdef, params)
        m.cfg = m.cfg.replace(sequence_unroll=n)
        h, _ = m.hidden_states(tokens, positions)
        return jnp.sum(jnp.tanh(m.logits(h)))

    (l1, g1), (l3, g3) = (jax.value_and_grad(loss)(params, n) for n in (1, 3))
    unrolls = {n: [e.params["unroll"] for e in all_eqns(jax.make_jaxpr(loss, static_argnums=1)(params, n).jaxpr)
                   if e.primitive.name == "scan"] for n in (1, 3)}
    assert unrolls == {1: [1], 3: [3]}, unrolls
    np.testing.assert_allclose(l3, l1, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g3)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_an_unrolled_decode_step_has_no_layer_loop_and_prefill_keeps_it():
    model = Qwen3(CFG, rngs=nnx.Rngs(0))
    unrolled = with_unroll(model, 3)
    assert loops_in_step(model, 1) == 1
    assert loops_in_step(unrolled, 1) == 0
    assert loops_in_step(unrolled, 4) == 1


def shapes_in_loops(jaxpr, inside: bool = False, found=None) -> set:
    """Shapes of the arrays that the equations inside while loops take (nested jaxprs included)."""
    found = set() if found is None else found
    for eqn in jaxpr.eqns:
        if inside:
            found.update(tuple(v.aval.shape) for v in eqn.invars if hasattr(v.aval, "shape"))
        for sub in sub_jaxprs(eqn.params):
            shapes_in_loops(sub, inside or eqn.primitive.name == "while", found)
    return found


def decode_loop_shapes(model: Qwen3, rows: int = 4, new: int = 6) -> set:
    """Shapes inside the while loops of one decode segment of `model` (2 prompts x 2 branches)."""
    graphdef, weights = nnx.split(model)
    ids, mask = np.ones((rows // 2, 5), np.int32), np.ones((rows // 2, 5), bool)
    settings = decode.DecodeSettings(new, num_branches=2)
    pre = decode.prefill_jit(graphdef, weights, ids, mask)
    layers = decode.layer_weights_jit(graphdef, weights)
    state, full = decode.start_jit(graphdef, weights, pre, None, row_keys_for(jax.random.key(0), rows), None,
                                   settings=settings)
    segment = functools.partial(decode._segment, graphdef, settings=settings)
    jaxpr = jax.make_jaxpr(segment)(weights, layers, state, full, np.arange(rows, dtype=np.int32), np.int32(new),
                                    decode.sampling_params())
    return shapes_in_loops(jaxpr.jaxpr)


def test_the_per_layer_decode_loop_reads_no_stacked_weight_or_cache():
    model = Qwen3(CFG, rngs=nnx.Rngs(0))
    stacked = {x.shape for x in jax.tree.leaves(nnx.state(model.layers))}
    stacked |= {KVCache.shape(CFG, rows, slots) for rows, slots in ((2, 5), (4, 6))}  # prompt and new-token caches
    assert not stacked & decode_loop_shapes(with_unroll(model, 3))
    assert stacked & decode_loop_shapes(with_unroll(model, 1))  # the rolled loop slices the stacks


@pytest.mark.full  # tiers.py: ~19 s; per-layer against rolled stays in the default tier (the LoRA case below,
# and Qwen2's fused biases in tests/models/test_families.py)
def test_every_loop_form_samples_the_same_tokens_and_logprobs():
    """Per layer, rolled and 2-of-3 unrolled; per layer and rolled also with rows dropped every 2
    steps and continuous batching (3 slots), which move per-layer or stacked caches."""
    model = Qwen3(CFG, rngs=nnx.Rngs(0))
    per_layer = with_unroll(model, 3)
    prompts = [list(np.random.RandomState(s).randint(1, CFG.vocab_size, n)) for s, n in enumerate((5, 9, 2))]
    kw = dict(max_new_tokens=[10, 4, 7], key=jax.random.key(3), temperature=1.0, num_branches=2)
    outs = [generate(per_layer, prompts, segment=0, **kw), generate(per_layer, prompts, segment=2, slots=3, **kw)]
    outs += [generate(with_unroll(model, n), prompts, segment=0, **kw) for n in (1, 2)]
    outs.append(generate(model, prompts, segment=2, slots=3, **kw))
    for out in outs[1:]:
        np.testing.assert_array_equal(out.tokens, outs[0].tokens)
        np.testing.assert_array_equal(out.lengths, outs[0].lengths)
        np.testing.assert_allclose(out.logprobs, outs[0].logprobs, atol=1e-5)


def test_per_layer_steps_of_a_lora_model_use_its_merged_adapters():
    """With LoRA adapters (non-zero B), the per-layer weights are the merged W + (alpha / r) A @ B,
    fused: the per-layer step samples the rolled loop's tokens, and the adapters change them."""
    model = Qwen3(CFG.replace(lora_rank=2), rngs=nnx.Rngs(0))
    for name in ("lora_b_wq", "lora_b_w_up"):
        lora_b = getattr(model.layers, name)
        lora_b.set_value(jax.random.normal(jax.random.key(1), lora_b.shape))
    prompts = [[5, 9, 5, 300], [7, 7]]
    kw = dict(max_new_tokens=8, key=jax.random.key(2), temperature=1.0, num_branches=2)
    rolled, per_layer = (generate(with_unroll(model, n), prompts, **kw) for n in (1, 3))
    np.testing.assert_array_equal(per_layer.tokens, rolled.tokens)
    np.testing.assert_allclose(per_layer.logprobs, rolled.logprobs, atol=1e-5)
    for name in ("lora_b_wq", "lora_b_w_up"):  # the adapters matter: without them the log-probs change
        getattr(model.layers, name).set_value(jnp.zeros(getattr(model.layers, name).shape))
    assert np.abs(generate(with_unroll(model, 3), prompts, **kw).logprobs - per_layer.logprobs).max() > 1e-3
