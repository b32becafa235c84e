"""Every attention backend equals the einsum (outputs and gradients, float32, within 1e-5):
GQA, packed segments, left padding, blocks that do not divide the length. The splash kernel
runs in Pallas interpret mode and cuDNN's call through jax.nn.dot_product_attention's XLA
implementation, since this machine has neither a TPU nor a GPU."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.models.attention import Mask, attention, dense_attention, resolve_backend
from atgrpo_jax.models.model_config import get_preset
from atgrpo_jax.models.qwen3 import KVCache, Qwen3

B, H, KV, D = 2, 4, 2, 16


def _qkv(t, s=None, seed=0):
    s = s or t
    ks = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(ks[0], (B, t, H, D)), jax.random.normal(ks[1], (B, s, KV, D)),
            jax.random.normal(ks[2], (B, s, KV, D)))


def _packed(t):
    """Row 0: a prompt, two responses, padding; row 1: a prompt, one response, no padding."""
    seg = np.full((B, t), -1, np.int32)
    seg[0, :7], seg[0, 7:20], seg[0, 20:t - 5] = 0, 1, 2
    seg[1, :11], seg[1, 11:] = 0, 1
    return Mask.packed(jnp.asarray(seg))


def _left_padded(t):
    valid = np.ones((B, t), bool)
    valid[0, :9] = False  # row 0 is left-padded
    return Mask.causal(jnp.arange(t), jnp.asarray(valid))


def _compare(backend, q, k, v, mask, rows, block=None):
    """Outputs and the gradients of a weighted sum over the rows that may see some key."""
    w = jax.random.normal(jax.random.key(7), q.shape) * rows[:, :, None, None]
    kw = {"block": block} if block else {}

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

    ref = lambda q, k, v: dense_attention(q, k, v, mask.dense())  # noqa: E731
    got = lambda q, k, v: attention(q, k, v, mask, backend, **kw)  # noqa: E731
    np.testing.assert_allclose(got(q, k, v) * rows[:, :, None, None], ref(q, k, v) * rows[:, :, None, None],
                               atol=1e-5, rtol=1e-5)
    for g_got, g_ref in zip(jax.grad(loss(got), (0, 1, 2))(q, k, v), jax.grad(loss(ref), (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(g_got, g_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("make_mask", [_packed, _left_padded])
@pytest.mark.parametrize("block", [16, 36])  # divides T; does not (and T under two blocks)
def test_chunked_equals_the_einsum(make_mask, block):
    t = 48
    mask = make_mask(t)
    _compare("chunked", *_qkv(t), mask, mask.dense().any(-1), block)


def test_chunked_rows_that_see_nothing_stay_finite_and_skipped_blocks_change_nothing_else():
    t = 40
    mask = _left_padded(t)  # row 0's padding queries see no key: an average of values, never read
    q, k, v = _qkv(t, seed=3)
    out = attention(q, k, v, mask, "chunked", block=8)  # 5 x 5 blocks, 10 of them above the diagonal
    assert np.isfinite(out).all()
    seen = mask.dense().any(-1)[:, :, None, None]
    np.testing.assert_allclose(out * seen, dense_attention(q, k, v, mask.dense()) * seen, atol=1e-5)


def test_chunked_with_queries_at_an_offset_into_a_longer_cache():
    """A prefill of 20 tokens at slots 10..29 of a 56-slot cache (the sampler's case)."""
    q, k, v = _qkv(20, 56, seed=1)
    valid = np.zeros((B, 56), bool)
    valid[:, :30] = True
    valid[1, :13] = False
    mask = Mask.causal(10 + jnp.arange(20), jnp.asarray(valid))
    _compare("chunked", q, k, v, mask, mask.dense().any(-1), block=16)


def test_dot_product_attention_call_equals_the_einsum():
    mask = _packed(48)
    _compare("cudnn", *_qkv(48), mask, mask.dense().any(-1))


def test_splash_kernel_in_interpret_mode_equals_the_einsum_on_one_response_rows():
    t = 100  # padded to 128 inside
    seg = np.full((B, t), -1, np.int32)
    seg[0, :30], seg[0, 30:90] = 0, 1  # prompt, response, padding
    seg[1, :50], seg[1, 50:] = 0, 1
    mask = Mask.packed(jnp.asarray(seg))
    real = jnp.asarray(seg >= 0)
    _compare("splash", *_qkv(t, seed=2), mask, real)


def test_backend_choice():
    f32, bf16 = jnp.float32, jnp.bfloat16
    assert resolve_backend("auto", 1, 8192, f32, True, "tpu") == "xla"  # decoding one token
    assert resolve_backend("auto", 512, 512, f32, False, "cpu") == "xla"
    assert resolve_backend("auto", 8192, 8192, f32, False, "cpu") == "chunked"
    assert resolve_backend("auto", 4096, 4096, bf16, False, "gpu") == "cudnn"
    assert resolve_backend("auto", 4096, 4096, f32, False, "gpu") == "chunked"  # cuDNN is 16-bit only
    assert resolve_backend("splash", 4096, 4096, bf16, True, "tpu") == "chunked"  # a prefill into the cache
    with pytest.raises(ValueError, match="model.attention must be one of"):
        resolve_backend("flash", 8, 8, f32, False)


@pytest.mark.parametrize("backend", ["chunked", "cudnn"])
def test_the_model_gives_the_same_logits_and_cache_with_each_backend(backend):
    cfg = get_preset("test-tiny")
    dense = Qwen3(cfg.replace(attention="xla"), rngs=nnx.Rngs(0))
    other = Qwen3(cfg.replace(attention=backend, attention_block=16), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 40), 0, cfg.vocab_size)
    mask = jnp.arange(40)[None] >= jnp.array([[5], [0]])  # row 0 left-padded
    positions = jnp.maximum(jnp.cumsum(mask, 1) - 1, 0)
    cache = KVCache.init(cfg, 2, 64)
    (a, ca), (b, cb) = dense(tokens, positions, mask, cache), other(tokens, positions, mask, cache)
    np.testing.assert_allclose(a * mask[..., None], b * mask[..., None], atol=2e-5)
    real = ca.valid[None, :, None, :, None]  # padding slots hold keys nobody reads
    np.testing.assert_allclose(ca.k * real, cb.k * real, atol=2e-5)
    np.testing.assert_array_equal(ca.valid, cb.valid)


def _update_temp_bytes(backend, t, run=False):
    """Temporary bytes of the trainer's compiled update (loss, backward, AdamW) on one [1, t] row;
    with `run`, the update also runs once on a real row and must give a finite loss."""
    from atgrpo_jax.algo.loss import LossSettings
    from atgrpo_jax.train.config import base_config
    from atgrpo_jax.bench.rows import rows_update
    from atgrpo_jax.train.update import init_state, make_optimizer, make_update_fns

    cfg = get_preset("test-tiny").replace(attention=backend, max_position_embeddings=16384)
    graphdef, params = nnx.split(Qwen3(cfg, rngs=nnx.Rngs(0)))
    tx, _ = make_optimizer(base_config().optim, 10)
    _, update_fn = make_update_fns(graphdef, nnx.State({}), tx, LossSettings(), 256)
    update_fn = rows_update(update_fn)
    row = lambda dtype: jax.ShapeDtypeStruct((1, t), dtype)  # noqa: E731
    batch = (row(jnp.int32), row(bool), row(bool), row(jnp.float32), jax.ShapeDtypeStruct((1,), jnp.float32))
    state = jax.eval_shape(lambda: init_state(params, tx))
    compiled = update_fn.lower(state, batch).compile()
    if run:
        tokens = jax.random.randint(jax.random.key(0), (1, t), 0, cfg.vocab_size)
        is_resp = jnp.arange(t)[None] >= t // 4
        old = jnp.full((1, t), -6.0)
        _, metrics = compiled(init_state(params, tx), (tokens, jnp.ones((1, t), bool), is_resp, old, jnp.ones(1)))
        assert np.isfinite(float(metrics["loss"])) and float(metrics["skipped"]) == 0
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.full  # tiers.py: ~17 s of compiles; the chunked backend's equality with the einsum stays in the default tier
def test_an_update_step_with_chunked_attention_grows_linearly_in_length():
    """XLA's own memory analysis of the compiled update: 8192 tokens need at most 2.3x the
    memory of 4096 with the chunked backend, and less than the einsum needs for 4096 (its
    [T, T] scores, 4x at 8192)."""
    chunked = {t: _update_temp_bytes("chunked", t, run=t == 8192) for t in (4096, 8192)}
    assert chunked[8192] <= 2.3 * chunked[4096], chunked
    dense = _update_temp_bytes("xla", 4096)
    assert chunked[8192] * 2 < dense, (chunked, dense)
