"""Shared-prompt packing: a group's samples share one copy of their prompt, and
the log-probs, loss and update equal those of one row per sample."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.algo.loss import LossConfig
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.train.batch import fine_bucket, pack_minibatch
from atgrpo_jax.train.config import base_config
from atgrpo_jax.train.update import Batch, Packed, init_state, make_optimizer, make_update_fns, sequence_logprobs

# (group id, prompt length, response lengths); group 2 has group 0's prompt length, other tokens
GROUPS = [(0, 5, [3, 4, 1]), (1, 7, [2]), (2, 5, [2, 2])]


def minibatch(groups=GROUPS, vocab=512, pad_rows=2, seed=0):
    """Rows as `policy_batches` lays them out (one sample per row, a group's rows together and
    marked by its share id, empty rows last)."""
    rng = np.random.default_rng(seed)
    prompts = {g: rng.integers(1, vocab, p) for g, p, _ in groups}
    samples = [(g, prompts[g], rng.integers(1, vocab, r)) for g, _, rs in groups for r in rs]
    n, width = len(samples) + pad_rows, 32
    mb = dict(tokens=np.zeros((n, width), np.int32), valid=np.zeros((n, width), bool),
              is_resp=np.zeros((n, width), bool), sampler_logp=np.zeros((n, width), np.float32),
              adv=np.zeros(n, np.float32), share=np.full(n, -1))
    for i, (g, p, r) in enumerate(samples):
        mb["share"][i] = g
        mb["tokens"][i, :len(p) + len(r)] = np.r_[p, r]
        mb["valid"][i, :len(p) + len(r)] = True
        mb["is_resp"][i, len(p):len(p) + len(r)] = True
        mb["sampler_logp"][i, len(p):len(p) + len(r)] = -rng.uniform(0.5, 5.0, len(r))
        mb["adv"][i] = rng.normal()
    return mb


def entries(out, i):
    """Packed row and scored entries of mini-batch row i."""
    (r,) = np.flatnonzero((out["sample"] == i).any(1))  # exactly one row
    return r, np.flatnonzero(out["sample"][r] == i)


def test_each_prompt_once_then_its_responses():
    mb = minibatch()
    out = pack_minibatch(mb, shards=2)  # max_width: the rows' 32
    assert out["tokens"].shape[0] % 2 == 0 and out["tokens"].shape[0] >= 3  # 3 prompts, padded rows
    assert sorted(set(out["sample"][out["sample"] >= 0])) == list(range(6))
    assert out["pred"].shape[1] == 8  # the most response tokens in a row (3 + 4 + 1)
    for i in range(6):
        r, e = entries(out, i)
        p, end = mb["is_resp"][i].argmax(), mb["valid"][i].sum()
        assert len(e) == end - p and np.all(np.diff(e) == 1) and out["scored"][r, e].all()
        np.testing.assert_array_equal(out["tokens"][r, :p], mb["tokens"][i, :p])  # the shared prompt
        np.testing.assert_array_equal(out["target"][r, e], mb["tokens"][i, p:end])
        pred = out["pred"][r, e]
        assert pred[0] == p - 1 and np.all(np.diff(pred[1:]) == 1)  # last prompt token, then its own
        np.testing.assert_array_equal(out["tokens"][r, pred[1:] + 1], mb["tokens"][i, p + 1:end])
        assert len(set(out["segment"][r, pred[1:] + 1])) <= 1 and out["segment"][r, pred[-1] + 1] > 0
        np.testing.assert_array_equal(out["positions"][r, pred[1:] + 1], np.arange(p + 1, end))
        assert (out["adv"][r, e] == mb["adv"][i]).all() and (out["sample_len"][r, e] == end - p).all()
        np.testing.assert_array_equal(out["sampler_logp"][r, e], mb["sampler_logp"][i, p:end])
    assert out["scored"].sum() == 3 + 4 + 1 + 2 + 2 + 2
    real = out["segment"] >= 0
    assert real.sum() == 5 + 7 + 5 + (3 + 4 + 1) + 2 + (2 + 2)  # no prompt token twice


def test_unshared_gives_one_sample_per_row():
    out = pack_minibatch(minibatch(), share_prompts=False)
    assert all(len(set(row[row >= 0])) == 1 for row in out["sample"] if (row >= 0).any())
    assert (out["segment"] >= 0).sum() == 5 * 3 + 3 + 4 + 1 + 7 + 2 + 2 * (5 + 2)


def test_long_groups_are_split_over_rows():
    """A row holds at most max_width tokens: 4 + 10 + 10 <= 32 < 4 + 3 * 10."""
    out = pack_minibatch(minibatch([(0, 4, [10] * 6)], pad_rows=0), max_width=32)
    assert (out["segment"] == 0).sum(1).tolist()[:3] == [4, 4, 4]
    assert [len(set(row[row >= 0])) for row in out["sample"][:3]] == [2, 2, 2]


def test_slots_cap_responses_per_row():
    out = pack_minibatch(minibatch([(0, 4, [1] * 6)], pad_rows=0), slots=4)  # 4 + 6 * 1 fit in 32
    assert [len(set(row[row >= 0])) for row in out["sample"][:2]] == [4, 2]


def test_empty_prompt_is_an_error():
    mb = minibatch([(0, 3, [2])], pad_rows=0)
    mb["is_resp"][0, :3] = True
    with pytest.raises(ValueError, match="empty prompt"):
        pack_minibatch(mb)


@pytest.fixture(scope="module")
def tiny():
    model = Qwen3(get_preset("test-tiny"), rngs=nnx.Rngs(0))
    return nnx.split(model)


def as_packed(out):
    return Packed.from_arrays(out)


def test_packed_logprobs_equal_unshared_rows(tiny):
    graphdef, params = tiny
    mb = minibatch()
    out = pack_minibatch(mb)
    tx, _ = make_optimizer(base_config().optim, 10)
    logprobs_fn, _ = make_update_fns(graphdef, nnx.State({}), tx, LossConfig(), 16)
    packed = np.asarray(logprobs_fn(params, as_packed(out)))
    want, _ = sequence_logprobs(nnx.merge(graphdef, params), jnp.asarray(mb["tokens"]), jnp.asarray(mb["valid"]), 16)
    want = np.asarray(want)
    for i in range(6):
        r, e = entries(out, i)
        np.testing.assert_allclose(packed[r, e], want[i][mb["is_resp"][i]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cfg", [LossConfig(), LossConfig(aggregation="seq-mean-token-mean", kl_coef=0.1)], ids=str)
def test_packed_update_equals_unshared_rows(tiny, cfg):
    graphdef, params = tiny
    mb = minibatch()
    out = pack_minibatch(mb)
    tx, _ = make_optimizer(base_config().optim, 10)
    logprobs_fn, update = make_update_fns(graphdef, nnx.State({}), tx, cfg, 16)
    rng = np.random.default_rng(1)
    old = mb["sampler_logp"] * mb["is_resp"]
    ref = old + 0.1 * rng.normal(size=old.shape).astype(np.float32) * mb["is_resp"]
    rows = Batch(*(jnp.asarray(x) for x in (mb["tokens"], mb["valid"], mb["is_resp"], old, mb["adv"], ref)))

    def slots(x):  # a [N, L] per-token array in the packed [R, M] layout
        y = np.zeros(out["pred"].shape, np.float32)
        for i in range(6):
            y[entries(out, i)] = x[i][mb["is_resp"][i]]
        return jnp.asarray(y)

    packed = as_packed(out)._replace(old_logp=slots(old), ref_logp=slots(ref))
    fresh = lambda: init_state(jax.tree.map(jnp.copy, params), tx)
    s_rows, m_rows = update(fresh(), rows)
    s_packed, m_packed = update(fresh(), packed)
    for k in m_rows:
        np.testing.assert_allclose(m_packed[k], m_rows[k], rtol=2e-5, atol=1e-7, err_msg=k)
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
