"""Top-p at wide vocabularies: the sorted head, the search for the rows it cannot decide, and both
in one batch, against a stable-sort NumPy reference."""
import functools

import jax
import numpy as np
import pytest

from atgrpo_jax.sampling.nucleus import HEAD, head_layout, nucleus_mask, row_head, top_p_draw

VOCAB = 20_000  # 400 blocks of 50: the head holds HEAD of them, so its bound is real


def flushed(logits):
    """As XLA on CPU sees them: denormals are zero (and -0.0 == 0.0)."""
    return np.where(np.abs(logits) < np.finfo(np.float32).tiny, 0.0, logits)


def reference(logits, top_p, inv_t=1.0):
    """(mask, probabilities, margin) per row: the stable-sort nucleus in float64, the renormalized
    distribution on it, and how far the prefix masses on either side of the cut are from top_p."""
    logits = flushed(logits)
    z = np.asarray(logits, np.float64) * np.reshape(inv_t, (-1, 1))
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    mask, margin = np.zeros(p.shape, bool), np.zeros(len(p))
    top_p = np.broadcast_to(top_p, len(p))
    for r in range(len(p)):
        order = np.argsort(-np.asarray(logits[r], np.float64), kind="stable")  # ties by index
        before = np.cumsum(p[r, order]) - p[r, order]
        kept = before < top_p[r]
        mask[r, order[kept]] = True
        margin[r] = min(top_p[r] - before[kept][-1], before[~kept][0] - top_p[r] if (~kept).any() else 1.0)
    q = np.where(mask, p, 0.0)
    return mask, q / q.sum(-1, keepdims=True), margin


def rows(kind, n, vocab=VOCAB, seed=0):
    rng = np.random.RandomState(seed)
    if kind == "sharp":  # nuclei of a few tokens
        return rng.standard_normal((n, vocab)) * 8
    if kind == "flat":  # nuclei of most of the vocabulary: the search
        return rng.standard_normal((n, vocab))
    if kind == "llm":  # a noisy tail under a Zipf head of varying steepness: nuclei of 3 to ~150 tokens
        out = rng.standard_normal((n, vocab)) * 2
        for r in range(n):
            out[r, rng.choice(vocab, 300, replace=False)] = 18 - rng.uniform(1.3, 3.0) * np.log(np.arange(1, 301))
        return out
    if kind == "tied_top":  # the largest logit 30 times, in 30 blocks: the head keeps the first by index
        out = rng.standard_normal((n, vocab))
        for r in range(n):
            out[r, rng.choice(vocab, 30, replace=False)] = 12.0
        return out
    if kind == "many_tied":  # the largest logit in more blocks than the head holds: the search decides
        out = rng.standard_normal((n, vocab))
        for r in range(n):
            out[r, rng.choice(vocab, 500, replace=False)] = 12.0
        return out
    if kind == "zeros":  # -0.0, +0.0 and denormals are one value, ranked by index
        out = rng.standard_normal((n, vocab)) - 20
        out[:, rng.choice(vocab, 40, replace=False)] = np.where(rng.rand(40) < 0.5, -0.0, 1e-40)
        return out
    if kind == "crowd":  # near-equal logits far below one: equal float32 weights, (logit - max) / T
        out = (rng.rand(n, vocab) - 0.5) * 1e-3  # cannot tell them apart, the logits can
        out[:, rng.choice(vocab, 3, replace=False)] = 9.0
        return out
    raise ValueError(kind)


KINDS = ("sharp", "flat", "llm", "tied_top", "many_tied", "zeros", "crowd")
TOL = 1e-5  # float32 sums over thousands of tokens may move a cut this close to top_p by a token


def assert_nucleus(got, logits, top_p, inv_t=1.0):
    """Every row of the mask `got` is a prefix of the stable ranking, between the nuclei of top_p -+ TOL,
    and the nucleus itself where the cut is farther than TOL from top_p."""
    ref, _, margin = reference(logits, top_p, inv_t)
    low = reference(logits, np.asarray(top_p) - TOL, inv_t)[0]
    high = reference(logits, np.asarray(top_p) + TOL, inv_t)[0]
    assert (low <= got).all() and (got <= high).all(), np.flatnonzero(((low > got) | (got > high)).any(1))
    for r in range(len(got)):
        ranked = got[r, np.argsort(-flushed(logits[r]).astype(np.float64), kind="stable")]
        assert ranked.sum() == 0 or ranked[:ranked.sum()].all(), f"row {r} is not a prefix of the ranking"
    clear = margin > TOL
    np.testing.assert_array_equal(got[clear], ref[clear])
    return clear


@functools.partial(jax.jit, static_argnames=("cap",))
def jit_mask(logits, inv_t, top_p, cap=256):
    return nucleus_mask(logits, inv_t, top_p, cap)


@jax.jit
def jit_draw(logits, inv_t, u):
    return top_p_draw(logits, inv_t, u, 0.9)


def test_head_is_the_start_of_the_stable_ranking():
    logits = np.concatenate([rows(k, 2, seed=1) for k in KINDS]).astype(np.float32)
    head = jax.jit(row_head)(logits)
    assert head_layout(VOCAB) == (50, 400) and head.index.shape == (len(logits), HEAD)
    for r in range(len(logits)):
        order = np.argsort(-flushed(logits[r]).astype(np.float64), kind="stable")[:HEAD]
        sure = np.asarray(head.sure[r])
        np.testing.assert_array_equal(np.asarray(head.index[r])[sure], order[:sure.sum()])
        assert sure.sum() == 0 or not sure[sure.sum():].any()  # the sure tokens are a prefix
    assert np.asarray(head.sure)[[0, 1]].all()  # the head's blocks hold the top HEAD tokens (no ties at the bound)
    assert not np.asarray(head.sure)[[8, 9]].any()  # 500 tied maxima: no block maximum is below them


@pytest.mark.parametrize("kind", KINDS)
def test_nucleus_mask_matches_the_stable_sort(kind):
    """Each row with its own temperature and top_p (as the trainer asks), in batches of 16 whose rows
    all end in the head, some (searched in chunks) or most (all searched) do not."""
    logits = rows(kind, 16, seed=2).astype(np.float32)
    inv_t = np.tile(np.float32([1.0, 1 / 0.3, 0.5, 1.0]), 4)
    top_p = np.tile(np.float32([0.507, 0.903, 0.991, 0.953]), 4)  # off the tied rows' steps
    clear = assert_nucleus(np.asarray(jit_mask(logits, inv_t, top_p)), logits, top_p, inv_t)
    assert clear.sum() >= 4


def test_a_few_searched_rows_among_head_rows_agree_with_each_row_alone():
    sharp, flat = rows("sharp", 16, seed=3), rows("flat", 16, seed=4)
    for wide in (1, 5, 12):  # gathered and searched 4 at a time (once, twice), then every row at once
        logits = np.concatenate([flat[:wide], sharp[wide:]]).astype(np.float32)[np.random.RandomState(wide).permutation(16)]
        got = np.asarray(jit_mask(logits, np.float32(1.0), np.float32(0.9)))
        assert_nucleus(got, logits, 0.9)
        alone = np.concatenate([np.asarray(jit_mask(logits[r:r + 1], np.float32(1.0), np.float32(0.9))) for r in range(16)])
        np.testing.assert_array_equal(got, alone)


def test_draws_lie_in_the_nucleus_with_their_renormalized_log_probs():
    """Five kinds of rows (the head, and the search over all rows), then one flat row among sharp ones
    (the head, and the search over a few gathered rows)."""
    mixed = np.concatenate([rows(k, 4, seed=5) for k in ("sharp", "llm", "flat", "tied_top", "many_tied")])
    one_wide = np.concatenate([rows("sharp", 15, seed=6), rows("flat", 1, seed=7)])[np.random.RandomState(8).permutation(16)]
    inv_t = np.float32(1 / 0.7)
    for logits in (mixed.astype(np.float32), one_wide.astype(np.float32)):
        _, q, margin = reference(logits, 0.9, inv_t)
        high = reference(logits, 0.9 + TOL, inv_t)[0]
        for seed in range(3):
            u = np.asarray(jax.random.uniform(jax.random.key(seed), (len(logits), 2)))
            tokens, logprobs = (np.asarray(a) for a in jit_draw(logits, inv_t, u))
            assert high[np.arange(len(logits)), tokens].all(), "a draw fell outside the nucleus"
            clear = margin > TOL
            np.testing.assert_allclose(logprobs[clear], np.log(q[np.arange(len(logits)), tokens][clear]), atol=1e-4)


@pytest.mark.parametrize("kind", ["llm", "tied_top"])
def test_head_draws_follow_the_renormalized_distribution(kind):
    """One row drawn 10,000 times (every row takes the head; 4,000 ids: 80 blocks, more than the head
    holds): chi-square against the nucleus."""
    from scipy import stats
    vocab, n = 4000, 10_000
    row = rows(kind, 1, vocab=vocab, seed=6)[0].astype(np.float32)
    _, q, _ = reference(row[None], 0.9)
    u = jax.random.uniform(jax.random.key(7), (n, 2))
    tokens = np.asarray(jit_draw(np.broadcast_to(row, (n, vocab)), np.float32(1.0), u)[0])
    counts = np.bincount(tokens, minlength=vocab)
    support = q[0] > 0
    assert counts[~support].sum() == 0 and 3 <= support.sum() <= HEAD
    chi2 = (((counts - n * q[0]) ** 2)[support] / (n * q[0][support])).sum()
    assert chi2 < stats.chi2.ppf(0.999, support.sum() - 1), chi2


def test_full_vocabulary_sharp_and_flat_rows():
    """Qwen3's 151,669 ids: a sharp, a realistic and a flat row (~112k tokens) in one batch."""
    logits = np.concatenate([rows(k, 1, vocab=151_669, seed=8) for k in ("sharp", "llm", "flat")]).astype(np.float32)
    got = np.asarray(jit_mask(logits, np.float32(1.0), np.float32(0.95)))
    clear = assert_nucleus(got, logits, 0.95)
    assert clear[:2].all() and got[:2].sum() < 64 < 100_000 < got[2].sum()
