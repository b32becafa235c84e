"""Top-p by a threshold search on the logits: exact, without sorting the vocabulary.

For the rows whose nucleus runs past the sorted head of nucleus.py (wide
nuclei). A bracket [lo, hi) of logit thresholds with mass(logit >= lo) >=
need > mass(logit >= hi), need = top_p * total, is narrowed until it holds at
most `cap` tokens or one logit; each step is one pass over the logits (mass
and count above one threshold). The weights w = exp((logit - max) / T) are
recomputed in every pass: storing them costs more, as XLA allocates the
[N, V] buffer afresh on every call and pays for it in page faults.

Guesses interpolate the mass, on a normal quantile scale, linearly in the
logit (the mass of a Gaussian row is a normal tail there). The first comes
from a log-normal fit of the weights (close for flat rows); once one end is
close, guesses aim the other just past the cut; after two slow steps, and at
least every fifth, a guess halves the bracket in (logit - max) / T instead.

One more pass gives, per small block, the bracket's tokens (then gathered
and sorted) and the mass above the bracket (a draw picks a block by it). The
nucleus is every token above the bracket plus a prefix of the sorted ones; a
bracket left with more than `cap` tokens of one logit keeps the first by index.
"""
from __future__ import annotations

from statistics import NormalDist
from typing import NamedTuple

import jax
import jax.numpy as jnp

from atgrpo_jax.sampling.draw import blocked, divisor_blocks, fused_sum, masked_sums, sum_pair

MAX_STEPS = 1000  # never reached: every fifth step halves the bracket in z or in keys
LOWEST = -104.0  # (logit - max) / T below this weighs 0 in float32, denormals included


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
    return (vocab, 1) if vocab <= 1024 else divisor_blocks(vocab, 48, 16, 128, 32)


def _col(v, ndim):
    """[N] -> [N, 1, ...] to broadcast against an [N, ...] array of `ndim` axes."""
    return v.reshape((-1,) + (1,) * (ndim - 1))


def weights(x, m, inv_t):
    """exp((x - m) * inv_t) for logits x [N, ...] with a max m and inverse temperature inv_t per row."""
    return jnp.exp((x - _col(m, x.ndim)) * _col(inv_t, x.ndim))


class Bracket(NamedTuple):
    lo: jax.Array  # [N] uint32 logit key: mass(key >= lo) >= need
    hi: jax.Array  # [N] uint32 logit key: mass(key >= hi) < need
    m_lo: jax.Array  # [N] float32 masses at lo and hi
    m_hi: jax.Array
    c_lo: jax.Array  # [N] int32 tokens at or above lo and hi
    c_hi: jax.Array


class _Search(NamedTuple):
    step: jax.Array  # int32 scalar
    bracket: Bracket
    pull_lo: jax.Array  # [N] float32 Illinois weights of the two ends
    pull_hi: jax.Array
    side: jax.Array  # [N] int32: +1 the last guess moved lo, -1 it moved hi
    slow: jax.Array  # [N] int32 guesses in a row that did not halve the bracket's mass
    since_bisect: jax.Array  # [N] int32
    bisect: jax.Array  # [N] bool: the next guess halves the bracket


def _search(logits, m, inv_t, need, start: Bracket, first, cap: int):
    """(bracket, steps): `start` narrowed to <= cap tokens or one logit (module docstring).
    first: [N] the first guess, a logit."""
    n = logits.shape[0]
    total = start.m_lo

    def finished(s: _Search):
        b = s.bracket
        return (b.c_lo - b.c_hi <= cap) | (b.hi - b.lo <= 1)

    def probit(mass):
        return jax.scipy.special.ndtri(jnp.clip(mass / total, 1e-7, 1 - 1e-7))

    def scaled(key):  # (logit - max) / T of a threshold, clipped where weights vanish
        return jnp.clip((from_key(key) - m) * inv_t, LOWEST, 1.0)

    def guess(s: _Search):
        b = s.bracket
        z_lo, z_hi = scaled(b.lo), scaled(b.hi)
        cap_mass = cap * jnp.exp(z_lo)  # at least the mass of `cap` tokens in the bracket
        f_lo, f_hi = b.m_lo - need, need - b.m_hi
        # aim at the cut; once one end is close, aim the other just past it
        level = jnp.where(f_lo <= cap_mass / 4, need - cap_mass / 2,
                          jnp.where(f_hi <= cap_mass / 4, need + cap_mass / 2, need))
        at_cut = level == need
        e_lo = (probit(b.m_lo) - probit(level)) * jnp.where(at_cut, s.pull_lo, 1.0)
        e_hi = (probit(level) - probit(b.m_hi)) * jnp.where(at_cut, s.pull_hi, 1.0)
        frac = jnp.clip(e_lo / jnp.maximum(e_lo + e_hi, 1e-30), 0.0, 1.0)
        z = z_lo + jnp.where(s.bisect, 0.5, frac) * (z_hi - z_lo)  # halving in z halves log w's range
        g = to_key(jnp.where(s.step == 0, first, m + z / inv_t))
        # where float32 cannot split the bracket in z (logits far below the max, close together), halve
        # its keys: the search then ends within 32 more halvings
        stuck = s.bisect & ((g <= b.lo) | (g >= b.hi))
        return jnp.where(stuck, b.lo + (b.hi - b.lo) // 2, jnp.clip(g, b.lo + 1, b.hi - 1))

    def body(s: _Search):
        b, done = s.bracket, finished(s)
        g = guess(s)
        # the barrier ties the logits to the guess, so XLA cannot hoist exp and the keys out of the
        # loop (it would store both: two fresh [N, V] buffers per call)
        x, g = jax.lax.optimization_barrier((logits, g))
        m_g, c_g = masked_sums(weights(x, m, inv_t), to_key(x) >= g[:, None])  # the one pass
        up = (m_g >= need) & ~done  # g becomes the new lo
        down = (m_g < need) & ~done
        new = Bracket(jnp.where(up, g, b.lo), jnp.where(down, g, b.hi), jnp.where(up, m_g, b.m_lo),
                      jnp.where(down, m_g, b.m_hi), jnp.where(up, c_g, b.c_lo), jnp.where(down, c_g, b.c_hi))
        # Illinois: an end kept twice in a row has its pull halved, so the other end moves too
        pull_lo = jnp.where(up, 1.0, jnp.where(s.side < 0, s.pull_lo * 0.5, s.pull_lo))
        pull_hi = jnp.where(down, 1.0, jnp.where(s.side > 0, s.pull_hi * 0.5, s.pull_hi))
        # safeguard: halve the bracket after two slow guesses, and at least every fifth step
        slow = jnp.where(s.bisect | ((new.m_lo - new.m_hi) * 2 <= b.m_lo - b.m_hi), 0, s.slow + 1)
        since_bisect = jnp.where(s.bisect, 0, s.since_bisect + 1)
        bisect = (slow >= 2) | (since_bisect >= 4)
        return _Search(s.step + 1, new, pull_lo, pull_hi, jnp.where(up, 1, -1), jnp.where(bisect, 0, slow),
                       since_bisect, bisect)

    zeros_i, ones = jnp.zeros(n, jnp.int32), jnp.ones(n, jnp.float32)
    state = _Search(jnp.int32(0), start, ones, ones, zeros_i, zeros_i, zeros_i, jnp.zeros(n, bool))
    final = jax.lax.while_loop(lambda s: (s.step < MAX_STEPS) & ~jnp.all(finished(s)), body, state)
    return final.bracket, final.step


class Nucleus(NamedTuple):
    """Each row's nucleus: the tokens with logit key >= above, plus the kept candidates,
    plus (rows of > cap ties) the tokens with key in [lo, above) and index <= tie_index."""

    above: jax.Array  # [N] uint32 key
    lo: jax.Array  # [N] uint32 key
    tie_index: jax.Array  # [N] int32, -1 when the candidates hold the rest
    cand_index: jax.Array  # [N, c] int32
    cand_w: jax.Array  # [N, c] float32 weights of kept candidates, 0 for the others
    cand_kept: jax.Array  # [N, c] bool
    block_mass: jax.Array  # [N, blocks] float32 mass of the part decided by thresholds, per gather block


def by_threshold(nucleus: Nucleus, key, index):
    """Elementwise over [N, ...] logit keys and token indices: in the part of the nucleus decided by
    thresholds (not the candidates)."""
    col = lambda v: _col(v, key.ndim)  # noqa: E731
    return (key >= col(nucleus.above)) | ((key >= col(nucleus.lo)) & (index <= col(nucleus.tie_index)))


def _finish(logits, m, inv_t, need, b: Bracket, mass, counts, cap: int, size: int) -> Nucleus:
    """The nucleus from a bracket of <= cap tokens, or of > cap tokens tied at one logit. mass, counts
    [N, blocks]: per gather block, the mass above the bracket and the bracket's tokens."""
    n, vocab = logits.shape
    blocks = counts.shape[1]
    xb = blocked(logits, -jnp.inf, (size, blocks))
    # the first blocks holding bracket tokens, in index order (float32: XLA's fast CPU top_k takes floats)
    taken, _ = jax.lax.top_k(jnp.where(counts > 0, blocks - jnp.arange(blocks, dtype=jnp.float32), 0.0),
                             min(cap, blocks))
    block = jnp.minimum(blocks - taken.astype(jnp.int32), blocks - 1)
    cand = jnp.take_along_axis(xb, block[:, :, None], axis=1).reshape(n, -1)
    key = to_key(cand)
    pos = (block[:, :, None] * size + jnp.arange(size)).reshape(n, -1)
    inside = jnp.repeat(taken > 0, size, axis=1) & (pos < vocab) & (key >= b.lo[:, None]) & (key < b.hi[:, None])
    # sorted by logit, ties by index (top_k puts the lower position first, positions follow indices)
    _, j = jax.lax.top_k(jnp.where(inside, from_key(key), -jnp.inf), min(cap, pos.shape[1]))
    inside = jnp.take_along_axis(inside, j, axis=1)
    top_w = jnp.where(inside, weights(jnp.take_along_axis(cand, j, axis=1), m, inv_t), 0.0)
    before = b.m_hi[:, None] + jnp.cumsum(top_w, axis=1) - top_w
    total = jnp.sum(counts, axis=1)
    tied = total > cap  # then all of one logit: the first r by index, r = tokens the mass still needs
    kept = inside & (before < need[:, None]) & ~tied[:, None]
    r = jnp.clip(jnp.ceil((need - b.m_hi) / jnp.maximum(top_w[:, 0], 1e-38)), 1, total).astype(jnp.int32)
    upto = jnp.cumsum(counts, axis=1)
    blk = jnp.minimum(jnp.sum(upto < r[:, None], axis=1), blocks - 1)  # the block of the r-th
    r_in = r - jnp.take_along_axis(upto - counts, blk[:, None], axis=1)[:, 0]
    one = to_key(jnp.take_along_axis(xb, blk[:, None, None], axis=1)[:, 0])
    in_blk = (blk[:, None] * size + jnp.arange(size) < vocab) & (one >= b.lo[:, None]) & (one < b.hi[:, None])
    at = jnp.sum(jnp.cumsum(in_blk, axis=1) < r_in[:, None], axis=1)
    tie_index = jnp.where(tied, blk * size + at, -1).astype(jnp.int32)
    # the kept tied tokens join the part decided by thresholds, in each block's mass
    n_tied = jnp.where(jnp.arange(blocks) < blk[:, None], counts, jnp.where(jnp.arange(blocks) == blk[:, None],
                                                                            r_in[:, None], 0))
    mass = mass + jnp.where(tied[:, None], top_w[:, :1] * n_tied, 0.0)
    return Nucleus(b.hi, b.lo, tie_index, jnp.take_along_axis(pos, j, axis=1).astype(jnp.int32),
                   jnp.where(kept, top_w, 0.0), kept, mass)


def search_nucleus(logits, m, inv_t, total, top_p, cap: int) -> Nucleus:
    """Each row's nucleus found by the search.

    logits [N, V] float32; per row: m the max logit, inv_t, total the sum of the weights; top_p a
    float or [N].
    """
    n, vocab = logits.shape
    need = top_p * total
    # log-normal fit: logits ~ N(mu, s^2) puts the cut at log w = log(mean w) + s^2/2 - s * z_p
    # (one pass; squares of a 1/16 sample cost a step or two more on flat rows, measured)
    s2 = jnp.maximum(jnp.log(vocab * fused_sum(weights(logits, m, inv_t) ** 2) / total ** 2), 0.0)
    z = NormalDist().inv_cdf(top_p) if isinstance(top_p, float) else jax.scipy.special.ndtri(top_p)
    first = m + (jnp.log(total / vocab) + s2 / 2 - jnp.sqrt(s2) * z) / inv_t
    zeros, none = jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.int32)
    start = Bracket(to_key(jnp.full(n, -jnp.inf)), to_key(m) + 1, total, zeros, jnp.full(n, vocab, jnp.int32), none)
    b, _ = _search(logits, m, inv_t, need, start, first, cap)
    size, blocks = gather_layout(vocab)
    index = jnp.arange(size * blocks, dtype=jnp.int32).reshape(blocks, size)
    # one pass: per gather block, the mass above the bracket and the bracket's token count
    xb = blocked(logits, -jnp.inf, (size, blocks))
    key = to_key(xb)
    mass, counts = sum_pair(jnp.where(key >= _col(b.hi, 3), weights(xb, m, inv_t), 0.0),
                            (key >= _col(b.lo, 3)) & (key < _col(b.hi, 3)) & (index < vocab))
    return _finish(logits, m, inv_t, need, b, mass, counts, cap, size)
