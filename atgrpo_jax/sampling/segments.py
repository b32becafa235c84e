"""Decoding in segments, with finished rows dropped between them.

A decode step costs the same for every row of the batch, finished or not,
so with long-tail lengths most of a plain loop's work goes to rows that are
done. Here the loop stops every `segment` steps; if the live rows fit the
next smaller batch bucket, they are gathered into it (tokens so far,
positions, per-row cache, logits, keys, budgets, stop sets, and the prompt
rows of the cache they read), and decoding goes on with the smaller batch.
Each segment ends by writing its rows' outputs to buffers in the caller's
row order, so a dropped row's outputs are already in place.

Buckets halve the N = B*K rows (B padded prompts, rounding up): R rows sit
in R // G groups of G rows, each reading one prompt row, with the fewest
rows per group that keep the groups at most B (so the gathered prompt cache
never has more rows than prefill made); G = 1 once R <= B. A bucket fits when each
prompt's live rows, in chunks of G, need at most R // G groups. Each bucket
compiles one segment and one compaction (to the next bucket); shapes never
depend on where rows end, so nothing recompiles after the buckets are warm.

The rows' own caches (their new tokens' keys and values) start small when
every row starts at step 0 and grow by doubling before the steps that need
the slots (`own_slots`): a decode step reads all of its rows' own slots,
written or not, so with a budget of 2,048 tokens and answers of a few
hundred, full-width caches would make most of the step's reads empty slots
(docs/device.md). Each width compiles one segment per row bucket.

A row's computation does not depend on its neighbours (its own key, its
own prompt row, its own cache slots), so its tokens and log-probs are those
of the plain loop; floats can still differ in the last bit where XLA's CPU
matmul picks its kernel by the number of rows (as any change of batch does).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from atgrpo_jax.models.strategies import select_rows
from atgrpo_jax.sampling.cache import constrain_cache
from atgrpo_jax.sampling.decode import (Decoded, DecodeSettings, Prefilled, Rows, SamplingParams, empty_outputs,
                                        layer_weights_jit, prefill_jit, segment_jit, start, start_jit)
from atgrpo_jax.sharding import constrain


def row_buckets(prompts: int, branches: int, min_rows: int = 1) -> list[tuple[int, int]]:
    """[(rows, groups)] from B*K rows down, about halving each time; groups = the most prompt rows
    (at most B) that divide the rows evenly."""
    rows, out = prompts * branches, []
    while True:
        out.append((rows, max(g for g in range(1, min(rows, prompts) + 1) if rows % g == 0)))
        if -(-rows // 2) < min_rows or rows == 1:
            return out
        rows = -(-rows // 2)


class Compaction(NamedTuple):
    """Where the live rows go when a batch is compacted (`plan_compaction`)."""

    src: np.ndarray  # [R'] int32: the current row each new row continues (0 for filler rows)
    keep: np.ndarray  # [R'] bool: a live row (False: filler, marked done)
    src_group: np.ndarray  # [groups'] int32: the current group whose prompt row each new group reads
    ids: np.ndarray  # [R'] int32: the caller's row index of each new row, -1 for fillers


def plan_compaction(ids, live, prompt_of, groups_now: int, rows: int, groups: int) -> Compaction | None:
    """Where each live row goes in a batch of `rows` rows in `groups` groups, or None if they do not fit.

    ids [R] caller's row index (-1: filler); live [R] bool; prompt_of [N] the prompt of each caller row.
    """
    size_now, size = len(ids) // groups_now, rows // groups
    by_prompt: dict[int, list[int]] = {}
    for r in np.flatnonzero(live):
        by_prompt.setdefault(int(prompt_of[ids[r]]), []).append(int(r))
    chunks = [rs[i:i + size] for _, rs in sorted(by_prompt.items()) for i in range(0, len(rs), size)]
    if len(chunks) > groups:
        return None
    src, keep = np.zeros(rows, np.int32), np.zeros(rows, bool)
    new_ids, src_group = np.full(rows, -1, np.int32), np.zeros(groups, np.int32)
    for g, chunk in enumerate(chunks):
        src_group[g] = chunk[0] // size_now
        slots = g * size + np.arange(len(chunk))
        src[slots], keep[slots], new_ids[slots] = chunk, True, ids[chunk]
    return Compaction(src, keep, src_group, new_ids)


def _compact(rows: Rows, src, keep, src_group) -> Rows:
    """The kept rows (and the prompt rows they read) gathered into a smaller batch; the others are
    already written back (`decode_segment` does so at its end)."""
    take = lambda x: constrain(jnp.take(x, src, axis=0), ("batch",) + (None,) * (x.ndim - 1))  # noqa: E731
    o = rows.out
    out = Decoded(take(o.tokens), take(o.logprobs), take(o.raw_logprobs), take(o.lengths), take(o.stopped), o.steps)
    present = None if rows.present is None else take(rows.present)
    return Rows(rows.prefix.take_rows(src_group), rows.own.take_rows(src), take(rows.logits), take(rows.positions),
                take(rows.done) | ~keep, take(rows.budget), take(rows.stop_ids), take(rows.keys), take(rows.start), out,
                present)


def _admit(rows: Rows, pre: Prefilled, stop_ids, budget, row_keys, new_ids, branches: int) -> Rows:
    """Slots with new_ids[r] >= 0 start caller row new_ids[r] (prompt new_ids[r] // branches) at the
    current step; the others go on. Rows sit in groups of one: each slot reads its own prompt row.
    A new row's ring needs no clearing: it only sees, and writes back, what it writes itself."""
    fill = new_ids >= 0
    caller = jnp.maximum(new_ids, 0)
    prompt = caller // branches

    def admit(old, new):  # new rows where fill
        return select_rows(fill, new, old)

    prefix = constrain_cache(rows.prefix.where_rows(fill, pre.cache.take_rows(prompt)))
    o = rows.out
    out = o._replace(lengths=jnp.where(fill, 0, o.lengths), stopped=o.stopped & ~fill)
    present = None if rows.present is None else admit(rows.present, jnp.take(pre.present, prompt, axis=0))
    return Rows(prefix, rows.own, admit(rows.logits, jnp.take(pre.logits, prompt, axis=0)),
                admit(rows.positions, jnp.take(pre.lengths, prompt)), rows.done & ~fill,
                admit(rows.budget, jnp.take(budget, prompt)), admit(rows.stop_ids, jnp.take(stop_ids, prompt, axis=0)),
                admit(rows.keys, jnp.take(row_keys, caller)), jnp.where(fill, o.steps, rows.start), out, present)


def _empty(graphdef, weights, pre: Prefilled, stop_ids, row_keys, budget, slots: int, settings: DecodeSettings):
    """`slots` finished filler rows in groups of one to admit rows into, and the caller-ordered
    output buffers (one row per key)."""
    first_prompt = Prefilled(pre.cache.take_rows(jnp.zeros(1, jnp.int32)), pre.logits[:1], pre.lengths[:1],
                             None if pre.present is None else pre.present[:1])
    one = start(nnx.merge(graphdef, weights), first_prompt, dataclasses.replace(settings, num_branches=1),
                stop_ids[:1], row_keys[:1], budget[:1])
    first = jnp.zeros(slots, jnp.int32)
    return _compact(one, first, jnp.zeros(slots, bool), first), empty_outputs(row_keys.shape[0], settings)


def own_slots(steps: int, max_new: int, first: int = 128) -> int:
    """Own-cache slots for `steps` steps of rows that started at step 0: a power of 2 from `first`
    slots, at most max_new (few widths, so few compiled segments)."""
    return min(max_new, max(first, 1 << max(steps - 1, 0).bit_length()))


compact_jit = jax.jit(_compact)
grow_jit = jax.jit(lambda cache, slots: constrain_cache(cache.grow(slots)), static_argnames=("slots",))
admit_jit = jax.jit(_admit, static_argnames=("branches",), donate_argnames=("rows",))
empty_jit = jax.jit(_empty, static_argnames=("graphdef", "slots", "settings"))
JITTED = (prefill_jit, start_jit, segment_jit, compact_jit, admit_jit, empty_jit, grow_jit)  # what a call compiles


class Decoding(NamedTuple):
    out: Decoded  # [N] rows in the caller's order
    row_steps: int  # decode work: the rows of each segment's batch times the steps it ran


def run(model, prompt_ids, prompt_mask, stop_ids, row_keys, params: SamplingParams, settings: DecodeSettings,
        budget=None, segment: int = 16, min_rows: int = 1, slots: int | None = None, grow_own: bool = True) -> Decoding:
    """Prefill, then decode to the end in segments of `segment` steps (0: one segment, no compaction).

    prompt_ids, prompt_mask [B, P] left-padded (every row's last column is
    real); stop_ids [B, S] int32 padded with -1; row_keys [B*K] PRNG keys;
    budget [B] tokens each prompt's rows may produce (default max_new_tokens).
    slots < B*K: continuous batching; at most `slots` rows decode at once,
    the caller's rows start in order as slots free up (at segment ends), then
    the last ones are compacted as usual. grow_own: start the rows' own caches small and grow
    them as the steps need (rows that all start at step 0, in segments); False: full width.
    """
    graphdef, weights = nnx.split(model)
    b, k, new = prompt_ids.shape[0], settings.num_branches, settings.max_new_tokens
    n = b * k
    budget = np.full(b, new, np.int32) if budget is None else np.asarray(budget, np.int32)
    continuous = slots is not None and slots < n
    if continuous and (segment <= 0 or slots < 1):
        raise ValueError(f"continuous batching (slots={slots} < {n} rows) needs slots >= 1 and segment >= 1, "
                         f"got segment={segment}")
    pre = prefill_jit(graphdef, weights, prompt_ids, prompt_mask, cache_dtype=settings.cache_dtype,
                      presence=settings.repetition_penalty)
    layers = layer_weights_jit(graphdef, weights)  # sliced once for every decode step of the call
    grow_own = grow_own and segment > 0 and not continuous  # late rows' rings wrap: full width for them
    prompt_of = np.arange(n) // k
    if continuous:
        stop_ids, budget = jnp.asarray(stop_ids), jnp.asarray(budget)  # read at every admission
        rows, full = empty_jit(graphdef, weights, pre, stop_ids, row_keys, budget, slots=slots, settings=settings)
        buckets = [(r, r) for r, _ in row_buckets(slots, 1, min_rows)]  # groups of one row
        ids, done, waiting = np.full(slots, -1, np.int32), np.ones(slots, bool), 0
    else:
        rows, full = start_jit(graphdef, weights, pre, stop_ids, row_keys, budget, settings=settings,
                               own_slots=own_slots(segment, new) if grow_own else None)
        buckets = row_buckets(b, k, min_rows)
        ids, waiting = np.arange(n, dtype=np.int32), n
    level, step, row_steps = 0, 0, 0
    while True:
        if waiting < n:  # free slots (finished rows, already written back) take the next rows
            free = np.flatnonzero(done)[:n - waiting]
            new_ids = np.full(len(ids), -1, np.int32)
            new_ids[free] = np.arange(waiting, waiting + len(free))
            rows = admit_jit(rows, pre, stop_ids, budget, row_keys, new_ids, branches=k)
            ids, waiting = np.where(new_ids >= 0, new_ids, ids), waiting + len(free)
        until = step + segment if segment > 0 else new  # every row is done by step `new` unless it started late
        if grow_own and rows.own.slots < min(until, new):
            rows = rows._replace(own=grow_jit(rows.own, slots=own_slots(min(until, new), new)))
        rows, full = segment_jit(graphdef, weights, layers, rows, full, ids, np.int32(until), params,
                                 settings=settings)
        done, reached = jax.device_get((rows.done, rows.out.steps))
        row_steps += len(ids) * (int(reached) - step)
        step = int(reached)
        if waiting < n:
            continue
        if done.all() or (step >= new and not continuous):
            break
        while level + 1 < len(buckets):  # one halving at a time: one compaction per bucket to compile
            r, g = buckets[level + 1]
            plan = plan_compaction(ids, ~done, prompt_of, buckets[level][1], r, g)
            if plan is None:
                break
            rows = compact_jit(rows, plan.src, plan.keep, plan.src_group)
            ids, done, level = plan.ids, ~plan.keep, level + 1
    return Decoding(full, row_steps)
