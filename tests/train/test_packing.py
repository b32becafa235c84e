"""Shared-prompt packing: a group's samples share one copy of their prompt, and
the log-probs, loss and update equal those of one row per sample."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.algo.loss import LossConfig
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.train.batch import pack_minibatch
from atgrpo_jax.train.config import base_config
from atgrpo_jax.train.update import Batch, Packed, init_state, make_optimizer, make_update_fns, sequence_logprobs

# (prompt id, prompt length, response lengths); prompt id 2 has prompt 0's length, other tokens
GROUPS = [(0, 5, [3, 4, 1]), (1, 7, [2]), (2, 5, [2, 2])]


def minibatch(groups=GROUPS, vocab=512, pad_rows=2, seed=0):
    """Rows as `policy_batches` lays them out (one sample per row, empty rows last)."""
    rng = np.random.default_rng(seed)
    prompts = {g: rng.integers(1, vocab, p) for g, p, _ in groups}
    samples = [(prompts[g], rng.integers(1, vocab, r)) for g, _, rs in groups for r in rs]
    n, width = len(samples) + pad_rows, 32
    mb = dict(tokens=np.zeros((n, width), np.int32), valid=np.zeros((n, width), bool),
              is_resp=np.zeros((n, width), bool), sampler_logp=np.zeros((n, width), np.float32),
              adv=np.zeros(n, np.float32))
    for i, (p, r) in enumerate(samples):
        mb["tokens"][i, :len(p) + len(r)] = np.r_[p, r]
        mb["valid"][i, :len(p) + len(r)] = True
        mb["is_resp"][i, len(p):len(p) + len(r)] = True
        mb["sampler_logp"][i, len(p):len(p) + len(r)] = -rng.uniform(0.5, 5.0, len(r))
        mb["adv"][i] = rng.normal()
    return mb


def test_each_prompt_once_then_its_responses():
    mb = minibatch()
    out = pack_minibatch(mb, shards=2)
    assert out["tokens"].shape[0] % 2 == 0 and out["tokens"].shape[0] >= 3  # 3 prompts, padded rows
    assert (out["sample"] >= 0).sum() == 6 and sorted(out["sample"][out["sample"] >= 0]) == list(range(6))
    assert out["pred"].shape[1] == 4  # the largest group (3) rounded up to a power of two
    for ri, si in zip(*np.nonzero(out["sample"] >= 0)):
        i = out["sample"][ri, si]
        p, end = mb["is_resp"][i].argmax(), mb["valid"][i].sum()
        n = out["scored"][ri, si].sum()
        assert n == end - p
        np.testing.assert_array_equal(out["tokens"][ri, :p], mb["tokens"][i, :p])  # the shared prompt
        np.testing.assert_array_equal(out["target"][ri, si, :n], mb["tokens"][i, p:end])
        pred = out["pred"][ri, si, :n]
        assert pred[0] == p - 1 and np.all(np.diff(pred[1:]) == 1)  # last prompt token, then its own
        np.testing.assert_array_equal(out["tokens"][ri, pred[1:] + 1], mb["tokens"][i, p + 1:end])
        np.testing.assert_array_equal(out["segment"][ri, pred[1:] + 1], si + 1)
        np.testing.assert_array_equal(out["positions"][ri, pred[1:] + 1], np.arange(p + 1, end))
        assert out["adv"][ri, si] == mb["adv"][i]
        np.testing.assert_array_equal(out["sampler_logp"][ri, si, :n], mb["sampler_logp"][i, p:end])
    real = out["segment"] >= 0
    assert real.sum() == 5 + 7 + 5 + (3 + 4 + 1) + 2 + (2 + 2)  # no prompt token twice


def test_unshared_gives_one_sample_per_row():
    out = pack_minibatch(minibatch(), share_prompts=False)
    assert out["pred"].shape[1] == 1 and (out["sample"] >= 0).sum() == 6
    assert (out["segment"] >= 0).sum() == 5 * 3 + 3 + 4 + 1 + 7 + 2 + 2 * (5 + 2)


def test_long_groups_are_split_over_rows():
    """A row holds at most twice the longest sample (rounded up): 4 + 10 + 10 <= 32 < 4 + 3 * 10."""
    out = pack_minibatch(minibatch([(0, 4, [10] * 6)], pad_rows=0))
    assert (out["segment"] == 0).sum(1).tolist()[:3] == [4, 4, 4]
    assert ((out["sample"] >= 0).sum(1)[:3] == 2).all()


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
    return Packed(*(jnp.asarray(out[f]) for f in Packed._fields[:7]))


def test_packed_logprobs_equal_unshared_rows(tiny):
    graphdef, params = tiny
    mb = minibatch()
    out = pack_minibatch(mb)
    tx, _ = make_optimizer(base_config().optim, 10)
    logprobs_fn, _ = make_update_fns(graphdef, nnx.State({}), tx, LossConfig(), 16)
    packed = np.asarray(logprobs_fn(params, as_packed(out)))
    want, _ = sequence_logprobs(nnx.merge(graphdef, params), jnp.asarray(mb["tokens"]), jnp.asarray(mb["valid"]), 16)
    want = np.asarray(want)
    for ri, si in zip(*np.nonzero(out["sample"] >= 0)):
        i = out["sample"][ri, si]
        np.testing.assert_allclose(packed[ri, si][out["scored"][ri, si]], want[i][mb["is_resp"][i]],
                                   rtol=1e-5, atol=1e-5)


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

    def slots(x):  # a [N, L] per-token array in the packed [R, J, T] layout
        y = np.zeros(out["pred"].shape, np.float32)
        for ri, si in zip(*np.nonzero(out["sample"] >= 0)):
            i = out["sample"][ri, si]
            y[ri, si][out["scored"][ri, si]] = x[i][mb["is_resp"][i]]
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


def test_slots_cap_responses_per_row():
    out = pack_minibatch(minibatch([(0, 4, [1] * 6)], pad_rows=0), slots=4)
    assert out["pred"].shape[1] == 4 and ((out["sample"] >= 0).sum(1)[:2] == [4, 2]).all()
    assert pack_minibatch(minibatch([(0, 4, [1, 1])], pad_rows=0), slots=4)["pred"].shape[1] == 4
