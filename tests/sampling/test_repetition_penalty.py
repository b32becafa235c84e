"""The repetition penalty (vLLM's definition) in the sampler, checked against NumPy.

A NumPy reference scores every response token from teacher-forced logits:
ids in the prompt or earlier in the response have their logit divided by the
penalty where positive and multiplied where not, then temperature, top-k and
top-p. The sampler's log-probs must be of exactly that distribution.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from atgrpo_jax.models.hf_io import load_pretrained
from atgrpo_jax.sampling import generate, segments
from atgrpo_jax.sampling.sample import penalize, select
from hf_fixtures import make_hf_checkpoint

VOCAB, NEW = 64, 12  # a small vocabulary: responses repeat ids, so the penalty bites
LENGTHS = [7, 3, 10]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen3-penalty")
    make_hf_checkpoint(path, vocab=VOCAB, hidden=64, inter=96, layers=2, heads=4, kv_heads=2, head_dim=24,
                       seed=1, scale=16.0)
    return load_pretrained(str(path))


def prompts(seed=0):
    rng = np.random.RandomState(seed)
    return [list(rng.randint(1, VOCAB, n)) for n in LENGTHS]


def np_penalize(logits, seen, penalty):
    """The definition, row by row, with plain Python sets."""
    out = np.array(logits, np.float32, copy=True)
    for r, ids in enumerate(seen):
        for v in ids:
            x = out[r, v]
            out[r, v] = x / np.float32(penalty) if x > 0 else x * np.float32(penalty)
    return out


def np_logprob(z, token, top_k=0, top_p=1.0):
    """log p(token) under softmax(z) cut to top-k, then to the top-p nucleus (ties by index)."""
    order = np.argsort(-z, kind="stable")
    keep = np.zeros(z.shape, bool)
    k = top_k or len(z)
    w = np.exp(z[order[:k]] - z[order[0]])
    inside = np.cumsum(w) - w < top_p * w.sum()
    keep[order[:k][inside]] = True
    assert keep[token], "the sampler drew a token outside the reference's kept set"
    zk = np.where(keep, z, -np.inf)
    m = zk.max()
    return z[token] - m - np.log(np.exp(zk - m).sum())


def test_penalize_matches_the_definition():
    rng = np.random.RandomState(0)
    logits = rng.randn(4, 50).astype(np.float32) * 3
    logits[0, :5] = 0.0  # zero stays zero either way
    seen = [set(rng.choice(50, n, replace=False)) | {0, 1} for n in (0, 5, 20, 50)]
    present = np.zeros((4, 50), bool)
    for r, ids in enumerate(seen):
        present[r, list(ids)] = True
    for penalty in (1.2, 0.8, np.array([1.2, 1.5, 0.9, 2.0], np.float32)):
        got = np.asarray(penalize(jnp.asarray(logits), jnp.asarray(present), penalty))
        want = np.stack([np_penalize(logits[r:r + 1], [seen[r]], np.broadcast_to(penalty, 4)[r])[0]
                         for r in range(4)])
        np.testing.assert_allclose(got, want, rtol=1e-6)  # XLA may divide as a multiply by 1 / penalty
    # penalized ids lose probability, all of them: positive logits shrink, negative ones grow in size
    p = np.asarray(penalize(jnp.asarray(logits), jnp.asarray(present), 1.5))
    assert (p[present] <= logits[present]).all() and (p[~present] == logits[~present]).all()


def test_select_penalizes_before_greedy_and_keeps_raw_logprobs_the_models():
    logits = jnp.asarray([[5.0, 4.0, -1.0], [-2.0, -3.0, -2.5]])
    present = jnp.asarray([[True, False, False], [True, False, False]])
    u = jnp.full((2, 2), 0.5)
    sel = select(logits, u, 0.0, present=present, penalty=1.5, raw_logprobs=True)
    # row 0: 5 / 1.5 = 3.33 < 4 -> id 1; row 1: -2 * 1.5 = -3 < -2.5 -> id 2
    np.testing.assert_array_equal(np.asarray(sel.tokens), [1, 2])
    raw = np.asarray(jax.nn.log_softmax(logits))[[0, 1], [1, 2]]
    np.testing.assert_allclose(np.asarray(sel.raw_logprobs), raw, rtol=1e-6)


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=1.5, top_p=0.9, top_k=20),
                                dict(temperature=0.7, top_p=0.8)])
def test_logprobs_are_of_the_penalized_distribution(model, kw):
    """Every sampled token's log-prob equals NumPy's under the penalty (prompt + response so far)."""
    penalty = 1.2
    g = generate(model, prompts(), max_new_tokens=NEW, key=jax.random.key(3), num_branches=2,
                 repetition_penalty=penalty, **kw)
    p = g.prompt_ids.shape[1]
    ids = np.concatenate([g.prompt_ids, g.tokens], axis=1)
    mask = np.concatenate([g.prompt_mask, g.mask], axis=1)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    logits, _ = model(jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(mask))
    logits = np.asarray(logits)[:, p - 1:-1]
    repeats = 0
    for r in range(len(g.tokens)):
        seen = set(g.prompt_ids[r][g.prompt_mask[r]].tolist())
        for j in range(g.lengths[r]):
            tok = int(g.tokens[r, j])
            repeats += tok in seen
            z = np_penalize(logits[r, j][None], [seen], penalty)[0] / np.float32(kw["temperature"])
            want = np_logprob(z, tok, kw.get("top_k", 0), kw.get("top_p", 1.0))
            assert abs(g.logprobs[r, j] - want) < 1e-4, (r, j, g.logprobs[r, j], want)
            seen.add(tok)
    assert repeats > 0  # the penalty was in play on some drawn tokens


def test_penalty_changes_what_is_sampled_and_one_is_off(model):
    base = generate(model, prompts(), max_new_tokens=NEW, key=jax.random.key(0), temperature=0.0)
    one = generate(model, prompts(), max_new_tokens=NEW, key=jax.random.key(0), temperature=0.0,
                   repetition_penalty=1.0)
    np.testing.assert_array_equal(one.tokens, base.tokens)
    strong = generate(model, prompts(), max_new_tokens=NEW, key=jax.random.key(0), temperature=0.0,
                      repetition_penalty=3.0)
    assert (strong.tokens != base.tokens).any()

    def repeated(g):
        return sum(len(row[:n]) - len(set(row[:n].tolist())) for row, n in zip(g.tokens, g.lengths))

    assert repeated(strong) < repeated(base)


def test_compaction_and_continuous_batching_carry_the_seen_ids(model):
    """Rows moved to smaller batches or started late sample what the plain loop samples."""
    kw = dict(max_new_tokens=[NEW, 3, 5], key=jax.random.key(5), num_branches=3, temperature=1.0,
              repetition_penalty=1.3, top_k=20)
    plain = generate(model, prompts(), segment=0, **kw)
    for extra in (dict(segment=2), dict(segment=2, slots=4)):
        g = generate(model, prompts(), **extra, **kw)
        np.testing.assert_array_equal(g.tokens, plain.tokens)
        np.testing.assert_allclose(g.logprobs, plain.logprobs, atol=1e-5)


def test_penalty_value_is_traced_and_off_compiles_nothing_new(model):
    kw = dict(max_new_tokens=NEW, key=jax.random.key(0), temperature=1.0, segment=0)
    generate(model, prompts(), repetition_penalty=1.2, **kw)
    generate(model, prompts(), **kw)
    sizes = [f._cache_size() for f in segments.JITTED]
    generate(model, prompts(), repetition_penalty=1.7, **kw)  # another value: the same programs
    generate(model, prompts(), repetition_penalty=1.0, **kw)  # 1 = off: the programs without it
    assert [f._cache_size() for f in segments.JITTED] == sizes
