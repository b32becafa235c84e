"""Token selection on synthetic logits, against a sort-based NumPy reference."""
import functools

import jax
import numpy as np
import pytest
from scipy import stats

from atgrpo_jax.sampling.draw import block_layout
from atgrpo_jax.sampling.nucleus import nucleus_mask
from atgrpo_jax.sampling.sample import greedy, row_uniforms, select


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
jit_select = jax.jit(select, static_argnames=("top_k", "top_p", "top_p_cap", "raw_logprobs", "vocab_limit"))


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
    """Wide random rows, sharp and flat, with a large and a tiny sorted finish (cap)."""
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


def row_shapes(vocab, seed):
    """Rows of every kind the top-p search meets: smooth ones (flat to sharp, heavy-tailed) and ties."""
    rng = np.random.RandomState(seed)
    z = rng.standard_normal((5, vocab))
    smooth = [z[0] * 0.5, z[1] * 2, z[2] * 6, -1.1 * np.log(rng.permutation(vocab) + 1.0), rng.gumbel(size=vocab) * 3]
    tied = [np.zeros(vocab),  # all equal
            rng.randint(0, 5, vocab),  # a few levels, each tied across many tokens
            z[3] * 1e-6]  # near-equal: distinct logits, float32 weights tied in groups
    bf16 = (z[4].astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32) * 2  # ties of a few
    return np.array(smooth + [bf16], np.float32), np.array(tied, np.float32)


TOP_P = 0.9001  # all-equal rows: 0.9001 * V is far from an integer, so float32 cuts where float64 does


@functools.partial(jax.jit, static_argnames=("cap",))
def jit_mask(logits, cap):
    return nucleus_mask(logits, 1.0, TOP_P, cap)


def test_nucleus_is_the_sorted_prefix_on_smooth_and_tied_rows(cap=16):
    """nucleus_mask equals the stable-sort reference, on smooth rows and on rows of tied logits or
    tied float32 weights (the search orders by logit; > cap tokens of one logit keep the first by index).

    A small cap makes the search narrow its bracket further than the default.
    """
    smooth, tied = row_shapes(3000, seed=8)
    mixed = np.concatenate([smooth[:5], tied])  # wide tied nuclei: most rows searched
    for rows in (np.concatenate([smooth, smooth[:2]]), mixed):
        assert (nucleus_margins(rows, TOP_P) > 1e-6).all()  # float32 cannot blur any cut
        reference = reference_distribution(rows, top_p=TOP_P) > 0
        got = np.asarray(jit_mask(rows, cap=cap))
        np.testing.assert_array_equal(got, reference)
        sizes = reference.sum(1)
        assert sizes.min() < 10 and 1000 < sizes.max() < 3000  # narrow and wide nuclei, all real cuts


def test_flat_rows_draw_from_the_reference_nucleus():
    """All-equal logits keep the first ceil(top_p * V) ids; near-equal ones the highest logits."""
    vocab, n = 600, 8_000  # more tokens than top_p_cap: the tied tokens are not all sorted
    near = np.random.RandomState(9).standard_normal(vocab).astype(np.float32) * 1e-6
    for logits in (np.zeros(vocab, np.float32), near):
        ref = reference_distribution(logits[None], top_p=TOP_P)[0]
        support = ref > 0
        assert nucleus_margins(logits[None], TOP_P)[0] > 1e-6 and support.sum() == 541
        if not logits.any():
            np.testing.assert_array_equal(np.flatnonzero(support), np.arange(541))
        sel = draw(logits, n, seed=10, top_p=TOP_P)
        tokens = np.asarray(sel.tokens)
        counts = np.bincount(tokens, minlength=vocab)
        assert counts[~support].sum() == 0, "a token outside the nucleus was drawn"
        chi2 = (((counts - n * ref) ** 2)[support] / (n * ref[support])).sum()
        assert chi2 < stats.chi2.ppf(0.999, support.sum() - 1), chi2
        np.testing.assert_allclose(np.asarray(sel.logprobs), np.log(ref[tokens]), atol=1e-5)


LIMIT = 32  # ids >= LIMIT: rows of the LM head the tokenizer has no id for


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.7, top_k=4), dict(top_p=0.9)])
def test_vocab_limit_draws_only_allowed_ids_from_their_renormalized_distribution(kw):
    logits = np.linspace(2.0, -3.0, 40).astype(np.float32)[np.random.RandomState(11).permutation(40)]
    logits[LIMIT:] = 8.0  # far above every allowed id
    ref = reference_distribution(logits[None, :LIMIT], kw.get("temperature", 1.0), kw.get("top_k", 0),
                                 kw.get("top_p", 1.0))[0]
    n = 20_000
    sel = draw(logits, n, vocab_limit=LIMIT, raw_logprobs=True, **kw)
    tokens = np.asarray(sel.tokens)
    assert tokens.max() < LIMIT
    counts = np.bincount(tokens, minlength=LIMIT)
    support = ref > 0
    assert counts[~support].sum() == 0
    chi2 = (((counts - n * ref) ** 2)[support] / (n * ref[support])).sum()
    assert chi2 < stats.chi2.ppf(0.999, support.sum() - 1), chi2
    # log-probs of the masked distribution (normalized over the allowed ids) ...
    np.testing.assert_allclose(np.asarray(sel.logprobs), np.log(ref[tokens]), atol=1e-5)
    # ... raw ones of the model's own, over the whole head
    np.testing.assert_allclose(np.asarray(sel.raw_logprobs), np.log(reference_distribution(logits[None])[0, tokens]),
                               atol=1e-5)
    if not kw:  # the test has teeth: without the limit these rows draw ids >= LIMIT
        assert (np.asarray(draw(logits, 1000).tokens) >= LIMIT).mean() > 0.9
        greedy_sel = draw(logits, 4, vocab_limit=LIMIT, raw_logprobs=True, temperature=0.0)
        np.testing.assert_array_equal(np.asarray(greedy_sel.tokens), logits[:LIMIT].argmax())
        assert (np.asarray(greedy_sel.logprobs) == 0).all()


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
