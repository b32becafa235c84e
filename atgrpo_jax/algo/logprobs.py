"""Token log-probs and entropies without the whole [B, T, V] logits tensor.

Rows (tokens) are processed in chunks: each chunk computes its [chunk, V]
float32 logits and reduces them to a log-prob and an entropy per token, so
peak memory is one chunk's logits, not B*T*V*4 bytes (1.2 GB for 8 x 256
tokens at V = 151,669).

The distribution is the one the sampler drew from (`SampledFrom`): ids past the
tokenizer's vocabulary excluded, the repetition penalty on the ids already seen
(`Repeats`), logits divided by the token's temperature, cut to
top-k and to the token's top-p nucleus, so old and new log-probs and the sampler's
are of one distribution and the importance ratio compares like with like. The cut
(which tokens are in) is taken as given, not differentiated; the sampled token is
always counted in it (it is, at the sampler's weights; after an update it might not be).

Two ways to differentiate through it:
- `token_logprobs` rematerializes each chunk's logits in the backward pass
  (any loss of the log-probs; the head matmul runs three times per chunk);
- `fused_head_loss` takes a loss that is a sum of per-token terms and computes
  that loss's gradients for the hidden states and the head inside the forward
  chunk pass, so the backward pass only scales them (the head matmul runs
  once forward and twice for gradients, with no recompute; the gradient
  products take the logits' gradient in the compute dtype, and the head's
  takes several chunks at once: `chunks_per_head_product`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from atgrpo_jax.sampling.nucleus import nucleus_mask
from atgrpo_jax.sampling.sample import penalize

NOT_SEEN = jnp.iinfo(jnp.int32).max


@dataclasses.dataclass(frozen=True)
class SampledFrom:
    """The static part of the sampling distribution (per-token temperature and top-p are arrays)."""

    vocab_limit: int | None = None  # ids >= it were never drawn (the LM head has more rows than the tokenizer)
    top_k: int = 0  # 0: off
    top_p: bool = False  # tokens were drawn from a top-p nucleus (each with its own top_p)
    top_p_cap: int = 256  # as the sampler's
    repetition_penalty: bool = False  # logits of ids already seen were penalized (each token with its own penalty)


class Repeats(NamedTuple):
    """What the repetition penalty needs: token (b, t) saw id v iff first[sample[b, t], v] < order[b, t]."""

    first: jax.Array  # [S, V] int32: -1 for the ids of sample s's prompt, else the order of the id's first
    # appearance in its response (NOT_SEEN: never)
    sample: jax.Array  # [B, T] int32: the sample each token belongs to
    order: jax.Array  # [B, T] int32: increasing along each sample's response
    penalty: jax.Array  # [B, T] float32: the penalty the token was sampled with (1: none)


def first_seen(prompt_present: jax.Array, sample, order, target, scored) -> jax.Array:
    """`Repeats.first` [S, V] from prompt_present [S, V] bool (the ids of each sample's prompt) and
    the response tokens target [B, T] of `sample` at `order` (where scored); ids >= V are ignored."""
    num_samples = prompt_present.shape[0]
    first = jnp.where(prompt_present, -1, NOT_SEEN).astype(jnp.int32)
    rows = jnp.where(scored & (sample >= 0), sample, num_samples)  # out of range: dropped
    return first.at[rows, target].min(order.astype(jnp.int32), mode="drop")


def _kept(logits, inv_temp, targets, top_p, how: SampledFrom):
    """[c, V] bool: the tokens the sampler could draw (the top-k, then the top-p of those), computed
    the way the sampler does (sampling/sample.py, nucleus.py), so a token's membership does not hang
    on rounding. None: all of them."""
    inv = jnp.ones(logits.shape[:1], jnp.float32) if inv_temp is None else inv_temp
    scaled = logits * inv[:, None]
    if how.top_k:
        vals, _ = jax.lax.top_k(scaled, min(how.top_k, scaled.shape[-1]))  # descending
        if how.top_p:
            w = jnp.exp(vals - vals[:, :1])
            inside = jnp.cumsum(w, axis=-1) - w < top_p[:, None] * jnp.sum(w, axis=-1, keepdims=True)
            vals = jnp.where(inside, vals, jnp.inf)
        keep = scaled >= jnp.min(vals, axis=-1, keepdims=True)
    elif how.top_p:
        full = top_p >= 1.0
        keep = nucleus_mask(logits, inv, jnp.where(full, 0.5, top_p), how.top_p_cap) | full[:, None]
    else:
        return None
    return keep | (jnp.arange(scaled.shape[-1]) == targets[:, None])


def _head(w, how: SampledFrom):
    """The LM head's columns the sampler could draw from."""
    return w[:, :how.vocab_limit] if how.vocab_limit else w


def _logits(h, head):
    """[c, V'] float32 logits of one chunk of hidden states [c, D] under head [D, V']."""
    return jnp.einsum("nd,dv->nv", h, head, preferred_element_type=jnp.float32)


def _chunk_stats(h, w, targets, how: SampledFrom = SampledFrom(), **sampling):
    """log p(target) and the entropy, per row of one chunk, under the sampling distribution."""
    return _logit_stats(_logits(h, _head(w, how)), targets, how, **sampling)


def _logit_stats(logits, targets, how: SampledFrom, inv_temp=None, top_p=None, penalty=None, sample=None,
                 order=None, first=None):
    """`_chunk_stats` from the chunk's float32 logits."""
    if penalty is not None:  # as the sampler: before temperature and truncation (sampling/sample.py)
        seen = jnp.take(first, jnp.maximum(sample, 0), axis=0)[:, :logits.shape[1]] < order[:, None]
        logits = penalize(logits, seen, penalty)
    keep = _kept(jax.lax.stop_gradient(logits), inv_temp, targets, top_p, how)
    if inv_temp is not None:
        logits = logits * inv_temp[:, None]
    if keep is not None:
        logits = jnp.where(keep, logits, -jnp.inf)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    probs = jnp.exp(logits - lse[:, None])
    # (masked logits are -inf: inside the where too, or 0 x inf makes the gradient NaN even where
    # the where drops it)
    plogp = probs * logits if keep is None else jnp.where(keep, probs * jnp.where(keep, logits, 0.0), 0.0)
    entropy = lse - plogp.sum(-1)
    return target_logit - lse, entropy


def _to_chunks(x: jax.Array, chunk: int, fill=0) -> jax.Array:
    """[B, T, ...] -> [num_chunks, chunk, ...], padded at the end with `fill`."""
    n = x.shape[0] * x.shape[1]
    flat = x.reshape(n, *x.shape[2:])
    pad = (-n) % chunk
    flat = jnp.pad(flat, ((0, pad),) + ((0, 0),) * (flat.ndim - 1), constant_values=fill)
    return flat.reshape(-1, chunk, *x.shape[2:])


# The padding of the per-token sampling arrays: the neutral value, not 0. A penalty of 0 divides the
# padded rows' logits by 0, and their NaN gradient, times the padded hidden state's zeros, poisons the
# head's gradient (0 x NaN); a temperature or top-p of 0 is as degenerate.
_NEUTRAL = {"penalty": 1.0, "inv_temp": 1.0, "top_p": 1.0}


def _sampling_chunks(how: SampledFrom, inv_temp, top_p, b: int, t: int, repeats, chunk: int) -> dict:
    return {k: _to_chunks(v, chunk, _NEUTRAL.get(k, 0))
            for k, v in _sampling_inputs(how, inv_temp, top_p, b, t, repeats).items()}


def _from_chunks(x: jax.Array, b: int, t: int) -> jax.Array:
    return x.reshape(-1)[:b * t].reshape(b, t)


def _sampling_inputs(how: SampledFrom, inv_temp, top_p, b: int, t: int, repeats: Repeats | None = None) -> dict:
    """The per-token sampling arrays the chunks need ([B, T] each; ones when not given)."""
    out = {}
    if how.repetition_penalty and repeats is not None:
        out.update(penalty=repeats.penalty.astype(jnp.float32), sample=repeats.sample, order=repeats.order)
    if inv_temp is not None:
        out["inv_temp"] = jnp.broadcast_to(inv_temp, (b, t)).astype(jnp.float32)
    if how.top_p:
        out["top_p"] = jnp.ones((b, t), jnp.float32) if top_p is None else jnp.broadcast_to(top_p, (b, t))
    return out


def _first(how: SampledFrom, repeats: Repeats | None) -> dict:
    return {"first": repeats.first} if how.repetition_penalty and repeats is not None else {}


def token_logprobs(hidden: jax.Array, head: jax.Array, targets: jax.Array, chunk_size: int = 1024,
                   how: SampledFrom = SampledFrom(), inv_temp=None, top_p=None,
                   repeats: Repeats | None = None) -> tuple[jax.Array, jax.Array]:
    """log p(targets) and entropy per position, under the sampling distribution (`SampledFrom`).

    hidden [B, T, D] (final-normed), head [D, V], targets [B, T] int; inv_temp and top_p:
    [B, T] per-token 1 / temperature and top-p (None: 1); repeats: the ids each token had seen
    and its repetition penalty (None: no penalty). Returns two float32 [B, T] arrays.
    """
    b, t, _ = hidden.shape
    chunk = min(chunk_size, b * t)
    w = head.astype(hidden.dtype)
    per_token = _sampling_chunks(how, inv_temp, top_p, b, t, repeats, chunk)
    first = _first(how, repeats)

    @jax.checkpoint
    def body(_, xs):
        h, y, x = xs
        return None, _chunk_stats(h, w, y, how, **x, **first)

    _, (logp, ent) = jax.lax.scan(body, None, (_to_chunks(hidden, chunk), _to_chunks(targets, chunk), per_token))
    return _from_chunks(logp, b, t), _from_chunks(ent, b, t)


def chunks_per_head_product(num_chunks: int, chunk: int, hidden_size: int, itemsize: int) -> int:
    """Chunks whose logits' gradients `fused_head_loss` keeps (in the compute dtype) and multiplies
    into the head's gradient at once: the most that divide num_chunks and take no more memory than
    the float32 [D, V] gradient itself (tokens <= 4 D / itemsize). Each product reads and writes
    that gradient once; per chunk of 512 that was ~1 ms of an H100 update step (docs/device.md)."""
    bound = max(1, (4 * hidden_size) // (itemsize * chunk))
    return max(k for k in range(1, min(bound, num_chunks) + 1) if num_chunks % k == 0)


def fused_head_loss(hidden: jax.Array, head: jax.Array, targets: jax.Array, token_inputs: dict,
                    loss_of_tokens: Callable, chunk_size: int = 1024, head_grad: bool = True,
                    how: SampledFrom = SampledFrom(), inv_temp=None, top_p=None, repeats: Repeats | None = None):
    """(loss, (logp, entropy)) where loss = sum over tokens of loss_of_tokens.

    loss_of_tokens(logp [c], entropy [c], inputs) -> [c] per-token loss terms,
    given one chunk of every [B, T] array in `token_inputs`; padded rows get
    zeros, so the terms must vanish when their inputs are zero (weight them by
    a per-token weight). The loss is differentiable in `hidden` and, if
    `head_grad`, in `head` (pass False for a frozen head: its [D, V] gradient
    is then never computed); logp and entropy [B, T] are returned for
    diagnostics and are not differentiable. how, inv_temp, top_p, repeats: as `token_logprobs`.
    """
    b, t, _ = hidden.shape
    chunk = min(chunk_size, b * t)
    hs, ys = _to_chunks(hidden, chunk), _to_chunks(targets, chunk)
    xs = jax.tree.map(lambda x: _to_chunks(x, chunk), token_inputs)
    ss = _sampling_chunks(how, inv_temp, top_p, b, t, repeats, chunk)
    first = _first(how, repeats)

    per_group = chunks_per_head_product(hs.shape[0], chunk, hidden.shape[-1], hidden.dtype.itemsize)

    def forward(hs, w):
        head = _head(w, how)

        def chunk_body(_, c):
            hc, yc, xc, sc = c
            (lp, ent), pull = jax.vjp(lambda lg: _logit_stats(lg, yc, how, **sc, **first), _logits(hc, head))
            terms, pull_terms = jax.vjp(lambda lp, ent: loss_of_tokens(lp, ent, xc), lp, ent)
            # The head matmul's gradients by hand, on the logits' gradient rounded to the compute
            # dtype (as autocast's backward does): autodiff would multiply the float32 gradient
            # into the bf16 operands, a float32 GEMM at half the bf16 rate (H100 profile,
            # docs/device.md). In float32 the cast is a no-op.
            g = pull(pull_terms(jnp.ones_like(terms)))[0].astype(hc.dtype)
            dh = jnp.einsum("nv,dv->nd", g, head, preferred_element_type=jnp.float32).astype(hc.dtype)
            return None, (terms.sum(), dh, lp, ent, g if head_grad else None)

        def group_body(dw, group):
            _, (sums, dh, lp, ent, g) = jax.lax.scan(chunk_body, None, group)
            if head_grad:  # one product for the group's chunks: dW is read and written once per group
                dwg = jnp.einsum("knd,knv->dv", group[0], g, preferred_element_type=jnp.float32)
                dw = dw.at[:, :dwg.shape[1]].add(dwg) if how.vocab_limit else dw + dwg
            return dw, (sums, dh, lp, ent)

        grouped = jax.tree.map(lambda x: x.reshape(-1, per_group, *x.shape[1:]), (hs, ys, xs, ss))
        dw0 = jnp.zeros(w.shape, jnp.float32) if head_grad else jnp.zeros((), jnp.float32)
        dw, outs = jax.lax.scan(group_body, dw0, grouped)
        sums, dh, lp, ent = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), outs)
        return (sums.sum(), (lp, ent)), (dh, dw.astype(w.dtype) if head_grad else None)

    @jax.custom_vjp
    def loss_and_stats(hs, w):
        return forward(hs, w)[0]

    w_shape, w_dtype = head.shape, hidden.dtype

    def backward(grads, g):
        dh, dw = grads
        dw = (g[0] * dw).astype(w_dtype) if head_grad else jnp.zeros(w_shape, w_dtype)
        return (g[0] * dh).astype(hs.dtype), dw

    loss_and_stats.defvjp(forward, backward)
    loss, (lp, ent) = loss_and_stats(hs, head.astype(hidden.dtype))
    stats = tuple(jax.lax.stop_gradient(_from_chunks(x, b, t)) for x in (lp, ent))
    return loss, stats
