"""Token selection on synthetic logits, against a sort-based NumPy reference."""
import jax
import numpy as np
import pytest
from scipy import stats

from atgrpo_jax.sampling.sample import block_layout, greedy, nucleus_floor, row_uniforms, select


def reference_distribution(logits, temperature=1.0, top_k=0, top_p=1.0):
    """Per row: softmax(logits / T), cut to the top k, then to the smallest prefix of mass >= top_p."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.zeros_like(p)
    for r in range(p.shape[0]):
        order = np.argsort(-p[r], kind="stable")
        kept = order[:top_k] if top_k else order
        q = p[r, kept] / p[r, kept].sum()
        exclusive = np.cumsum(q) - q
        kept, q = kept[exclusive < top_p], q[exclusive < top_p]
        out[r, kept] = q / q.sum()
    return out


def nucleus_margins(logits, top_p, temperature=1.0):
    """Per row, the distance of the nearest prefix mass (sorted) to top_p.

    Below ~1e-5, float32 sums may legitimately cut the nucleus one token
    earlier or later than the float64 reference.
    """
    d = reference_distribution(logits, temperature)
    s = -np.sort(-d, axis=-1)
    return np.abs(np.cumsum(s, -1) - s - top_p).min(-1)


# temperature is traced: cases that differ only in it share a compilation
jit_select = jax.jit(select, static_argnames=("top_k", "top_p", "top_p_cap", "raw_logprobs"))


@jax.jit
def uniforms(seed, rows):
    return row_uniforms(jax.random.split(jax.random.key(seed), rows.shape[0]), 0)


def draw(logits, n, seed=0, temperature=1.0, **static):
    """n independent draws from one row of logits (each row has its own key)."""
    rows = np.broadcast_to(np.asarray(logits, np.float32), (n, len(logits)))
    return jit_select(rows, uniforms(seed, rows), temperature, **static)


CASES = {  # name: (vocab, select kwargs); 37 exercises the padded block layout
    "plain": (6, {}),
    "temperature": (6, dict(temperature=0.5)),
    "top_k": (6, dict(top_k=4)),
    "top_p_cap": (6, dict(top_p=0.9)),
    "top_p_bisect": (6, dict(top_p=0.9, top_p_cap=1)),
    "top_k_top_p": (6, dict(top_k=4, top_p=0.9)),
    "padded_vocab": (37, dict(temperature=2.0)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_frequencies_match_the_renormalized_distribution(name):
    vocab, kw = CASES[name]
    logits = np.linspace(2.0, -3.0, vocab).astype(np.float32)[np.random.RandomState(0).permutation(vocab)]
    ref = reference_distribution(logits[None], kw.get("temperature", 1.0), kw.get("top_k", 0),
                                 kw.get("top_p", 1.0))[0]
    n = 20_000
    sel = draw(logits, n, **kw)
    tokens = np.asarray(sel.tokens)
    counts = np.bincount(tokens, minlength=vocab)
    support = ref > 0
    assert 3 <= support.sum() <= vocab - (name.startswith("top") and 2)
    assert counts[~support].sum() == 0, "a token outside the truncated support was drawn"
    chi2 = (((counts - n * ref) ** 2)[support] / (n * ref[support])).sum()
    assert chi2 < stats.chi2.ppf(0.999, support.sum() - 1), (chi2, counts, n * ref)
    # each draw reports the log-prob of its token under the renormalized distribution
    np.testing.assert_allclose(np.asarray(sel.logprobs), np.log(ref[tokens]), atol=1e-5)


@pytest.mark.parametrize("top_p,cap", [(0.5, 256), (0.9, 256), (0.9, 1), (0.97, 1)])
def test_top_p_draws_stay_in_the_nucleus(top_p, cap):
    """Wide random rows: sharp ones fit the candidate cap, flat ones go through the bisection."""
    rng = np.random.RandomState(1)
    scale = np.where(np.arange(48) % 2, 0.5, 6.0)[:, None]
    logits = (rng.standard_normal((48, 1000)) * scale).astype(np.float32)
    clear = nucleus_margins(logits, top_p) > 1e-5
    assert clear.mean() > 0.75
    sel = jit_select(logits, uniforms(2, logits), 1.0, top_p=top_p, top_p_cap=cap)
    tokens = np.asarray(sel.tokens)
    # every draw lies in the nucleus (allowing float32 rounding of the cut) ...
    loose = reference_distribution(logits, top_p=top_p + 1e-5)[np.arange(48), tokens]
    assert (loose > 0).all(), "a draw fell outside the nucleus"
    # ... and where the cut is unambiguous, reports its renormalized log-prob
    chosen = reference_distribution(logits, top_p=top_p)[np.arange(48), tokens]
    np.testing.assert_allclose(np.asarray(sel.logprobs)[clear], np.log(chosen[clear]), atol=1e-4)


def test_nucleus_floor_is_the_smallest_kept_weight():
    rng = np.random.RandomState(3)
    logits = (rng.standard_normal((16, 500)) * 2).astype(np.float32)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    for top_p in (0.3, 0.75, 0.99):
        clear = nucleus_margins(logits, top_p) > 1e-5  # rows whose cut float32 cannot blur
        assert clear.mean() > 0.75
        ref = reference_distribution(logits, top_p=top_p)
        floor = np.asarray(jax.jit(nucleus_floor)(w, top_p))
        expected = np.where(ref > 0, w, np.inf).min(-1).astype(np.float32)
        np.testing.assert_array_equal(floor[clear], expected[clear])


def test_greedy_is_first_argmax_including_ties_and_padded_layouts():
    rng = np.random.RandomState(4)
    for vocab in (37, 512, 1000):  # a padded block layout, then exact ones
        logits = rng.randint(0, 5, (48, vocab)).astype(np.float32)  # many ties
        np.testing.assert_array_equal(np.asarray(jax.jit(greedy)(logits)), logits.argmax(-1))
    sel = jit_select(logits, np.zeros((48, 2), np.float32), 0.0)  # temperature 0
    np.testing.assert_array_equal(np.asarray(sel.tokens), logits.argmax(-1))
    assert (np.asarray(sel.logprobs) == 0).all()  # a point mass


def test_top_k_1_is_greedy_and_raw_logprobs_are_temperature_one():
    logits = np.random.RandomState(5).standard_normal((48, 1000)).astype(np.float32) * 3
    sel = jit_select(logits, uniforms(6, logits), 0.7, top_k=1, raw_logprobs=True)
    np.testing.assert_array_equal(np.asarray(sel.tokens), logits.argmax(-1))
    np.testing.assert_allclose(np.asarray(sel.logprobs), 0.0, atol=1e-6)
    raw = np.log(reference_distribution(logits)[np.arange(48), logits.argmax(-1)])
    np.testing.assert_allclose(np.asarray(sel.raw_logprobs), raw, atol=1e-5)


def test_block_layout_covers_the_vocabulary_in_near_square_blocks():
    for vocab in (1, 6, 37, 512, 8192, 151_669, 151_936, 1_000_003):
        size, blocks = block_layout(vocab)
        assert size * blocks >= vocab > size * (blocks - 1)
        assert max(size, blocks) <= 4 * (int(vocab ** 0.5) + 1)
    assert block_layout(151_669) == (329, 461)  # 7 * 47 * 461: no padding


def test_uniforms_depend_only_on_the_row_key_and_step():
    keys = jax.random.split(jax.random.key(7), 5)
    a = np.asarray(row_uniforms(keys, 3))
    np.testing.assert_array_equal(a[2:4], np.asarray(row_uniforms(keys[2:4], 3)))
    assert not np.allclose(a, np.asarray(row_uniforms(keys, 4)))
    assert ((a >= 0) & (a < 1)).all()
