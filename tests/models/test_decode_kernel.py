"""The Pallas decode attention (`model.decode_attention="pallas"`) against the einsum form it
replaces, in Pallas' interpreter (no GPU here), and lowered for CUDA to check that Triton takes it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractDevice, AbstractMesh

from atgrpo_jax.models import Qwen3, get_preset, strategies
from atgrpo_jax.models.attention import shared_prefix_attention
from atgrpo_jax.models.decode_kernel import kernel_shared_prefix_attention, live_blocks, supported
from atgrpo_jax.sampling import generate

# jitted: Pallas' interpreter compiles once per shape instead of dispatching op by op (3x faster here)
kernel = jax.jit(kernel_shared_prefix_attention, static_argnums=7)
einsum = jax.jit(shared_prefix_attention, static_argnums=7)


def inputs(b=2, k=3, kv=2, g=2, d=16, p=64, s=32, dtype=jnp.float32, seed=0):
    """A decode step's attention inputs: left-padded prompts (row 1's first 20 slots are padding),
    branch rows at different steps of their own caches, one row with a hole (a ring's old slots)."""
    keys = jax.random.split(jax.random.key(seed), 5)
    normal = lambda i, shape: jax.random.normal(keys[i], shape).astype(dtype)  # noqa: E731
    n = b * k
    q = normal(0, (n, 1, kv * g, d))
    prefix_k, prefix_v = normal(1, (b, kv, p, d)), normal(2, (b, kv, p, d))
    own_k, own_v = normal(3, (n, kv, s, d)), normal(4, (n, kv, s, d))
    prefix_valid = jnp.arange(p)[None, :] >= jnp.array(([5, 20] + [0] * b)[:b])[:, None]
    steps = jnp.arange(n) * 7 % s
    own_allowed = jnp.arange(s)[None, :] <= steps[:, None]
    own_allowed = own_allowed.at[n - 1].set((jnp.arange(s) >= s - 3) | (jnp.arange(s) < 2))
    return q, prefix_k, prefix_v, prefix_valid, own_k, own_v, own_allowed[:, None, :], k


@pytest.mark.parametrize("shape", [dict(), dict(b=1, k=1, kv=1, p=256, s=128), dict(k=4, g=4, d=32, s=16)],
                         ids=["branches", "split-keys", "wide-groups"])
def test_the_kernel_equals_the_einsum_in_float32(shape):
    """Many programs per row where there are few rows (split-keys: 16 of them, most with no allowed
    key for the own cache), the partial results merged exactly."""
    args = inputs(**shape)
    np.testing.assert_allclose(kernel(*args), einsum(*args), rtol=1e-5, atol=1e-5)


def test_a_row_that_sees_no_key_gets_zeros_not_nan():
    q, pk, pv, p_valid, ok, ov, own_allowed, k = inputs()
    p_valid, own_allowed = p_valid.at[1].set(False), own_allowed.at[k:].set(False)  # prompt 1 and its rows
    out = kernel(q, pk, pv, p_valid, ok, ov, own_allowed, k)
    assert not jnp.any(out[k:]) and bool(jnp.all(jnp.isfinite(out)))
    np.testing.assert_allclose(out[:k], einsum(q, pk, pv, p_valid, ok, ov, own_allowed, k)[:k], rtol=1e-5, atol=1e-5)


def test_the_kernel_in_bf16_is_as_close_to_float32_as_the_einsum():
    exact = einsum(*inputs())
    args = inputs(dtype=jnp.bfloat16)
    err = lambda out: float(jnp.linalg.norm(out.astype(jnp.float32) - exact) / jnp.linalg.norm(exact))  # noqa: E731
    ours, theirs = err(kernel(*args)), err(einsum(*args))
    assert ours < 1.5 * theirs + 1e-3 and ours < 0.02, (ours, theirs)


def test_live_blocks_bound_exactly_the_blocks_with_an_allowed_slot():
    rng = np.random.RandomState(0)
    mask = rng.rand(5, 128) < 0.03
    mask[1] = False
    mask[2, 40:70] = True
    first, end = (np.asarray(x) for x in live_blocks(jnp.asarray(mask), splits=2, block=16))
    live = mask.reshape(5, 2, 4, 16).any(-1)
    for r in range(5):
        for j in range(2):
            blocks = np.flatnonzero(live[r, j])
            assert (first[r, j], end[r, j]) == ((blocks[0], blocks[-1] + 1) if len(blocks) else (0, 0))


def test_triton_takes_the_kernel_at_qwen3_1p7b_decode_shapes():
    """Lowered for CUDA (Pallas -> Triton IR happens here, at lowering): one Triton call per part.
    The abstract H100 stands in for the GPU that newer jax asks about while lowering."""
    b, k, kv, g, d = 16, 4, 8, 2, 128
    sd, bf = jax.ShapeDtypeStruct, jnp.bfloat16
    args = (sd((b * k, 1, kv * g, d), bf), sd((b, kv, 512, d), bf), sd((b, kv, 512, d), bf), sd((b, 512), bool),
            sd((b * k, kv, 256, d), bf), sd((b * k, kv, 256, d), bf), sd((b * k, 1, 256), bool))
    h100 = AbstractMesh((1,), ("data",), abstract_device=AbstractDevice("NVIDIA H100", None, "gpu"))
    with jax.sharding.use_abstract_mesh(h100):
        lowered = jax.jit(lambda *a: kernel_shared_prefix_attention(*a, branches=k, interpret=False)).trace(*args)
        text = lowered.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 2


def test_shapes_the_kernel_does_not_take_fall_back_to_the_einsum():
    assert supported(128, 512, 256) and supported(16, 16, 16)
    assert not supported(24, 512, 256)  # head_dim not a power of two
    assert not supported(128, 512, 250)  # own slots (max_new_tokens 250) not a multiple of 16
    with pytest.raises(ValueError, match="decode_attention must be one of"):
        get_preset("test-tiny").replace(decode_attention="triton")


def test_the_sampler_with_the_kernel_samples_the_einsums_tokens(monkeypatch):
    """Continuous batching (3 slots: rows start late, their own caches are rings with stale slots,
    finished rows leave): the same tokens and log-probs as the einsum."""
    traced = []
    monkeypatch.setattr(strategies, "kernel_shared_prefix_attention",
                        lambda *a: traced.append(a[0].shape) or kernel_shared_prefix_attention(*a))
    cfg = get_preset("test-tiny").replace(head_dim=16, num_layers=2)
    model = Qwen3(cfg, rngs=nnx.Rngs(0))
    kernel = Qwen3(cfg.replace(decode_attention="pallas"), rngs=nnx.Rngs(1))
    nnx.update(kernel, nnx.state(model))
    prompts = [list(np.random.RandomState(s).randint(1, cfg.vocab_size, n)) for s, n in enumerate((5, 19, 2))]
    kw = dict(max_new_tokens=[16, 5, 11], key=jax.random.key(3), temperature=1.0, num_branches=2, segment=4, slots=3)
    ours, einsum = generate(kernel, prompts, **kw), generate(model, prompts, **kw)
    np.testing.assert_array_equal(ours.tokens, einsum.tokens)
    np.testing.assert_allclose(ours.logprobs, einsum.logprobs, atol=1e-5)
    assert traced, "the sampler never called the kernel"


def test_the_kernel_runs_per_device_on_a_mesh():
    mesh = jax.make_mesh((2, 1, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    args = inputs(b=4, k=2, kv=2, p=32, s=16)
    expected = einsum(*args)
    with jax.set_mesh(mesh):
        out = jax.jit(kernel_shared_prefix_attention, static_argnums=7)(*args)  # traced under the mesh
        assert "shard_map" in str(jax.make_jaxpr(kernel_shared_prefix_attention, static_argnums=7)(*args))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
