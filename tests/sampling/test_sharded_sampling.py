"""Sampling on a (data=2, fsdp=2, tensor=2) mesh of the 8 simulated CPU devices equals unsharded."""
import jax
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from atgrpo_jax.models import KVCache, Qwen3, get_preset
from atgrpo_jax.sampling import decode, generate, shard_model
from atgrpo_jax.sharding import make_mesh


@nnx.jit
def scaled_model():
    """test-tiny with a sharp head, so greedy paths have no near-ties (jitted: one compile)."""
    model = Qwen3(get_preset("test-tiny"), rngs=nnx.Rngs(0))
    model.lm_head.set_value(model.lm_head[...] * 40.0)
    return model


def test_sharded_generation_matches_unsharded():
    assert jax.device_count() == 8
    model = scaled_model()
    rng = np.random.RandomState(0)
    prompts = [list(rng.randint(1, 512, n)) for n in (9, 4, 16, 1)]
    kw = dict(max_new_tokens=6, num_branches=2, temperature=0.0, key=jax.random.key(0), raw_logprobs=True)
    plain = generate(model, prompts, **kw)

    mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    sharded = shard_model(model, mesh)
    assert sharded.lm_head[...].sharding.spec == P("fsdp", "tensor")
    assert sharded.layers.wk[...].sharding.spec == P(None, "fsdp", "tensor", None)
    assert len(model.lm_head[...].sharding.device_set) == 1  # the input model is left as it was
    with jax.set_mesh(mesh):
        got = generate(sharded, prompts, **kw)
        graphdef, weights = nnx.split(sharded)
        pre = decode.prefill_jit(graphdef, weights, got.prompt_ids[::2], got.prompt_mask[::2])
    np.testing.assert_array_equal(got.tokens, plain.tokens)
    np.testing.assert_allclose(got.raw_logprobs, plain.raw_logprobs, atol=1e-4)
    # the prompt cache follows the rule table: batch over data+fsdp, kv_heads over tensor
    k_spec, valid_spec = pre.cache.k.sharding.spec, pre.cache.valid.sharding.spec
    expected = tuple({"batch": ("data", "fsdp"), "kv_heads": "tensor"}.get(a) for a in KVCache.AXES)
    assert tuple(k_spec) + (None,) * (5 - len(k_spec)) == expected
    assert tuple(valid_spec)[:1] == (("data", "fsdp"),)


def test_truncated_penalized_sampling_on_an_fsdp_mesh_matches_unsharded():
    """The paper's sampling (top-k 20, top-p 0.9, repetition penalty 1.2) on all 8 devices as one fsdp
    axis (rows not divisible by it): a barrier over top_k's result tuple used to crash XLA's SPMD
    partitioner here; the tokens equal the unsharded sampler's."""
    model = scaled_model()
    prompts = [[5, 9, 5, 300], [7, 7]]
    kw = dict(max_new_tokens=5, num_branches=2, temperature=1.0, top_k=20, top_p=0.9, repetition_penalty=1.2,
              key=jax.random.key(1))
    assert_sharded_matches(model, model, {"data": 1, "fsdp": 8, "tensor": 1}, prompts, **kw)


def assert_sharded_matches(plain_model, model, mesh_shape, prompts, **kw):
    """`model` sharded over a mesh of `mesh_shape` samples the tokens of `plain_model` unsharded,
    with log-probs within 1e-4; returns the mesh."""
    plain = generate(plain_model, prompts, **kw)
    mesh = make_mesh(mesh_shape)
    with jax.set_mesh(mesh):
        got = generate(shard_model(model, mesh), prompts, **kw)
    np.testing.assert_array_equal(got.tokens, plain.tokens)
    np.testing.assert_allclose(got.logprobs, plain.logprobs, atol=1e-4)
    return mesh


def test_per_layer_decode_on_a_mesh_matches_the_rolled_loop():
    """The accelerators' default (decode steps unrolled over per-layer weights and caches) on a
    sharded model makes the rolled loop's tokens, and its prompt cache follows the rule table."""
    model = scaled_model()
    per_layer = Qwen3(model.cfg.replace(decode_unroll=model.cfg.num_layers), rngs=nnx.Rngs(1))
    nnx.update(per_layer, nnx.state(model))
    prompts = [list(np.random.RandomState(1).randint(1, 512, n)) for n in (7, 12)]
    mesh = assert_sharded_matches(model, per_layer, {"data": 2, "fsdp": 2, "tensor": 2}, prompts, max_new_tokens=5,
                                  num_branches=2, temperature=1.0, key=jax.random.key(0))
    with jax.set_mesh(mesh):
        graphdef, weights = nnx.split(shard_model(per_layer, mesh))
        pre = decode.prefill_jit(graphdef, weights, np.ones((4, 8), np.int32), np.ones((4, 8), bool))
    assert pre.cache.layered
    expected = tuple({"batch": ("data", "fsdp"), "kv_heads": "tensor"}.get(a) for a in KVCache.AXES[1:])
    for k in pre.cache.k:
        assert tuple(k.sharding.spec) + (None,) * (4 - len(k.sharding.spec)) == expected
