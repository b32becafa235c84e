"""Shared-prompt packing: a group's samples share one copy of their prompt, and
the log-probs, loss and update equal those of one row per sample."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiers import full_case

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.rollout.samples import Samples
from atgrpo_jax.bench.rows import as_rows, rows_packed
from atgrpo_jax.train.batch import PolicyBatch, fine_bucket, pack
from atgrpo_jax.train.config import base_config
from atgrpo_jax.train.update import init_state, make_optimizer, make_update_fns, sequence_logprobs

# (group id, prompt length, response lengths); group 2 has group 0's prompt length, other tokens
GROUPS = [(0, 5, [3, 4, 1]), (1, 7, [2]), (2, 5, [2, 2])]


def minibatch(groups=GROUPS, vocab=512, pad_rows=2, seed=0):
    """(a mini-batch of a policy's samples: each group's prompt once, its samples' slots together,
    empty slots last; the same samples as one row each: prompt then response, as a reference)."""
    rng = np.random.default_rng(seed)
    g_n, k_n = len(groups), max(len(rs) for _, _, rs in groups)
    p_n, r_n = max(p for _, p, _ in groups), max(max(rs) for _, _, rs in groups)
    prompt = np.zeros((g_n, p_n), np.int32)
    response, logp = np.zeros((g_n, k_n, r_n), np.int32), np.zeros((g_n, k_n, r_n), np.float32)
    response_len, mask = np.zeros((g_n, k_n), np.int32), np.zeros((g_n, k_n), bool)
    for g, p, rs in groups:
        prompt[g, :p] = rng.integers(1, vocab, p)
        for k, r in enumerate(rs):
            response[g, k, :r], logp[g, k, :r] = rng.integers(1, vocab, r), -rng.uniform(0.5, 5.0, r)
            response_len[g, k], mask[g, k] = r, True
    zeros = lambda dtype=np.float32: np.zeros((g_n, k_n), dtype)  # noqa: E731
    samples = Samples(prompt, np.array([p for _, p, _ in groups], np.int32),
                      np.repeat(np.arange(g_n)[:, None], k_n, 1), response, response_len, logp, zeros(), zeros(),
                      zeros(), mask, np.arange(g_n), np.zeros(g_n, int), zeros(int), np.zeros(g_n, int),
                      zeros(object), zeros(object), np.full(g_n, -1), zeros(int), zeros(object))
    g, k = np.nonzero(mask)
    n = len(g) + pad_rows
    pad = lambda x, fill=0: np.concatenate([x, np.full(pad_rows, fill, x.dtype)])  # noqa: E731
    adv = pad(rng.normal(size=len(g)).astype(np.float32))
    ones = np.ones(n, np.float32)
    mb = PolicyBatch(samples, pad(g, -1), pad(k), adv, ones, ones, None, 32)
    rows = dict(tokens=np.zeros((n, 32), np.int32), valid=np.zeros((n, 32), bool), is_resp=np.zeros((n, 32), bool),
                sampler_logp=np.zeros((n, 32), np.float32), adv=adv)
    for i, (gi, ki) in enumerate(zip(g, k)):
        p, r = samples.prompt_len[gi], response_len[gi, ki]
        rows["tokens"][i, :p + r] = np.r_[prompt[gi, :p], response[gi, ki, :r]]
        rows["valid"][i, :p + r], rows["is_resp"][i, p:p + r] = True, True
        rows["sampler_logp"][i, p:p + r] = logp[gi, ki, :r]
    return mb, rows


def entries(out, i):
    """Packed row and scored entries of mini-batch slot i."""
    (r,) = np.flatnonzero((out.sample == i).any(1))  # exactly one row
    return r, np.flatnonzero(out.sample[r] == i)


def test_each_prompt_once_then_its_responses():
    mb, rows = minibatch()
    out = pack(mb, shards=2)  # max_width: the batch's 32
    p_ = out.packed
    assert p_.tokens.shape[0] % 2 == 0 and p_.tokens.shape[0] >= 3  # 3 prompts, padded rows
    assert sorted(set(out.sample[out.sample >= 0])) == list(range(6))
    assert p_.pred.shape[1] == 8  # the most response tokens in a row (3 + 4 + 1)
    for i in range(6):
        r, e = entries(out, i)
        p, end = rows["is_resp"][i].argmax(), rows["valid"][i].sum()
        assert len(e) == end - p and np.all(np.diff(e) == 1) and p_.scored[r, e].all()
        np.testing.assert_array_equal(p_.tokens[r, :p], rows["tokens"][i, :p])  # the shared prompt
        np.testing.assert_array_equal(p_.target[r, e], rows["tokens"][i, p:end])
        pred = p_.pred[r, e]
        assert pred[0] == p - 1 and np.all(np.diff(pred[1:]) == 1)  # last prompt token, then its own
        np.testing.assert_array_equal(p_.tokens[r, pred[1:] + 1], rows["tokens"][i, p + 1:end])
        assert len(set(p_.segment[r, pred[1:] + 1])) <= 1 and p_.segment[r, pred[-1] + 1] > 0
        np.testing.assert_array_equal(p_.positions[r, pred[1:] + 1], np.arange(p + 1, end))
        assert (p_.adv[r, e] == rows["adv"][i]).all() and (p_.sample_len[r, e] == end - p).all()
        np.testing.assert_array_equal(out.sampler_logp[r, e], rows["sampler_logp"][i, p:end])
    assert p_.scored.sum() == 3 + 4 + 1 + 2 + 2 + 2
    real = p_.segment >= 0
    assert real.sum() == 5 + 7 + 5 + (3 + 4 + 1) + 2 + (2 + 2)  # no prompt token twice
    assert p_.penalty is None and p_.sample is None  # no repetition penalty: no ids to rebuild


def test_one_sample_per_row_is_the_rows_layout():
    """slots=1 without shared prompts: each row is one sample, prompt then response (the PyTorch baseline's)."""
    mb, rows = minibatch()
    out = pack(mb, slots=1, share_prompts=False)
    assert all(len(set(row[row >= 0])) == 1 for row in out.sample if (row >= 0).any())
    assert (out.packed.segment >= 0).sum() == 5 * 3 + 3 + 4 + 1 + 7 + 2 + 2 * (5 + 2)
    got = as_rows(out)
    live = got["valid"].any(1)
    assert live.sum() == 6
    for name in ("tokens", "valid", "is_resp"):
        np.testing.assert_array_equal(got[name][live], rows[name][:6, :got[name].shape[1]], err_msg=name)
    np.testing.assert_array_equal(got["adv"][live], rows["adv"][:6])
    with pytest.raises(ValueError, match="slots=1"):
        as_rows(pack(mb))


def test_long_groups_are_split_over_rows():
    """A row holds at most max_width tokens: 4 + 10 + 10 <= 32 < 4 + 3 * 10."""
    out = pack(minibatch([(0, 4, [10] * 6)], pad_rows=0)[0], max_width=32)
    assert (out.packed.segment == 0).sum(1).tolist()[:3] == [4, 4, 4]
    assert [len(set(row[row >= 0])) for row in out.sample[:3]] == [2, 2, 2]


def test_slots_cap_responses_per_row():
    out = pack(minibatch([(0, 4, [1] * 6)], pad_rows=0)[0], slots=4)  # 4 + 6 * 1 fit in 32
    assert [len(set(row[row >= 0])) for row in out.sample[:2]] == [4, 2]


def test_empty_prompt_is_an_error():
    mb, _ = minibatch([(0, 0, [2])], pad_rows=0)
    with pytest.raises(ValueError, match="empty prompt"):
        pack(mb)


@pytest.fixture(scope="module")
def tiny():
    model = Qwen3(get_preset("test-tiny"), rngs=nnx.Rngs(0))
    return nnx.split(model)


def test_packed_logprobs_equal_unshared_rows(tiny):
    graphdef, params = tiny
    mb, rows = minibatch()
    out = pack(mb)
    tx, _ = make_optimizer(base_config().optim, 10)
    logprobs_fn, _ = make_update_fns(graphdef, nnx.State({}), tx, LossSettings(), 16)
    packed = np.asarray(logprobs_fn(params, out.packed.placed()))
    want, _ = sequence_logprobs(nnx.merge(graphdef, params), jnp.asarray(rows["tokens"]),
                                jnp.asarray(rows["valid"]), 16)
    want = np.asarray(want)
    for i in range(6):
        r, e = entries(out, i)
        np.testing.assert_allclose(packed[r, e], want[i][rows["is_resp"][i]], rtol=1e-5, atol=1e-5)


# The default tier packs for the loss that reads the most per-token inputs (per-sample weights, the
# reference log-probs, each entry's sample for GSPO's sequence ratio); simpler losses in the full tier
# (tiers.py). The losses' math is held to the rows' loss in tests/algo/test_fused_loss.py; this test
# is about the packing.
@pytest.mark.parametrize("cfg", [LossSettings(aggregation="seq-mean-token-mean", kl_coef=0.1, ratio_level="sequence")]
                         + [full_case(LossSettings(aggregation="seq-mean-token-mean", kl_coef=0.1), id="seq-mean-kl"),
                            full_case(LossSettings(), id="default")], ids=str)
def test_packed_update_equals_unshared_rows(tiny, cfg):
    graphdef, params = tiny
    mb, r = minibatch()
    out = pack(mb, sample_ids=cfg.ratio_level == "sequence")
    assert (out.packed.sample is None) == (cfg.ratio_level == "token")
    tx, _ = make_optimizer(base_config().optim, 10)
    logprobs_fn, update = make_update_fns(graphdef, nnx.State({}), tx, cfg, 16)
    rng = np.random.default_rng(1)
    old = r["sampler_logp"] * r["is_resp"]
    ref = old + 0.1 * rng.normal(size=old.shape).astype(np.float32) * r["is_resp"]
    rows = rows_packed(*(jnp.asarray(x) for x in (r["tokens"], r["valid"], r["is_resp"], old, r["adv"], ref)))
    if cfg.ratio_level == "sequence":  # one sample per row
        rows = rows._replace(sample=jnp.broadcast_to(jnp.arange(len(r["adv"]))[:, None], rows.target.shape))

    def slots(x):  # a [N, L] per-token array in the packed [R, M] layout
        y = np.zeros(out.packed.pred.shape, np.float32)
        for i in range(6):
            y[entries(out, i)] = x[i][r["is_resp"][i]]
        return jnp.asarray(y)

    packed = out.packed.placed()._replace(old_logp=slots(old), ref_logp=slots(ref))
    fresh = lambda: init_state(jax.tree.map(jnp.copy, params), tx)
    s_rows, m_rows = update(fresh(), rows)
    s_packed, m_packed = update(fresh(), packed)
    for k in set(m_rows) - {"old_logp"}:  # old_logp is per token, in each layout's own: checked on its own
        np.testing.assert_allclose(m_packed[k], m_rows[k], rtol=2e-5, atol=1e-7, err_msg=k)
    scored = out.packed.scored
    np.testing.assert_array_equal(np.asarray(m_packed["old_logp"])[scored], np.asarray(slots(old))[scored])
    assert float(m_rows["grad_norm"]) > 0
    for a, b in zip(jax.tree.leaves(s_rows.params), jax.tree.leaves(s_packed.params)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)



@pytest.mark.parametrize("per_octave", [1, 4, 8])
def test_fine_buckets_bound_padding_and_shapes(per_octave):
    sizes = [fine_bucket(n, 8, per_octave) for n in range(1, 4097)]
    for n, size in enumerate(sizes, start=1):
        assert size >= n and size % 8 == 0
        if n > 64:  # past the multiples-of-8 floor
            assert size - n < n / per_octave, (n, size)
    for octave in range(7, 12):  # sizes in (2^octave, 2^(octave+1)]
        assert len({s for n, s in enumerate(sizes, start=1) if 2 ** octave < n <= 2 ** (octave + 1)}) == per_octave


def test_a_first_step_that_takes_its_own_old_logprobs_equals_one_given_them(tiny):
    """OWN_OLD_LOGP in place of the old log-probs (the first optimizer step on its own samples): the
    loss, metrics and new params of the update given the recomputed ones, without their forward pass;
    a NaN among given old log-probs still skips the step."""
    from atgrpo_jax.algo.loss import OWN_OLD_LOGP
    graphdef, params = tiny
    mb, _ = minibatch()
    packed = pack(mb).packed.placed()
    tx, _ = make_optimizer(base_config().optim, 10)
    cfg = LossSettings(kl_coef=0.0, entropy_coef=0.01, dual_clip=3.0)
    logprobs_fn, update = make_update_fns(graphdef, nnx.State({}), tx, cfg, 16)
    fresh = lambda: init_state(jax.tree.map(jnp.copy, params), tx)
    recomputed = logprobs_fn(params, packed)
    s_given, m_given = update(fresh(), packed._replace(old_logp=recomputed))
    s_own, m_own = update(fresh(), packed._replace(old_logp=jnp.full(recomputed.shape, OWN_OLD_LOGP)))
    scored = np.asarray(packed.scored)
    np.testing.assert_allclose(np.asarray(m_own["old_logp"])[scored], np.asarray(recomputed)[scored], atol=1e-6)
    for k in set(m_given) - {"old_logp"}:
        np.testing.assert_allclose(m_own[k], m_given[k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert float(m_own["ratio_mean"]) == pytest.approx(1.0, abs=1e-6) and float(m_own["clip_frac"]) == 0
    assert float(m_own["grad_norm"]) > 0 and float(m_own["skipped"]) == 0
    for a, b in zip(jax.tree.leaves(s_given.params), jax.tree.leaves(s_own.params)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
    _, m_nan = update(fresh(), packed._replace(old_logp=recomputed.at[0, 0].set(jnp.nan)))
    assert float(m_nan["skipped"]) == 1
