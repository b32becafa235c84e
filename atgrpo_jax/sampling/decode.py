"""Jitted prefill and decode on static shapes.

Rows: B prompts, each decoded on K branches, give N = B*K output rows in
prompt-major order (row b*K + k is branch k of prompt b).

`prefill` runs the B left-padded prompts once and keeps the last position's
logits only; it does not depend on K at all. `decode_segment` is a
`lax.while_loop`: each step samples a token per row from the carried logits,
records it, and runs the model on it for the next logits; it ends after a
given step or when every row is done. Between segments the host may move
the live rows into a smaller batch (`segments.py`), so finished rows stop
costing a step each; one segment to the end is the plain sampler.

Rows sit in groups of G consecutive rows; group g reads prefix row g (its
prompt's keys and values, as prefill wrote them) in place and owns only the
slots of its new tokens (see `branches.py`). At the start the groups are the
B prompts and G = K, so nothing is copied K times.

Where decode steps run per layer (`models.qwen3.decodes_per_layer`: GPUs and
TPUs by default), prefill hands its cache over as one array per layer, the
rows' own caches are made per layer, and `layer_weights_jit` slices the layer
weights once per sampling call: the loop then never slices a stacked array,
which would copy the layer at every step (docs/sampler_performance.md).

Rows may also start late (continuous batching, `segments.py`): a slot
freed by a finished row takes a waiting one. The step counter is global; a
row that started at step `start` writes its j-th token (and its keys and
values) at column (start + j) mod max_new of its buffers, a ring it never
laps since it makes at most max_new tokens; `write_back` unrolls the ring.
Rows that all start at step 0 write column j at step j, as a plain loop.

Repetition penalty (vLLM's): with `DecodeSettings.repetition_penalty` on,
each row carries a [R, V] bool set of the ids in its prompt and in its
response so far (made once by prefill, one scatter per step), and the
logits of those ids are divided by the penalty where positive, multiplied
where not, before temperature and truncation. Off, none of it is built.

Randomness: row r draws the uniforms of its j-th token from
fold_in(row_keys[r], j), so a row's tokens depend only on its prompt, its key
and the settings, never on the other rows, where they sit or when they
started: K branches equal K separate runs with the same row keys, and a
compacted or late row makes the tokens it would have made in a plain loop.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from atgrpo_jax.models.qwen3 import KVCache, decodes_per_layer, head_logits
from atgrpo_jax.models.strategies import cached
from atgrpo_jax.sampling.branches import branch_step, init_branch_cache
from atgrpo_jax.sampling.cache import constrain_cache, init_cache
from atgrpo_jax.sampling.sample import row_uniforms, select
from atgrpo_jax.sharding import GATHERED_RULES, RULES, constrain


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """Everything static about a sampling call (a new value compiles anew)."""

    max_new_tokens: int  # output columns: the largest row budget
    num_branches: int = 1
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    top_p_cap: int = 256  # tokens sorted per row at the end of the exact top-p search
    pad_id: int = 0
    cache_dtype: str | None = None  # None: the model's compute dtype
    raw_logprobs: bool = False  # also keep log softmax(logits) of each sampled token
    vocab_limit: int | None = None  # only ids < vocab_limit are sampled (None: all of the LM head's)
    repetition_penalty: bool = False  # penalize ids already seen (SamplingParams.repetition_penalty is by how much)

    def __post_init__(self):
        for name in ("max_new_tokens", "num_branches"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k < 0 or self.top_p_cap < 1:
            raise ValueError(f"top_k must be >= 0 and top_p_cap >= 1, got {self.top_k}, {self.top_p_cap}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.vocab_limit is not None and self.vocab_limit < 1:
            raise ValueError(f"vocab_limit must be >= 1 or None, got {self.vocab_limit}")


class SamplingParams(NamedTuple):
    """Traced controls: changing them does not recompile."""

    temperature: jax.Array  # float32 scalar, 0 = greedy
    repetition_penalty: jax.Array  # float32 scalar > 0, used only when DecodeSettings.repetition_penalty


class Prefilled(NamedTuple):
    cache: KVCache  # B rows, P slots: the prompts' keys and values
    logits: jax.Array  # [B, V] float32, next-token logits of each prompt
    lengths: jax.Array  # [B] int32, real tokens of each prompt (= position of its first new token)
    present: jax.Array | None = None  # [B, V] bool: ids in each prompt (with the repetition penalty only)


class Decoded(NamedTuple):
    tokens: jax.Array  # [N, max_new] int32, pad_id after a row's end
    logprobs: jax.Array  # [N, max_new] float32 under the distribution sampled from, 0 after the end
    raw_logprobs: jax.Array  # [N, max_new] float32 log softmax(logits); zeros unless asked
    lengths: jax.Array  # [N] int32, response tokens incl. the stop token
    stopped: jax.Array  # [N] bool, ended by a stop token (not by its budget)
    steps: jax.Array  # int32 scalar, loop iterations run (< max_new when all rows stopped early)


class Rows(NamedTuple):
    """The decode state of R rows in groups of G = R // groups consecutive rows."""

    prefix: KVCache | None  # [layers, groups, kv_heads, P, head_dim]: group g's prompt (not carried by the loop)
    own: KVCache  # [layers, R, kv_heads, slots, head_dim]: each row's new tokens (max_new slots, or
    # fewer while rows that all started at step 0 need no more: `segments.run`)
    logits: jax.Array  # [R, V]
    positions: jax.Array  # [R]
    done: jax.Array  # [R] bool
    budget: jax.Array  # [R] int32: tokens the row may produce
    stop_ids: jax.Array  # [R, S] int32, -1 padded
    keys: jax.Array  # [R] PRNG keys
    start: jax.Array  # [R] int32: the step each row began at (its j-th token is made at step start + j)
    out: Decoded  # the rows' outputs so far, ring-ordered (module docstring); out.steps is the global step
    present: jax.Array | None = None  # [R, V] bool: ids in the row's prompt and response so far (penalty only)


def _prefill(graphdef, weights, prompt_ids, prompt_mask, *, cache_dtype: str | None = None,
             presence: bool = False) -> Prefilled:
    """Run B left-padded prompts once; keeps the last position's logits only. Independent of K.
    presence: also the [B, V] set of each prompt's ids (for the repetition penalty)."""
    model = nnx.merge(graphdef, weights)
    b, p = prompt_ids.shape
    prompt_ids = constrain(prompt_ids, ("batch", "seq"))
    prompt_mask = constrain(prompt_mask.astype(bool), ("batch", "seq"))
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0).astype(jnp.int32)
    h, cache = model.hidden_states(prompt_ids, positions,
                                   cached(init_cache(model.cfg, b, p, cache_dtype), prompt_mask))
    if decodes_per_layer(model.cfg):  # the layout the decode step reads (prefill's loop writes the stack)
        cache = cache.per_layer()
    logits = model.logits(h[:, -1])  # left padding: the last column is every prompt's last token
    present = None
    if presence:
        ids = jnp.where(prompt_mask, prompt_ids, logits.shape[-1])  # padding: out of range, dropped
        present = jnp.zeros(logits.shape, bool).at[jnp.arange(b)[:, None], ids].set(True, mode="drop")
        present = constrain(present, ("batch", "vocab"))
    return Prefilled(constrain_cache(cache), constrain(logits, ("batch", "vocab")),
                     jnp.sum(prompt_mask, axis=1, dtype=jnp.int32), present)


def _step_select(s: Rows, params: SamplingParams, settings: DecodeSettings):
    """Sample row tokens from s.logits and record them in live rows; returns (tokens to feed, s)."""
    step = s.out.steps
    col = step % s.out.tokens.shape[1]  # the ring column of this step
    made = step - s.start  # tokens each row has made before this one
    sel = select(s.logits, row_uniforms(s.keys, made), params.temperature, top_k=settings.top_k,
                 top_p=settings.top_p, top_p_cap=settings.top_p_cap, raw_logprobs=settings.raw_logprobs,
                 vocab_limit=settings.vocab_limit, present=s.present, penalty=params.repetition_penalty)
    live = ~s.done
    tok = jnp.where(live, sel.tokens, settings.pad_id)
    if s.present is not None:  # one scatter: the new token counts as seen from the next step on
        seen = jnp.where(live, sel.tokens, s.present.shape[-1])  # finished rows: out of range, dropped
        s = s._replace(present=s.present.at[jnp.arange(tok.shape[0]), seen].set(True, mode="drop"))

    def put(buf, x):  # finished rows keep their column: their ring must survive until it is written back
        old = jax.lax.dynamic_slice_in_dim(buf, col, 1, axis=1)[:, 0]
        return jax.lax.dynamic_update_slice(buf, jnp.where(live, x.astype(buf.dtype), old)[:, None], (0, col))

    hit_stop = live & jnp.any(sel.tokens[:, None] == s.stop_ids, axis=-1)
    out = s.out._replace(
        tokens=put(s.out.tokens, tok),
        logprobs=put(s.out.logprobs, sel.logprobs),
        raw_logprobs=put(s.out.raw_logprobs, sel.raw_logprobs),
        lengths=jnp.where(live, made + 1, s.out.lengths),
        stopped=s.out.stopped | hit_stop,
        steps=step + 1,
    )
    done = s.done | hit_stop | (made + 1 >= s.budget)
    return tok, s._replace(done=done, out=out)


def empty_outputs(rows: int, settings: DecodeSettings) -> Decoded:
    new = settings.max_new_tokens
    return Decoded(jnp.full((rows, new), settings.pad_id, jnp.int32), jnp.zeros((rows, new), jnp.float32),
                   jnp.zeros((rows, new), jnp.float32),  # two buffers: a shared one cannot be donated twice
                   jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), bool), jnp.zeros((), jnp.int32))


def start(model, pre: Prefilled, settings: DecodeSettings, stop_ids=None, row_keys=None, budget=None,
          own_slots: int | None = None) -> Rows:
    """The first state, groups = the B prompts of K rows: all that grows with K before decoding.

    stop_ids [B, S] (default none), row_keys [B*K] (default fold_in(key(0), r)),
    budget [B] int32 (default max_new_tokens for every prompt); own_slots: slots of the rows' own
    caches (default max_new_tokens; fewer, for rows that all start now, grown as they decode:
    `segments.run`).
    """
    k, new = settings.num_branches, settings.max_new_tokens
    b = pre.logits.shape[0]
    n = b * k
    stop_ids = jnp.full((b, 1), -1, jnp.int32) if stop_ids is None else stop_ids.astype(jnp.int32)
    budget = jnp.full((b,), new, jnp.int32) if budget is None else budget.astype(jnp.int32)
    if row_keys is None:
        row_keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.key(0), r))(jnp.arange(n))
    # The K branches of a prompt start from its logits; copying them is the first step's work.
    logits = constrain(jnp.repeat(pre.logits, k, axis=0), ("batch", "vocab"))
    own = init_branch_cache(model, n, own_slots or new, pre.cache.dtype)
    present = None if pre.present is None else constrain(jnp.repeat(pre.present, k, axis=0), ("batch", "vocab"))
    return Rows(pre.cache, own, logits, jnp.repeat(pre.lengths, k), jnp.zeros((n,), bool),
                jnp.repeat(budget, k), jnp.repeat(stop_ids, k, axis=0), row_keys, jnp.zeros((n,), jnp.int32),
                empty_outputs(n, settings), present)


def _start(graphdef, weights, pre: Prefilled, stop_ids, row_keys, budget, settings,
           own_slots: int | None = None) -> tuple[Rows, Decoded]:
    """The first rows and the caller-ordered output buffers."""
    rows = start(nnx.merge(graphdef, weights), pre, settings, stop_ids, row_keys, budget, own_slots)
    return rows, empty_outputs(rows.logits.shape[0], settings)


def write_back(full: Decoded, rows: Rows, ids, pad_id: int) -> Decoded:
    """The rows' outputs, unrolled from their rings, into the caller-ordered buffers at `ids`;
    fillers (id -1) are dropped."""
    o = rows.out
    width = o.tokens.shape[1]
    j = jnp.arange(width)
    src = (rows.start[:, None] + j) % width  # column of each row's j-th token
    made = j < o.lengths[:, None]
    unroll = lambda buf, fill: jnp.where(made, jnp.take_along_axis(buf, src, axis=1), fill)  # noqa: E731
    at = jnp.where(ids >= 0, ids, full.lengths.shape[0])  # out of range: dropped
    put = lambda buf, x: buf.at[at].set(x, mode="drop")  # noqa: E731
    return Decoded(put(full.tokens, unroll(o.tokens, pad_id)),
                   put(full.logprobs, unroll(o.logprobs, 0.0)), put(full.raw_logprobs, unroll(o.raw_logprobs, 0.0)),
                   put(full.lengths, o.lengths), put(full.stopped, o.stopped), o.steps)


def _segment(graphdef, weights, layers, rows: Rows, full: Decoded, ids, until, params: SamplingParams,
             settings: DecodeSettings) -> tuple[Rows, Decoded]:
    """Decode until step `until` (traced) or until every row is done, then write the rows'
    outputs to `full` at `ids` (the caller's row of each; -1 for fillers). layers: the
    per-layer weights when decode steps run per layer (`layer_weights_jit`), else None.

    The loop carries the per-row state only (the prefix is read in place);
    `rows` and `full` are donated, so XLA updates them where they lie.
    """
    model = nnx.merge(graphdef, weights)
    prefix = rows.prefix
    groups = prefix.valid.shape[0]
    branches = rows.logits.shape[0] // groups

    def unfinished(s: Rows):
        return (s.out.steps < until) & ~jnp.all(s.done)

    width = rows.own.slots

    def step(s: Rows):
        step = s.out.steps
        # a row sees the ring slots it wrote since it started, and the one this step writes
        own_allowed = ((jnp.arange(width) - s.start[:, None]) % width <= (step - s.start)[:, None])[:, None, :]
        tok, s = _step_select(s, params, settings)
        own = s.own._replace(index=step % width)
        h, own = branch_step(model, tok, s.positions, prefix, own, branches, own_allowed,
                             None if layers is None else layers.layers)
        logits = constrain(model.logits(h) if layers is None else head_logits(h, layers.head), ("batch", "vocab"))
        return s._replace(own=own, logits=logits, positions=s.positions + 1)

    rows = jax.lax.while_loop(unfinished, step, rows._replace(prefix=None))._replace(prefix=prefix)
    return rows, write_back(full, rows, ids, settings.pad_id)


class DecodeWeights(NamedTuple):
    """What per-layer decode steps read, made once per sampling call: each layer's weights
    (`Qwen3.layer_weights`) and the LM head in the compute dtype. With model.decode_gather they are
    whole over the mesh's fsdp axis (split over tensor as the weights are), so a step runs no weight
    collectives: on an FSDP mesh each step would otherwise gather every weight again."""

    layers: tuple
    head: jax.Array


def _layer_weights(graphdef, weights) -> DecodeWeights | None:
    """The per-layer weights the decode steps read, or None when they run the stacked weights in a
    loop (model.decode_unroll < layers)."""
    model = nnx.merge(graphdef, weights)
    if not decodes_per_layer(model.cfg):
        return None
    rules = GATHERED_RULES if model.cfg.decode_gather else RULES
    head = constrain(model.head_weight().astype(model.cfg.dtype), ("embed", "vocab"), rules)
    return DecodeWeights(model.layer_weights(rules), head)


prefill_jit = jax.jit(_prefill, static_argnames=("graphdef", "cache_dtype", "presence"))
layer_weights_jit = jax.jit(_layer_weights, static_argnames=("graphdef",))
start_jit = jax.jit(_start, static_argnames=("graphdef", "settings", "own_slots"))
segment_jit = jax.jit(_segment, static_argnames=("graphdef", "settings"), donate_argnames=("rows", "full"))


def sampling_params(temperature=1.0, repetition_penalty=1.0) -> SamplingParams:
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
    return SamplingParams(jnp.float32(temperature), jnp.float32(repetition_penalty))
