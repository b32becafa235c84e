"""Top-p over a full vocabulary, exact and without sorting it.

Tokens are ranked by logit (descending), ties by index (ascending); the
nucleus is the shortest prefix of that ranking whose weight reaches top_p of
the total, as a stable sort and a cumulative sum would give.

A bracket [lo, hi) on the weights w = exp((logit - max) / T) with
mass(w >= lo) >= need > mass(w >= hi), need = top_p * sum(w), is narrowed
until it holds at most `cap` tokens; each step is one pass over w (the mass
above one threshold per row). Guesses interpolate the mass, on a normal
quantile scale, between the float32 bit patterns of the ends (a log scale);
they start from a log-normal fit of the weights (close for flat rows), aim
just past the cut once one end is close, and halve the bit range when steps
are slow. The <= cap tokens left are gathered through small blocks and
sorted. The nucleus is then: every token above the bracket, plus a prefix of
the sorted ones; a draw picks one of the two parts by mass, so it reads w only.

A bracket stuck above `cap` tokens holds ties of one weight; then the search
reruns on the logits (two passes a step, exact counts) until it holds <= cap
tokens or one logit, whose tied tokens are then kept in index order.
"""
from __future__ import annotations

from statistics import NormalDist
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from atgrpo_jax.sampling.draw import block_sums, draw_in_blocks, pick

MAX_STEPS = 200  # never reached: every fifth step at least halves the 2**32-key range


def to_key(x: jax.Array) -> jax.Array:
    """float32 -> uint32 in the same order as float comparisons on this CPU.

    -0.0 and denormals map to +0.0's key, as XLA on CPU flushes denormals to
    zero; keys, unlike floats, then also compare right at thresholds near zero.
    """
    b = jax.lax.bitcast_convert_type(x, jnp.uint32)
    b = jnp.where(b & jnp.uint32(0x7F800000) == 0, jnp.uint32(0), b)
    return jnp.where(b >> 31 == 1, ~b, b | jnp.uint32(0x80000000))


def from_key(k: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(jnp.where(k >> 31 == 1, k & jnp.uint32(0x7FFFFFFF), ~k), jnp.float32)


def gather_layout(vocab: int) -> tuple[int, int]:
    """(block size, blocks) for gathering the bracket's tokens: small blocks, padded if no divisor fits."""
    if vocab <= 1024:
        return vocab, 1
    for size in sorted(range(16, 129), key=lambda d: abs(d - 48)):
        if vocab % size == 0:
            return size, vocab // size
    return 32, -(-vocab // 32)


def _at_least(score, key):
    """score [N, ...] >= the threshold `key` [N]: keys compare as keys, weights (>= 0) as floats."""
    key = key.reshape((-1,) + (1,) * (score.ndim - 1))
    return score >= (key if score.dtype == jnp.uint32 else from_key(key))


def _between(score, lo, hi):
    return _at_least(score, lo) & ~_at_least(score, hi)


class Bracket(NamedTuple):
    lo: jax.Array  # [N] uint32 key: mass(score >= lo) >= need
    hi: jax.Array  # [N] uint32 key: mass(score >= hi) < need
    m_lo: jax.Array  # [N] float32 masses at lo and hi
    m_hi: jax.Array


class _Search(NamedTuple):
    step: jax.Array  # int32 scalar
    bracket: Bracket
    count: jax.Array  # [N] int32 tokens in the bracket (exact_counts only)
    pull_lo: jax.Array  # [N] float32 Illinois weights of the two ends
    pull_hi: jax.Array
    side: jax.Array  # [N] int32: +1 the last guess moved lo, -1 it moved hi
    slow: jax.Array  # [N] int32 guesses in a row that did not halve the bracket's mass
    since_bisect: jax.Array  # [N] int32
    bisect: jax.Array  # [N] bool: the next guess halves the key range


def _search(score, w, need, start: Bracket, first_guess, weight_of, cap: int, exact_counts: bool):
    """(bracket, steps): `start` narrowed to <= cap tokens or one score value (module docstring).

    score: [N, V] the order: w itself (float32) or the logits' keys (uint32).
    weight_of(key): the weight of a threshold, to aim with. first_guess: [N] weights or None.
    exact_counts: stop on the exact count (one more pass a step) instead of the mass bound.
    """
    n = w.shape[0]
    total = start.m_lo

    def count_in(b: Bracket):
        return jnp.sum(_between(score, b.lo, b.hi), axis=-1, dtype=jnp.int32)

    def finished(s: _Search):
        b = s.bracket
        small = s.count <= cap if exact_counts else b.m_lo - b.m_hi <= cap * weight_of(b.lo)
        return small | (b.hi - b.lo <= 1)

    def probit(mass):  # mass -> normal quantile: a Gaussian-logit row's mass is linear in its keys there
        return jax.scipy.special.ndtri(jnp.clip(mass / total, 1e-7, 1 - 1e-7))

    def guess(s: _Search):
        b = s.bracket
        cap_mass = cap * weight_of(b.lo)  # at least the mass of `cap` tokens in the bracket
        f_lo, f_hi = b.m_lo - need, need - b.m_hi
        # aim at the cut; once one end is close, aim the other just past it
        level = jnp.where(f_lo <= cap_mass / 4, need - cap_mass / 2,
                          jnp.where(f_hi <= cap_mass / 4, need + cap_mass / 2, need))
        at_cut = level == need
        e_lo = (probit(b.m_lo) - probit(level)) * jnp.where(at_cut, s.pull_lo, 1.0)
        e_hi = (probit(level) - probit(b.m_hi)) * jnp.where(at_cut, s.pull_hi, 1.0)
        frac = jnp.clip(e_lo / jnp.maximum(e_lo + e_hi, 1e-30), 0.0, 1.0)
        width = b.hi - b.lo
        aimed = jnp.minimum(width.astype(jnp.float32) * frac, 4294967040.0).astype(jnp.uint32)  # < 2**32
        g = b.lo + jnp.clip(jnp.where(s.bisect, width // 2, aimed), 1, width - 1)
        if first_guess is None:
            return g
        first = to_key(first_guess)
        return jnp.where((s.step == 0) & (first > b.lo) & (first < b.hi), first, g)

    def body(s: _Search):
        b, done = s.bracket, finished(s)
        g = guess(s)
        m_g = jnp.sum(jnp.where(_at_least(score, g), w, 0.0), axis=-1)
        up = (m_g >= need) & ~done  # g becomes the new lo
        down = (m_g < need) & ~done
        new = Bracket(jnp.where(up, g, b.lo), jnp.where(down, g, b.hi), jnp.where(up, m_g, b.m_lo),
                      jnp.where(down, m_g, b.m_hi))
        # Illinois: an end kept twice in a row has its pull halved, so the other end moves too
        pull_lo = jnp.where(up, 1.0, jnp.where(s.side < 0, s.pull_lo * 0.5, s.pull_lo))
        pull_hi = jnp.where(down, 1.0, jnp.where(s.side > 0, s.pull_hi * 0.5, s.pull_hi))
        # safeguard: halve the key range after two slow guesses, and at least every fifth step
        slow = jnp.where(s.bisect | ((new.m_lo - new.m_hi) * 2 <= b.m_lo - b.m_hi), 0, s.slow + 1)
        since_bisect = jnp.where(s.bisect, 0, s.since_bisect + 1)
        bisect = (slow >= 2) | (since_bisect >= 4)
        return _Search(s.step + 1, new, count_in(new) if exact_counts else s.count, pull_lo, pull_hi,
                       jnp.where(up, 1, -1), jnp.where(bisect, 0, slow), since_bisect, bisect)

    zeros_i, ones = jnp.zeros(n, jnp.int32), jnp.ones(n, jnp.float32)
    state = _Search(jnp.int32(0), start, count_in(start) if exact_counts else zeros_i, ones, ones, zeros_i,
                    zeros_i, zeros_i, jnp.zeros(n, bool))
    final = jax.lax.while_loop(lambda s: (s.step < MAX_STEPS) & ~jnp.all(finished(s)), body, state)
    return final.bracket, final.step


def _block_counts(score, b: Bracket, size: int, blocks: int):
    n, vocab = score.shape
    inside = _between(score, b.lo, b.hi)
    if size * blocks != vocab:
        inside = jnp.pad(inside, ((0, 0), (0, size * blocks - vocab)))
    return jnp.sum(inside.reshape(n, blocks, size), axis=-1, dtype=jnp.int32)


def _blocks(x, size: int, blocks: int):
    """[N, V] -> [N, blocks, size], padded where blocks overrun V (only for vocabularies without a divisor)."""
    n, vocab = x.shape
    if size * blocks != vocab:
        x = jnp.pad(x, ((0, 0), (0, size * blocks - vocab)))
    return x.reshape(n, blocks, size)


class Nucleus(NamedTuple):
    """Each row's nucleus: the tokens with score >= above, plus the kept candidates,
    plus (rows of > cap ties) the tokens with score in [lo, above) and index <= tie_index."""

    above: jax.Array  # [N] uint32 key
    lo: jax.Array  # [N] uint32 key
    tie_index: jax.Array  # [N] int32, -1 when the candidates hold the rest
    cand_index: jax.Array  # [N, c] int32
    cand_w: jax.Array  # [N, c] float32 weights of kept candidates, 0 for the others
    cand_kept: jax.Array  # [N, c] bool


def _finish(logits, w, score, need, b: Bracket, counts, cap: int, size: int, ties: bool) -> Nucleus:
    """The nucleus from a bracket of <= cap tokens, or (ties) of > cap tokens tied at one logit."""
    n, vocab = logits.shape
    blocks = counts.shape[1]
    arrays = [_blocks(x, size, blocks) for x in ((logits, w) if score is w else (logits, w, score))]
    # the first blocks holding bracket tokens, in index order (float32: XLA's fast CPU top_k takes floats)
    taken, _ = jax.lax.top_k(jnp.where(counts > 0, blocks - jnp.arange(blocks, dtype=jnp.float32), 0.0),
                             min(cap, blocks))
    block = jnp.minimum(blocks - taken.astype(jnp.int32), blocks - 1)
    cand = [jnp.take_along_axis(x, block[:, :, None], axis=1).reshape(n, -1) for x in arrays]
    cand_l, cand_w, cand_s = cand[0], cand[1], cand[-1]
    pos = (block[:, :, None] * size + jnp.arange(size)).reshape(n, -1)
    inside = jnp.repeat(taken > 0, size, axis=1) & (pos < vocab) & _between(cand_s, b.lo, b.hi)
    # sorted by logit, ties by index (top_k puts the lower position first, positions follow indices)
    _, j = jax.lax.top_k(jnp.where(inside, from_key(to_key(cand_l)), -jnp.inf), min(cap, pos.shape[1]))
    top_w = jnp.where(jnp.take_along_axis(inside, j, axis=1), jnp.take_along_axis(cand_w, j, axis=1), 0.0)
    before = b.m_hi[:, None] + jnp.cumsum(top_w, axis=1) - top_w
    kept = jnp.take_along_axis(inside, j, axis=1) & (before < need[:, None])
    total = jnp.sum(counts, axis=1)
    tie_index = jnp.full(n, -1, jnp.int32)
    if ties:  # > cap tokens tied at one logit: the first r by index, r = tokens the mass still needs
        kept = kept & (total <= cap)[:, None]
        r = jnp.clip(jnp.ceil((need - b.m_hi) / jnp.maximum(top_w[:, 0], 1e-38)), 1, total).astype(jnp.int32)
        upto = jnp.cumsum(counts, axis=1)
        blk = jnp.minimum(jnp.sum(upto < r[:, None], axis=1), blocks - 1)
        r_in = r - jnp.take_along_axis(upto - counts, blk[:, None], axis=1)[:, 0]
        one = jnp.take_along_axis(arrays[-1], blk[:, None, None], axis=1)[:, 0]
        in_blk = (blk[:, None] * size + jnp.arange(size) < vocab) & _between(one, b.lo, b.hi)
        at = jnp.sum(jnp.cumsum(in_blk, axis=1) < r_in[:, None], axis=1)
        tie_index = jnp.where(total > cap, blk * size + at, -1).astype(jnp.int32)
    return Nucleus(b.hi, b.lo, tie_index, jnp.take_along_axis(pos, j, axis=1).astype(jnp.int32),
                   jnp.where(kept, top_w, 0.0), kept)


def _by_threshold(nucleus: Nucleus, score, index):
    """Elementwise over [N, ...]: in the part of the nucleus decided by thresholds (not the candidates)."""
    tie = nucleus.tie_index.reshape((-1,) + (1,) * (score.ndim - 1))
    return _at_least(score, nucleus.above) | (_at_least(score, nucleus.lo) & (index <= tie))


def _with_nucleus(logits, inv_t, top_p, cap: int, use: Callable):
    """use(score, w, nucleus) for each row's nucleus, w = exp((logits - max) * inv_t); inv_t and top_p
    are scalars or one per row."""
    n, vocab = logits.shape
    m = jnp.max(logits, axis=-1, keepdims=True)
    inv_col = inv_t[:, None] if jnp.ndim(inv_t) == 1 else inv_t
    w = jax.lax.optimization_barrier(jnp.exp((logits - m) * inv_col))  # stored once, read by every pass
    total = jnp.sum(w, axis=-1)
    need = top_p * total
    # log-normal fit: logits ~ N(mu, s^2) puts the cut at log w = log(mean w) + s^2/2 - s * z_p
    s2 = jnp.maximum(jnp.log(vocab * jnp.sum(w * w, axis=-1) / total ** 2), 0.0)
    z = NormalDist().inv_cdf(top_p) if isinstance(top_p, float) else jax.scipy.special.ndtri(top_p)
    first = jnp.exp(jnp.log(total / vocab) + s2 / 2 - jnp.sqrt(s2) * z)
    zeros = jnp.zeros(n, jnp.float32)
    start = Bracket(to_key(zeros), to_key(jnp.ones(n, jnp.float32)) + 1, total, zeros)
    b, _ = _search(w, w, need, start, first, from_key, cap, exact_counts=False)
    size, blocks = gather_layout(vocab)
    counts = _block_counts(w, b, size, blocks)

    def by_weight():
        return use(w, w, _finish(logits, w, w, need, b, counts, cap, size, ties=False))

    def by_logit():  # more than cap tokens tied in weight: order them by logit
        keys = to_key(logits)
        start_l = Bracket(jnp.min(keys, axis=-1), to_key(m[:, 0]) + 1, total, zeros)
        bl, _ = _search(keys, w, need, start_l, None, lambda k: jnp.exp((from_key(k) - m[:, 0]) * inv_t), cap,
                        exact_counts=True)
        counts_l = _block_counts(keys, bl, size, blocks)
        return use(keys, w, _finish(logits, w, keys, need, bl, counts_l, cap, size, ties=True))

    return jax.lax.cond(jnp.all(jnp.sum(counts, axis=1) <= cap), by_weight, by_logit)


def top_p_draw(logits: jax.Array, inv_t, u: jax.Array, top_p: float, cap: int = 256):
    """Exact draw from the top-p nucleus of softmax(logits * inv_t): (tokens [N] int32, log-probs [N]).

    u [N, 2] uniforms in [0, 1). cap (static, >= 1) bounds the tokens sorted per row.
    """
    def draw(score, w, nucleus: Nucleus):
        n, vocab = w.shape
        index = jnp.broadcast_to(jnp.arange(vocab, dtype=jnp.int32), (n, vocab))
        if score is w:
            xs, fills = (w, index), (0.0, vocab)
            weight = lambda s, i: jnp.where(_by_threshold(nucleus, s, i), s, 0.0)  # noqa: E731
        else:
            xs, fills = (score, w, index), (0, 0.0, vocab)
            weight = lambda s, ww, i: jnp.where(_by_threshold(nucleus, s, i), ww, 0.0)  # noqa: E731
        xbs, sums = block_sums(xs, weight, fills)
        by_threshold, listed = jnp.sum(sums, axis=1), jnp.sum(nucleus.cand_w, axis=1)
        # one part or the other by mass; u[:, 0], rescaled, then draws inside the part
        share = by_threshold / (by_threshold + listed)
        u0 = u[:, 0]
        tok1, w1 = draw_in_blocks(xbs, weight, sums, jnp.where(share > 0, u0 / share, 0.0), u[:, 1])
        j = pick(nucleus.cand_w, jnp.where(share < 1, (u0 - share) / (1 - share), 0.0))[:, None]
        tok2 = jnp.take_along_axis(nucleus.cand_index, j, axis=1)[:, 0]
        w2 = jnp.take_along_axis(nucleus.cand_w, j, axis=1)[:, 0]
        first = u0 < share
        return jnp.where(first, tok1, tok2), jnp.log(jnp.where(first, w1, w2)) - jnp.log(by_threshold + listed)

    return _with_nucleus(logits.astype(jnp.float32), inv_t, top_p, cap, draw)


def nucleus_mask(logits: jax.Array, inv_t, top_p, cap: int = 256) -> jax.Array:
    """[N, V] bool: each row's top-p nucleus of softmax(logits * inv_t); top_p a float or one per
    row in (0, 1) (the trainer scores samples under the distribution they were drawn from)."""
    def mask(score, w, nucleus: Nucleus):
        n, vocab = w.shape
        index = jnp.broadcast_to(jnp.arange(vocab, dtype=jnp.int32), (n, vocab))
        part = _by_threshold(nucleus, score, index)
        return part.at[jnp.arange(n)[:, None], nucleus.cand_index].max(nucleus.cand_kept)

    return _with_nucleus(logits.astype(jnp.float32), inv_t, top_p, cap, mask)
