"""From rollout samples to fixed-shape training batches, one set per policy.

`policy_batches` lays samples out one per row (the PyTorch baseline eats that);
`pack_minibatch` turns a mini-batch of those rows into the trainer's `Packed`
layout (train/update.py), where the samples that share a prompt (a tree group's
K branches) share one copy of it.
"""
from __future__ import annotations

import numpy as np

from atgrpo_jax.rollout.tree import Samples


def length_bucket(n: int, multiple: int = 32) -> int:
    """Sequence length rounded up to a power of two times `multiple` (few static shapes)."""
    size = multiple
    while size < n:
        size *= 2
    return size


def fine_bucket(n: int, minimum: int = 8, per_octave: int = 8) -> int:
    """n rounded up to one of `per_octave` evenly spaced sizes per octave (padding under
    n / per_octave, few static shapes)."""
    if n <= minimum:
        return minimum
    step = max(1 << ((n - 1).bit_length() - per_octave.bit_length()), 8)  # multiples of 8 at least
    return -(-n // step) * step


def policy_batches(samples: Samples, adv: np.ndarray, keep: np.ndarray, policy_of_agent: np.ndarray,
                   num_policies: int, mini_batch: int, rng: np.random.Generator) -> list[dict | None]:
    """Per policy: arrays tokens/valid/is_resp/sampler_logp [N, L], adv [N], with N a
    multiple of `mini_batch` (the last mini-batch padded with empty rows). Groups are
    shuffled and each group's samples stay together, so a mini-batch holds whole groups
    (as verl's, and so `pack_minibatch` can share their prompt). A policy with no kept
    sample gets None.
    """
    out: list[dict | None] = []
    for p in range(num_policies):
        groups = np.flatnonzero(keep & (policy_of_agent[samples.agent] == p))
        rows = [(g, k) for g in groups[rng.permutation(len(groups))]
                for k in np.flatnonzero(samples.mask[g]) if len(samples.response[g][k])]
        if not rows:
            out.append(None)
            continue
        n = -(-len(rows) // mini_batch) * mini_batch
        lengths = [len(samples.prompt[g][k]) + len(samples.response[g][k]) for g, k in rows]
        width = length_bucket(max(lengths))
        tokens = np.zeros((n, width), np.int32)
        is_resp = np.zeros((n, width), bool)
        valid = np.zeros((n, width), bool)
        logp = np.zeros((n, width), np.float32)
        a = np.zeros(n, np.float32)
        for i, (g, k) in enumerate(rows):
            prompt, resp = samples.prompt[g][k], samples.response[g][k]
            m, r = len(prompt), len(resp)
            tokens[i, :m] = prompt
            tokens[i, m:m + r] = resp
            valid[i, :m + r] = True
            is_resp[i, m:m + r] = True
            logp[i, m:m + r] = samples.sampler_logp[g][k]
            a[i] = adv[g, k]
        out.append(dict(tokens=tokens, valid=valid, is_resp=is_resp, sampler_logp=logp, adv=a,
                        num_samples=len(rows)))
    return out


def _rows_of_shared_prompts(mb: dict, start: np.ndarray, end: np.ndarray, share: bool, slots: int | None,
                            max_width: int) -> list[list[int]]:
    """Sample indices per packed row: a prompt with at most `slots` of its responses,
    as many as fit in `max_width` tokens. start, end: each sample's first response
    column and the column after its last token."""
    live = np.flatnonzero(mb["is_resp"].any(1))
    if np.any(start[live] == 0):
        raise ValueError("a sample has an empty prompt: its first response token has nothing to be scored from")
    by_prompt: dict = {}
    for i in live:
        by_prompt.setdefault(mb["tokens"][i, :start[i]].tobytes() if share else i, []).append(i)
    rows = []
    for members in by_prompt.values():
        row, used = [], start[members[0]]
        for i in members:
            if row and (used + end[i] - start[i] > max_width or len(row) == slots):
                rows.append(row)
                row, used = [], start[i]
            row.append(i)
            used += end[i] - start[i]
        rows.append(row)
    return rows


def pack_minibatch(mb: dict, shards: int = 1, share_prompts: bool = True, slots: int | None = None,
                   max_width: int | None = None) -> dict:
    """A mini-batch of `policy_batches` rows in the `Packed` layout (train/update.py), as
    NumPy arrays, plus `sampler_logp` [R, M] and `sample` [R, M] (the mini-batch row of
    each scored token, -1 if none). Samples with one prompt share a row (unless not
    `share_prompts`), at most `slots` per row (the trainer passes K) and as many as fit
    in `max_width` tokens (default: the rows' width; the trainer passes the widest a row
    can be under its config, so a packed mini-batch never needs more memory than one
    sample per row, which is what the planner assumes); R is padded to a
    power of two and a multiple of `shards` (the devices the batch is split over), W to
    `fine_bucket` and M (the most response tokens in a row) to `fine_bucket` at 4
    sizes per octave.
    """
    max_width = max(max_width or 0, mb["tokens"].shape[1])  # a single sample always fits
    start, end = mb["is_resp"].argmax(1), mb["valid"].sum(1)
    rows = _rows_of_shared_prompts(mb, start, end, share_prompts, slots, max_width)
    resp_len = lambda row: int(sum(end[i] - start[i] for i in row))
    r = length_bucket(len(rows), 1)
    r = -(-max(r, shards) // shards) * shards
    m = fine_bucket(max(resp_len(row) for row in rows), 8, per_octave=4)  # few shapes across steps
    w = min(fine_bucket(max(int(start[row[0]]) + resp_len(row) for row in rows), 32), max_width)
    out = dict(tokens=np.zeros((r, w), np.int32), positions=np.zeros((r, w), np.int32),
               segment=np.full((r, w), -1, np.int32), pred=np.zeros((r, m), np.int32),
               target=np.zeros((r, m), np.int32), scored=np.zeros((r, m), bool),
               sample_len=np.zeros((r, m), np.int32), adv=np.zeros((r, m), np.float32),
               sampler_logp=np.zeros((r, m), np.float32), sample=np.full((r, m), -1, np.int32))
    for ri, row in enumerate(rows):
        p = start[row[0]]
        out["tokens"][ri, :p] = mb["tokens"][row[0], :p]
        out["positions"][ri, :p] = np.arange(p)
        out["segment"][ri, :p] = 0
        col = p  # next free column of the row; also the next scored entry's index + p
        for s, i in enumerate(row):
            n = end[i] - p
            cols, entries = slice(col, col + n), slice(col - p, col - p + n)
            out["tokens"][ri, cols] = mb["tokens"][i, p:end[i]]
            out["positions"][ri, cols] = np.arange(p, end[i])
            out["segment"][ri, cols] = s + 1
            out["pred"][ri, entries] = np.r_[p - 1, np.arange(col, col + n - 1)]
            out["target"][ri, entries] = mb["tokens"][i, p:end[i]]
            out["scored"][ri, entries] = True
            out["sample_len"][ri, entries] = n
            out["adv"][ri, entries] = mb["adv"][i]
            out["sampler_logp"][ri, entries] = mb["sampler_logp"][i, p:end[i]]
            out["sample"][ri, entries] = i
            col += n
    return out
