"""The algorithm against plain NumPy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from atgrpo_jax.algo.advantages import group_advantages, group_filter, mix_rewards
from atgrpo_jax.algo.logprobs import token_logprobs
from atgrpo_jax.algo.loss import LossSettings, aggregation_weights, weighted_policy_loss


def policy_loss(cfg, logp, old_logp, advantages, mask, ref_logp=None, entropy=None):
    """The loss of [B, T] rows, advantages [B] (one per sample, spread over its tokens)."""
    adv = jnp.broadcast_to(advantages[:, None], logp.shape)
    return weighted_policy_loss(cfg, aggregation_weights(mask, cfg.aggregation), logp, old_logp, adv, ref_logp,
                                entropy)


def np_advantages(rewards, mask, use_std=True):
    out = np.zeros_like(rewards)
    for g in range(rewards.shape[0]):
        idx = np.flatnonzero(mask[g])
        if len(idx) < 2:
            continue
        r = rewards[g, idx]
        a = r - r.mean()
        if use_std:
            a = a / (r.std(ddof=1) + 1e-6)
        out[g, idx] = a
    return out


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo"])
def test_group_advantages_equal_numpy_loop(estimator):
    rng = np.random.RandomState(0)
    rewards = rng.randn(200, 8).astype(np.float32)
    rewards[:20] = 3.0  # zero-variance groups
    mask = rng.rand(200, 8) > 0.3
    mask[20:30] = False  # finished tasks
    mask[30:40, 1:] = False  # singleton groups
    got = np.asarray(group_advantages(jnp.asarray(rewards), jnp.asarray(mask), estimator))
    np.testing.assert_allclose(got, np_advantages(rewards, mask, estimator == "grpo"), rtol=1e-5, atol=1e-5)
    assert np.all(got[30:40] == 0) and np.all(got[20:30] == 0)


def test_an_unknown_estimator_names_the_key_and_the_choices():
    known = "counterfactual, drgrpo, grpo"
    with pytest.raises(KeyError, match=rf"algo.advantage: unknown 'gpro' \(did you mean 'grpo'\?\); known: {known}"):
        group_advantages(jnp.zeros((1, 2)), jnp.ones((1, 2), bool), "gpro")


def test_mix_rewards():
    np.testing.assert_allclose(mix_rewards(jnp.array([1.0, -2.0]), jnp.array([0.5, 0.5]), 2.0), [2.0, -1.0])


def test_group_filter_matches_numpy():
    rng = np.random.RandomState(1)
    rewards = rng.randn(50, 4).astype(np.float32)
    rewards[:7] = 1.0
    mask = np.ones((50, 4), bool)
    mask[45:] = False
    keep = np.asarray(group_filter(jnp.asarray(rewards), jnp.asarray(mask), 0.5, True))
    live = np.arange(45)
    means = rewards[live].mean(1)
    dropped_low = live[np.argsort(means, kind="stable")[:22]]
    expected = np.zeros(50, bool)
    expected[live] = True
    expected[dropped_low] = False
    expected[:7] = False
    np.testing.assert_array_equal(keep, expected)


def test_group_filter_ranks_within_each_scope():
    """The issue's case: per_role, agent 1's rewards on a higher scale; one filter over both agents
    kept only agent 1's groups. Within each policy's groups, each keeps its better half. A NumPy
    reference on random data, scopes of uneven sizes, dead groups included."""
    r = jnp.array([[.1, .3], [.2, .4], [.3, .9], [.6, 1.2]])
    m = jnp.ones((4, 2), bool)
    assert np.asarray(group_filter(r, m, 0.5)).tolist() == [False, False, True, True]
    assert np.asarray(group_filter(r, m, 0.5, scope=jnp.array([0, 0, 1, 1]))).tolist() == [False, True, False, True]
    rng = np.random.RandomState(2)
    rewards = rng.randn(60, 4).astype(np.float32)
    mask = rng.rand(60, 4) > 0.2
    mask[50:] = False
    scope = rng.randint(0, 3, 60)
    keep = np.asarray(group_filter(jnp.asarray(rewards), jnp.asarray(mask), 0.4, scope=jnp.asarray(scope)))
    expected = np.zeros(60, bool)
    for s in range(3):
        live = [g for g in range(60) if scope[g] == s and mask[g].any()]
        means = [rewards[g][mask[g]].mean() for g in live]
        drop = int(np.floor(0.4 * len(live)))
        for rank, i in enumerate(np.argsort(means, kind="stable")):
            expected[live[i]] = rank >= drop
    np.testing.assert_array_equal(keep, expected)


def np_loss(logp, old, adv, mask, eps_lo, eps_hi, dual, agg, kl_coef, ref, ent_coef, ent):
    ratio = np.exp(logp - old)
    a = adv[:, None]
    pg = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - eps_lo, 1 + eps_hi))
    if dual:
        pg = np.where(a < 0, np.minimum(pg, -a * dual), pg)

    def mean(x):
        if agg == "token-mean":
            return (x * mask).sum() / mask.sum()
        rows = [x[i][mask[i]].mean() for i in range(len(x)) if mask[i].any()]
        return np.mean(rows)

    loss = mean(pg)
    if kl_coef:
        d = ref - logp
        loss += kl_coef * mean(np.exp(d) - d - 1)
    return loss - ent_coef * mean(ent)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("dual,kl,ent", [(0.0, 0.0, 0.0), (3.0, 0.01, 0.001)])
def test_loss_equals_numpy(agg, dual, kl, ent):
    rng = np.random.RandomState(2)
    b, t = 6, 9
    logp = rng.randn(b, t) * 0.3 - 2
    old = logp + rng.randn(b, t) * 0.4
    ref = logp + rng.randn(b, t) * 0.2
    entropy = rng.rand(b, t) * 3
    adv = rng.randn(b)
    mask = rng.rand(b, t) > 0.3
    mask[2] = False
    cfg = LossSettings(dual_clip=dual, aggregation=agg, kl_coef=kl, entropy_coef=ent)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    loss, metrics = policy_loss(cfg, f32(logp), f32(old), f32(adv), jnp.asarray(mask), f32(ref), f32(entropy))
    expected = np_loss(logp, old, adv, mask, 0.2, 0.2, dual, agg, kl, ref, ent, entropy)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert 0 < float(metrics["clip_frac"]) < 1


def test_clip_fraction_and_gradient_at_the_clip_edges():
    cfg = LossSettings()
    old = jnp.zeros((1, 4))
    mask = jnp.ones((1, 4), bool)
    # ratios 0.7, 0.9, 1.1, 1.3 with positive advantage: only 1.3 is clipped
    logp = jnp.log(jnp.array([[0.7, 0.9, 1.1, 1.3]]))
    grad_fn = jax.grad(lambda lp, a: policy_loss(cfg, lp, old, a, mask)[0])
    _, m = policy_loss(cfg, logp, old, jnp.array([1.0]), mask)
    assert float(m["clip_frac"]) == pytest.approx(0.25)
    g = np.asarray(grad_fn(logp, jnp.array([1.0])))
    assert np.all(np.isfinite(g)) and g[0, 3] == 0 and np.all(g[0, :3] < 0)
    # negative advantage: 0.7 is clipped (ratio below 1 - eps), the rest are not
    _, m = policy_loss(cfg, logp, old, jnp.array([-1.0]), mask)
    assert float(m["clip_frac"]) == pytest.approx(0.25)
    g = np.asarray(grad_fn(logp, jnp.array([-1.0])))
    assert g[0, 0] == 0 and np.all(g[0, 1:] > 0)


def test_loss_config_errors():
    with pytest.raises(ValueError, match="loss.aggregation"):
        LossSettings(aggregation="sum")
    with pytest.raises(ValueError, match="loss.dual_clip"):
        LossSettings(dual_clip=0.5)


def test_chunked_logprobs_equal_full_softmax_and_grads():
    rng = np.random.RandomState(3)
    h = jnp.asarray(rng.randn(3, 7, 16), jnp.float32)
    w = jnp.asarray(rng.randn(16, 50), jnp.float32)
    y = jnp.asarray(rng.randint(0, 50, (3, 7)))

    def full(h, w):
        logits = jnp.einsum("btd,dv->btv", h, w)
        lp = jax.nn.log_softmax(logits)
        ent = -(jnp.exp(lp) * lp).sum(-1)
        return jnp.take_along_axis(lp, y[..., None], -1)[..., 0], ent

    lp, ent = token_logprobs(h, w, y, chunk_size=4)  # 21 rows: uneven last chunk
    lp_ref, ent_ref = full(h, w)
    np.testing.assert_allclose(lp, lp_ref, atol=1e-5)
    np.testing.assert_allclose(ent, ent_ref, atol=1e-5)
    g = jax.grad(lambda h, w: token_logprobs(h, w, y, 4)[0].sum(), argnums=(0, 1))(h, w)
    g_ref = jax.grad(lambda h, w: full(h, w)[0].sum(), argnums=(0, 1))(h, w)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_chunked_logprobs_never_build_full_logits():
    """The compiled backward keeps one chunk of logits, not [B*T, V]."""
    b, t, d, v, chunk = 4, 256, 64, 20_000, 64
    h = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    w = jax.ShapeDtypeStruct((d, v), jnp.float32)
    y = jax.ShapeDtypeStruct((b, t), jnp.int32)

    def peak(fn):
        compiled = jax.jit(jax.grad(fn, argnums=(0, 1))).lower(h, w, y).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    chunked = peak(lambda h, w, y: token_logprobs(h, w, y, chunk)[0].sum())

    def full(h, w, y):
        lp = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, w))
        return jnp.take_along_axis(lp, y[..., None], -1).sum()

    full_bytes = b * t * v * 4
    assert peak(full) >= full_bytes
    assert chunked < full_bytes / 4, (chunked, full_bytes)


@pytest.mark.parametrize("how", ["truncated", "masked"])
def test_importance_correction_equals_numpy(how):
    """TIS / MIS: each token's surrogate times min(pi_old / pi_sampler, C), or times 0 where it passes C."""
    from atgrpo_jax.algo.loss import is_weights

    rng = np.random.RandomState(4)
    b, t, cap = 5, 8, 1.5
    logp = rng.randn(b, t) * 0.3 - 2
    old = logp + rng.randn(b, t) * 0.2
    sampler = old + rng.randn(b, t) * 0.5  # a sampler that drifted from the trainer
    adv, mask = rng.randn(b), rng.rand(b, t) > 0.2
    ratio = np.exp(old - sampler)
    w_np = np.minimum(ratio, cap) if how == "truncated" else (ratio <= cap).astype(float)
    assert (ratio > cap).any() and (ratio < 1).any()  # both sides of the cap are exercised
    a = adv[:, None]
    r = np.exp(logp - old)
    pg = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.2))
    expected = (w_np * pg * mask).sum() / mask.sum()
    cfg = LossSettings(is_correction=how, is_cap=cap)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    w = is_weights(cfg, f32(old), f32(sampler))
    np.testing.assert_allclose(np.asarray(w), w_np, rtol=1e-5)
    loss, metrics = weighted_policy_loss(cfg, aggregation_weights(jnp.asarray(mask), cfg.aggregation), f32(logp),
                                         f32(old), jnp.broadcast_to(f32(adv)[:, None], (b, t)), is_w=w)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["is_weight_mean"]), (w_np * mask).sum() / mask.sum(), rtol=1e-5)
    assert is_weights(LossSettings(), f32(old), f32(sampler)) is None
    with pytest.raises(ValueError, match="loss.is_correction"):
        LossSettings(is_correction="tis")
    with pytest.raises(ValueError, match="loss.is_cap"):
        LossSettings(is_correction="truncated", is_cap=0.5)


def np_overlong(length, budget, buffer, factor):
    """DAPO's piecewise rule, case by case."""
    start = budget - buffer
    if length <= start:
        return 0.0
    if length >= budget:
        return -factor
    return -factor * (length - start) / buffer


def test_overlong_penalty_equals_dapos_rule():
    from atgrpo_jax.algo.advantages import overlong_penalty

    lengths = np.arange(0, 40)
    got = np.asarray(overlong_penalty(lengths, np.full(40, 32), 8, 0.5))
    np.testing.assert_allclose(got, [np_overlong(n, 32, 8, 0.5) for n in lengths], rtol=1e-6, atol=1e-7)
    assert not np.asarray(overlong_penalty(lengths, np.full(40, 32), 0)).any()  # off


def test_score_groups_punishes_and_drops_overlong_responses():
    """algo.overlong_buffer shifts the rewards the advantages see; algo.drop_overlong keeps a response that
    used its whole budget out of training (each agent its own budget)."""
    import types

    from atgrpo_jax.algo.advantages import overlong_penalty
    from atgrpo_jax.train.config import base_config
    from atgrpo_jax.train.validate import resolve
    from atgrpo_jax.train.groups import score_groups

    c = base_config()
    c.algo.update(overlong_buffer=4, drop_overlong=True, drop_low_mean_frac=0.0)
    budgets = [16, 8]
    run = types.SimpleNamespace(config=resolve(c, weights=False),
                                sampling=[types.SimpleNamespace(max_new_tokens=b) for b in budgets],
                                policies=[0], policy_of_agent=np.array([0, 0]),
                                workflow=types.SimpleNamespace(agents=[types.SimpleNamespace(name="a"),
                                                                       types.SimpleNamespace(name="b")]))
    reward = np.array([[1.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.5, 1.0]], np.float32)
    length = np.array([[3, 14, 16, 10], [8, 2, 5, 7]])
    agent = np.array([0, 1])
    samples = types.SimpleNamespace(reward=reward, mask=np.ones((2, 4), bool), response_len=length, agent=agent,
                                    sample_agent=np.repeat(agent[:, None], 4, 1))
    groups = score_groups(run, samples, 1)
    budget = np.array(budgets)[samples.sample_agent]
    shifted = reward + np.vectorize(np_overlong)(length, budget, 4, 1.0)
    np.testing.assert_allclose(groups.adv, np.asarray(group_advantages(jnp.asarray(shifted), jnp.ones((2, 4)))),
                               rtol=1e-5, atol=1e-6)
    assert groups.trained.tolist() == [[True, True, False, True], [False, True, True, True]]
    c.algo.update(overlong_buffer=0, drop_overlong=False)
    run.config = resolve(c, weights=False)
    plain = score_groups(run, samples, 1)
    assert plain.trained.all() and not np.allclose(plain.adv, groups.adv)
    assert not np.asarray(overlong_penalty(length, budget, 0)).any()
    c.algo.role_advantage = {"b": "drgrpo"}  # agent b's groups by another estimator, a's as before
    run.config = resolve(c, weights=False)
    mixed = score_groups(run, samples, 1)
    np.testing.assert_allclose(mixed.adv[0], plain.adv[0])
    np.testing.assert_allclose(mixed.adv[1], np.asarray(group_advantages(jnp.asarray(reward[1:]), jnp.ones((1, 4)),
                                                                         "drgrpo"))[0], rtol=1e-6)
    assert not np.allclose(mixed.adv[1], plain.adv[1])


def test_first_informative_takes_each_scopes_earliest_groups_with_variance():
    """DAPO's pick: in each scope exactly min(want, informative) groups, all informative, none later (by
    order) than an informative group left out; groups of no scope (-1) never."""
    from atgrpo_jax.algo.advantages import first_informative

    rng = np.random.default_rng(0)
    for _ in range(20):
        g = 40
        scope, informative = rng.integers(-1, 3, g), rng.random(g) < 0.6
        order, want = rng.integers(0, 10, g), rng.integers(0, 12, 3)
        chosen = first_informative(scope, informative, order, want)
        assert not (chosen & ~informative).any() and not chosen[scope == -1].any()
        for s in range(3):
            mine = informative & (scope == s)
            assert chosen[mine].sum() == min(want[s], mine.sum())
            left = mine & ~chosen
            if chosen[mine].any() and left.any():
                assert order[chosen & mine].max() <= order[left].min()
