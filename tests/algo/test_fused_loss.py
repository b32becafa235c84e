"""The fused head loss (gradients computed in the forward chunk pass) equals
the plain path: chunked log-probs, the loss of rows, autodiff through remat."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.algo.logprobs import SampledFrom, fused_head_loss, token_logprobs
from atgrpo_jax.algo.loss import LossSettings, aggregation_weights, token_loss_terms, weighted_policy_loss
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.bench.rows import rows_packed
from atgrpo_jax.train.update import init_state, make_optimizer, make_update_fns, sequence_logprobs
from atgrpo_jax.train.config import base_config
from jaxpr_walk import all_eqns
from tiers import full_case

CONFIGS = [LossSettings(), LossSettings(aggregation="seq-mean-token-mean"),
           LossSettings(dual_clip=3.0, eps_high=0.28), LossSettings(kl_coef=0.1, entropy_coef=0.01)]


def random_inputs(seed=0, b=3, t=11, d=16, v=50):
    ks = jax.random.split(jax.random.key(seed), 6)
    hidden = jax.random.normal(ks[0], (b, t, d))
    head = jax.random.normal(ks[1], (d, v)) * 0.5
    targets = jax.random.randint(ks[2], (b, t), 0, v)
    mask = jax.random.uniform(ks[3], (b, t)) > 0.3
    mask = mask.at[-1].set(False)  # a sample with no trained token
    old = jnp.log(jax.random.uniform(ks[4], (b, t), minval=0.01, maxval=0.2))
    ref = old + 0.1 * jax.random.normal(ks[5], (b, t))
    adv = jnp.linspace(-1.5, 2.0, b)
    return hidden, head, targets, mask, old, ref, adv


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("chunk", [4, 1000])  # several padded chunks; one chunk
def test_fused_loss_and_gradients_equal_remat_path(cfg, chunk):
    hidden, head, targets, mask, old, ref, adv = random_inputs()

    def plain(h, w):
        logp, ent = token_logprobs(h, w, targets, chunk)
        return rows_loss(cfg, logp, old, adv, mask, ref, ent)[0]

    def fused(h, w):
        x = {"old": old, "adv": jnp.broadcast_to(adv[:, None], old.shape),
             "w": aggregation_weights(mask, cfg.aggregation), "ref": ref}
        return fused_head_loss(h, w, targets, x, lambda lp, en, xc: token_loss_terms(cfg, lp, en, xc),
                               chunk)[0]

    (l1, g1), (l2, g2) = (jax.value_and_grad(f, argnums=(0, 1))(hidden, head) for f in (plain, fused))
    np.testing.assert_allclose(l2, l1, rtol=1e-5, atol=1e-7)
    for a, b in zip(g1, g2):
        assert float(jnp.abs(a).max()) > 0
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7)


def test_frozen_head_gets_no_gradient_and_the_same_hidden_gradient():
    hidden, head, targets, mask, old, ref, adv = random_inputs(1)
    cfg = LossSettings()
    x = {"old": old, "adv": jnp.broadcast_to(adv[:, None], old.shape), "w": aggregation_weights(mask, cfg.aggregation)}
    terms = lambda lp, en, xc: token_loss_terms(cfg, lp, en, xc)
    grad = lambda head_grad: jax.grad(lambda h, w: fused_head_loss(h, w, targets, x, terms, 8, head_grad)[0],
                                      argnums=(0, 1))(hidden, head)
    (dh, dw), (dh_frozen, dw_frozen) = grad(True), grad(False)
    np.testing.assert_allclose(dh_frozen, dh, rtol=1e-6, atol=1e-8)
    assert float(jnp.abs(dw).max()) > 0 and not jnp.any(dw_frozen)


def rows_loss(cfg, logp, old, adv, mask, ref, ent):
    """The loss of [B, T] rows, adv [B] spread over each row's tokens."""
    return weighted_policy_loss(cfg, aggregation_weights(mask, cfg.aggregation), logp, old,
                                jnp.broadcast_to(adv[:, None], logp.shape), ref, ent)


def assert_update_reports(update, tx, params, batch, reference):
    """One update step reports the loss, metrics and gradient norm of `reference(params)` -> (loss, metrics)."""
    (loss, metrics), grads = jax.value_and_grad(reference, has_aux=True)(params)
    _, got = update(init_state(jax.tree.map(jnp.copy, params), tx), batch)
    norm = float(jnp.sqrt(sum((g ** 2).sum() for g in jax.tree.leaves(grads))))
    np.testing.assert_allclose(got["grad_norm"], norm, rtol=1e-5)
    for k, v in dict(metrics, loss=loss).items():
        np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-7, err_msg=k)


def test_update_step_matches_the_loss_of_rows():
    """The trainer's update reports the loss, metrics and gradient norm of the rows' loss."""
    cfg = LossSettings(kl_coef=0.05, entropy_coef=0.02, aggregation="seq-mean-token-mean", dual_clip=2.0)
    model = Qwen3(get_preset("test-tiny"), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (4, 20)), jnp.int32)
    valid = jnp.asarray(np.arange(20)[None] < np.array([20, 17, 12, 20])[:, None])
    is_resp = valid & (jnp.arange(20)[None] >= 8)
    old = jnp.asarray(rng.normal(-4.0, 0.3, (4, 20)), jnp.float32)
    adv = jnp.array([1.0, -0.5, 0.3, -1.2])
    batch = rows_packed(tokens, valid, is_resp, old, adv, old + 0.05)
    tx, _ = make_optimizer(base_config().optim, 10)
    _, update = make_update_fns(graphdef, nnx.State({}), tx, cfg, 16)

    def reference(p):
        logp, ent = sequence_logprobs(nnx.merge(graphdef, p), tokens, valid, 16)
        return rows_loss(cfg, logp, old, adv, is_resp, old + 0.05, ent)

    assert_update_reports(update, tx, params, batch, reference)


@pytest.mark.parametrize("how", [SampledFrom(top_k=5), SampledFrom(top_p=True), SampledFrom(top_k=5, top_p=True)])
def test_gradients_through_a_truncated_distribution_are_finite(how):
    """Tokens outside the top-k / top-p get logit -inf: the entropy's p * log p must not turn that
    into 0 * inf = NaN in the backward pass (it did: every update of a top-k/top-p run was skipped)."""
    b, t, d, v = 2, 6, 8, 64
    h = jax.random.normal(jax.random.key(0), (b, t, d))
    w = jax.random.normal(jax.random.key(1), (d, v))
    y = jax.random.randint(jax.random.key(2), (b, t), 0, v)
    kw = dict(how=how, inv_temp=jnp.full((b, t), 1 / 1.5), top_p=jnp.full((b, t), 0.9))
    adv = jax.random.normal(jax.random.key(3), (b, t))

    def fused(h, w):
        return fused_head_loss(h, w, y, {"adv": adv}, lambda lp, en, x: x["adv"] * lp + 0.01 * en, 4, **kw)[0]

    def plain(h, w):
        lp, en = token_logprobs(h, w, y, 4, **kw)
        return (adv * lp + 0.01 * en).sum()

    for g_fused, g_plain in zip(jax.grad(fused, (0, 1))(h, w), jax.grad(plain, (0, 1))(h, w)):
        assert bool(jnp.isfinite(g_fused).all()) and bool(jnp.isfinite(g_plain).all())
        np.testing.assert_allclose(g_fused, g_plain, rtol=1e-4, atol=1e-5)


def test_repetition_penalty_gradients_are_finite_when_the_last_chunk_is_padded():
    """The padded rows of the last chunk take penalty 1: with 0 their logits were divided by 0 and the
    NaN gradient, times the padding's zero hidden states, made the head's gradient NaN (every update
    of a run with repetition_penalty != 1 whose tokens did not fill the chunks was skipped)."""
    from atgrpo_jax.algo.logprobs import NOT_SEEN, Repeats

    b, t, d, v = 2, 5, 8, 32  # 10 tokens: chunks of 4 leave 2 padded rows
    h = jax.random.normal(jax.random.key(0), (b, t, d))
    w = jax.random.normal(jax.random.key(1), (d, v))
    y = jax.random.randint(jax.random.key(2), (b, t), 0, v)
    in_prompt = jax.random.uniform(jax.random.key(3), (b, v)) < 0.3
    repeats = Repeats(jnp.where(in_prompt, -1, NOT_SEEN).astype(jnp.int32), jnp.repeat(jnp.arange(b)[:, None], t, 1),
                      jnp.broadcast_to(jnp.arange(t), (b, t)), jnp.full((b, t), 1.2))
    how = SampledFrom(top_k=8, repetition_penalty=True)
    adv = jax.random.normal(jax.random.key(4), (b, t))

    def fused(h, w, chunk):
        return fused_head_loss(h, w, y, {"adv": adv}, lambda lp, en, x: x["adv"] * lp, chunk, how=how,
                               repeats=repeats)[0]

    def plain(h, w, chunk):
        return (adv * token_logprobs(h, w, y, chunk, how=how, repeats=repeats)[0]).sum()

    for loss in (fused, plain):
        padded, whole = (jax.grad(loss, (0, 1))(h, w, chunk) for chunk in (4, b * t))
        for a, c in zip(padded, whole):
            assert bool(jnp.isfinite(a).all()) and float(jnp.abs(a).max()) > 0
            np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)


def test_vocab_limit_gradients_equal_the_plain_path_and_leave_the_unused_columns_zero():
    """With a head wider than the tokenizer, only the drawable columns get a gradient."""
    b, t, d, v, limit = 2, 5, 8, 40, 33
    h, w = jax.random.normal(jax.random.key(0), (b, t, d)), jax.random.normal(jax.random.key(1), (d, v))
    y = jax.random.randint(jax.random.key(2), (b, t), 0, limit)
    adv = jax.random.normal(jax.random.key(3), (b, t))
    how = SampledFrom(vocab_limit=limit)
    fused = lambda h, w: fused_head_loss(h, w, y, {"adv": adv}, lambda lp, en, x: x["adv"] * lp, 4, how=how)[0]
    plain = lambda h, w: (adv * token_logprobs(h, w, y, 4, how=how)[0]).sum()
    g_fused, g_plain = jax.grad(fused, (0, 1))(h, w), jax.grad(plain, (0, 1))(h, w)
    for a, b_ in zip(g_fused, g_plain):
        np.testing.assert_allclose(a, b_, rtol=1e-4, atol=1e-6)
    assert not jnp.any(g_fused[1][:, limit:]) and float(jnp.abs(g_fused[1][:, :limit]).max()) > 0


def test_bf16_head_gradients_multiply_bf16_operands_and_stay_close_to_float32():
    """In bf16 compute the head's gradients multiply the logits' gradient rounded to bf16 (a float32
    operand would make the backward GEMMs float32 ones), and stay within bf16 rounding of float32."""
    hidden, head, targets, mask, old, ref, adv = random_inputs(2, b=4, t=16, d=32, v=96)
    hidden, head = hidden.astype(jnp.bfloat16), head.astype(jnp.bfloat16)
    cfg = LossSettings()
    x = {"old": old, "adv": jnp.broadcast_to(adv[:, None], old.shape), "w": aggregation_weights(mask, cfg.aggregation)}
    terms = lambda lp, en, xc: token_loss_terms(cfg, lp, en, xc)
    loss = lambda h, w: fused_head_loss(h, w, targets, x, terms, 16)[0]
    dots = [e for e in all_eqns(jax.make_jaxpr(jax.grad(loss, (0, 1)))(hidden, head).jaxpr)
            if e.primitive.name == "dot_general"]
    assert len(dots) >= 3  # the logits, and the two gradients
    assert all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars), \
        [tuple(str(v.aval.dtype) for v in e.invars) for e in dots]
    got = jax.grad(loss, (0, 1))(hidden, head)
    want = jax.grad(loss, (0, 1))(hidden.astype(jnp.float32), head.astype(jnp.float32))
    for g, r in zip(got, want):
        g, r = np.asarray(g, np.float32), np.asarray(r)
        assert np.linalg.norm(g - r) / np.linalg.norm(r) < 2e-2


def test_chunks_per_head_product_divide_the_chunks_and_keep_within_the_head_gradient():
    from atgrpo_jax.algo.logprobs import chunks_per_head_product
    d = 2048  # Qwen3-1.7B: 4,096 tokens in bf16 are one product; 8,192 two; in float32 half as many per product
    assert chunks_per_head_product(8, 512, d, 2) == 8
    assert chunks_per_head_product(16, 512, d, 2) == 8
    assert chunks_per_head_product(8, 512, d, 4) == 4
    assert chunks_per_head_product(7, 512, d, 4) == 1  # no divisor of 7 up to 4: one chunk at a time
    assert chunks_per_head_product(3, 8192, d, 2) == 1  # a chunk larger than the bound still runs
    for n in range(1, 40):
        k = chunks_per_head_product(n, 96, 256, 2)
        assert n % k == 0 and (k == 1 or k * 96 * 2 <= 4 * 256)


def test_update_step_with_importance_correction_matches_the_loss_of_rows():
    """loss.is_correction: the trainer's fused update weighs each token as the rows' loss does."""
    from atgrpo_jax.algo.loss import is_weights

    cfg = LossSettings(is_correction="truncated", is_cap=1.2)
    model = Qwen3(get_preset("test-tiny"), rngs=nnx.Rngs(1))
    graphdef, params = nnx.split(model)
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (3, 16)), jnp.int32)
    valid = jnp.asarray(np.arange(16)[None] < np.array([16, 13, 10])[:, None])
    is_resp = valid & (jnp.arange(16)[None] >= 5)
    old = jnp.asarray(rng.normal(-4.0, 0.3, (3, 16)), jnp.float32)
    sampler = old + jnp.asarray(rng.normal(0.0, 0.3, (3, 16)), jnp.float32)
    adv = jnp.array([1.0, -0.7, 0.4])
    w = is_weights(cfg, old, sampler)
    assert float(w.min()) < 1.0 and float(w.max()) == pytest.approx(1.2)
    batch = rows_packed(tokens, valid, is_resp, old, adv)
    # the weights in the batch's packed layout: packed the way old log-probs are
    batch = batch._replace(is_weight=rows_packed(tokens, valid, is_resp, w, adv).old_logp)
    tx, _ = make_optimizer(base_config().optim, 10)
    _, update = make_update_fns(graphdef, nnx.State({}), tx, cfg, 16)

    def reference(p):
        logp, ent = sequence_logprobs(nnx.merge(graphdef, p), tokens, valid, 16)
        return weighted_policy_loss(cfg, aggregation_weights(is_resp, cfg.aggregation), logp, old,
                                    jnp.broadcast_to(adv[:, None], logp.shape), None, ent, w)

    assert_update_reports(update, tx, params, batch, reference)


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", full_case("token-mean")])  # tiers.py
def test_sequence_ratio_update_is_gspo(aggregation):
    """loss.ratio_level="sequence": the fused update's loss, metrics and gradient are GSPO's objective
    (Zheng et al. 2025), written here plainly over rows: s_i = exp(mean of the sample's token
    log-ratios), each sample's surrogate max(-A s, -A clip(s)) spread over its tokens by the weights."""
    cfg = LossSettings(ratio_level="sequence", aggregation=aggregation, eps_low=0.1, eps_high=0.15)
    model = Qwen3(get_preset("test-tiny"), rngs=nnx.Rngs(2))
    graphdef, params = nnx.split(model)
    rng = np.random.default_rng(2)
    n, t = 5, 16
    tokens = jnp.asarray(rng.integers(0, model.cfg.vocab_size, (n, t)), jnp.int32)
    valid = jnp.asarray(np.arange(t)[None] < np.array([16, 13, 10, 16, 12])[:, None])
    is_resp = valid & (jnp.arange(t)[None] >= 5)
    now, _ = sequence_logprobs(model, tokens, valid, 16)
    # old log-probs a per-sample shift (some past the clip, some inside) plus per-token noise away from now
    shift = jnp.array([0.0, 0.3, -0.3, 0.05, -0.25])[:, None]
    old = now - shift + jnp.asarray(rng.normal(0.0, 0.2, (n, t)), jnp.float32)
    adv = jnp.array([1.0, 0.8, -0.6, -1.1, 0.5])
    batch = rows_packed(tokens, valid, is_resp, old, adv)
    batch = batch._replace(sample=jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[:, None], (n, t - 1)))
    tx, _ = make_optimizer(base_config().optim, 10)
    _, update = make_update_fns(graphdef, nnx.State({}), tx, cfg, 16)

    def reference(p):
        logp, _ = sequence_logprobs(nnx.merge(graphdef, p), tokens, valid, 16)
        m = is_resp.astype(jnp.float32)
        s = jnp.exp(((logp - old) * m).sum(1) / m.sum(1))
        per_sample = jnp.maximum(-adv * s, -adv * jnp.clip(s, 1 - cfg.eps_low, 1 + cfg.eps_high))
        clipped = (-adv * jnp.clip(s, 1 - cfg.eps_low, 1 + cfg.eps_high) > -adv * s).astype(jnp.float32)
        w = aggregation_weights(is_resp, aggregation)
        spread = lambda x: (w * x[:, None]).sum()  # noqa: E731
        loss = spread(per_sample)
        return loss, {"pg_loss": loss, "clip_frac": spread(clipped), "ratio_mean": spread(s)}

    clip_frac = float(reference(params)[1]["clip_frac"])
    assert 0.2 < clip_frac < 0.8  # some samples clipped, some not: both parts of the gradient are checked
    assert_update_reports(update, tx, params, batch, reference)

