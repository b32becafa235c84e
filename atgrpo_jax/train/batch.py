"""From rollout samples to fixed-shape training batches, one set per policy.

`policy_batches` lays samples out one per row (the PyTorch baseline eats that);
`pack_minibatch` turns a mini-batch of those rows into the trainer's `Packed`
layout (train/update.py), where the samples that share a prompt (a tree group's
K branches) share one copy of it. Which rows share a prompt is carried by the
rows' `share` ids (the group index of a tree group), not found by comparing tokens.
"""
from __future__ import annotations

import itertools

import numpy as np

from atgrpo_jax.rollout.samples import Samples, sequences


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
                   num_policies: int, mini_batch: int, rng: np.random.Generator,
                   inv_temp_of_agent: np.ndarray | None = None,
                   top_p_of_agent: np.ndarray | None = None,
                   penalty_of_agent: np.ndarray | None = None, only: int | None = None) -> list[dict | None]:
    """Per policy, its kept samples (keep: [G] groups or [G, K] samples) as arrays tokens/valid/
    is_resp/sampler_logp [N, L], adv [N], share [N] (rows with one share id >= 0 answer one
    prompt; -1: an empty row) and the sampling settings of each row's agent, inv_temp and
    top_p [N] (default 1: temperature 1, no top-p) and, if penalty_of_agent is given, its
    repetition penalty `penalty` [N], with N a multiple of `mini_batch` (the
    last mini-batch padded with empty rows); `only`: that policy's alone (the others None, and
    `rng` not drawn from for them). Groups are shuffled and each
    group's samples stay together, so a mini-batch holds whole groups (as verl's, and so
    `pack_minibatch` can share their prompt). A policy with no kept sample gets None.
    """
    keep = keep[:, None] if keep.ndim == 1 else keep  # groups kept, or samples kept
    has_response = samples.mask & (samples.response_len > 0) & keep
    policy = policy_of_agent[samples.sample_agent]  # [G, K]: a sample goes to its agent's policy
    out: list[dict | None] = []
    for p in range(num_policies):
        if only is not None and p != only:
            out.append(None)
            continue
        groups = np.flatnonzero((has_response & (policy == p)).any(1))
        groups = groups[rng.permutation(len(groups))]
        g, k = np.nonzero((has_response & (policy == p))[groups])  # group-major: a group's samples together
        g = groups[g]
        if not len(g):
            out.append(None)
            continue
        n = -(-len(g) // mini_batch) * mini_batch
        width = length_bucket(int((samples.sample_prompt_len()[g, k] + samples.response_len[g, k]).max()))
        tokens, is_resp, valid, logp = sequences(samples, g, k, width)
        share = samples.prompt_of[g, k]  # samples that answer one prompt share its copy
        pad = lambda x, fill=0: np.concatenate([x, np.full((n - len(x),) + x.shape[1:], fill, x.dtype)])
        per_agent = lambda values: pad(np.ones(len(g), np.float32) if values is None else  # noqa: E731
                                       np.asarray(values, np.float32)[samples.sample_agent[g, k]], 1.0)
        out.append(dict(tokens=pad(tokens), valid=pad(valid), is_resp=pad(is_resp), sampler_logp=pad(logp),
                        adv=pad(adv[g, k].astype(np.float32)), share=pad(share.astype(np.int64), -1),
                        inv_temp=per_agent(inv_temp_of_agent), top_p=per_agent(top_p_of_agent),
                        num_samples=len(g)))
        if penalty_of_agent is not None:
            out[-1]["penalty"] = per_agent(penalty_of_agent)
    return out


def _rows_of_shared_prompts(share: np.ndarray, start: np.ndarray, end: np.ndarray, slots: int | None,
                            max_width: int) -> list[list[int]]:
    """Sample indices per packed row: the samples of one share id (one prompt), in order, at
    most `slots` per row and as many as fit in `max_width` tokens. start, end: each sample's
    first response column and the column after its last token."""
    rows = []
    for _, members in itertools.groupby(np.flatnonzero(share >= 0), key=lambda i: share[i]):
        members = list(members)
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
    each scored token, -1 if none). Consecutive samples with one `share` id share a row
    (unless not `share_prompts`), at most `slots` per row (the trainer passes K) and as many
    as fit in `max_width` tokens (default: the rows' width; the trainer passes the widest a
    row can be under its config, so a packed mini-batch never needs more memory than one
    sample per row, which is what the planner assumes); R is padded to a power of two and
    a multiple of `shards` (the devices the batch is split over), W to `fine_bucket` and M
    (the most response tokens in a row) to `fine_bucket` at 4 sizes per octave. With a
    `penalty` per sample, also `penalty` [R, M] and `sample_row` [S] (the packed row of each
    mini-batch row's sample, -1 if none): the update rebuilds the ids each token had seen.
    """
    max_width = max(max_width or 0, mb["tokens"].shape[1])  # a single sample always fits
    start, end = mb["is_resp"].argmax(1), mb["valid"].sum(1)
    live = mb["is_resp"].any(1)
    if np.any(start[live] == 0):
        raise ValueError("a sample has an empty prompt: its first response token has nothing to be scored from")
    share = np.where(live, mb["share"] if share_prompts else np.arange(len(live)), -1)
    rows = _rows_of_shared_prompts(share, start, end, slots, max_width)
    # Per sample (in row order): its packed row, slot in the row, first scored entry and first column.
    sample = np.concatenate(rows)
    sizes = np.array([len(row) for row in rows])
    row_of = np.repeat(np.arange(len(rows)), sizes)
    row_begin = np.cumsum(sizes) - sizes  # index in `sample` of each row's first sample
    slot = np.arange(len(sample)) - row_begin[row_of]
    n_resp = end[sample] - start[sample]
    before = np.cumsum(n_resp) - n_resp
    first = before - before[row_begin][row_of]  # response tokens of the row's earlier samples
    prompt_len = start[sample]  # = the row's prompt length: a row holds one prompt
    col0 = prompt_len + first
    resp_len = np.bincount(row_of, weights=n_resp, minlength=len(rows)).astype(int)
    lead = sample[row_begin]  # the sample whose prompt the row holds
    r = length_bucket(len(rows), 1)
    r = -(-max(r, shards) // shards) * shards
    m = fine_bucket(int(resp_len.max()), 8, per_octave=4)  # few shapes across steps
    w = min(fine_bucket(int((start[lead] + resp_len).max()), 32), max_width)
    out = dict(tokens=np.zeros((r, w), np.int32), positions=np.zeros((r, w), np.int32),
               segment=np.full((r, w), -1, np.int32), pred=np.zeros((r, m), np.int32),
               target=np.zeros((r, m), np.int32), scored=np.zeros((r, m), bool),
               sample_len=np.zeros((r, m), np.int32), adv=np.zeros((r, m), np.float32),
               inv_temp=np.ones((r, m), np.float32), top_p=np.ones((r, m), np.float32),
               sampler_logp=np.zeros((r, m), np.float32), sample=np.full((r, m), -1, np.int32))
    # Prompts: columns [0, p) of each row.
    cols = np.arange(w)
    in_prompt = cols[None, :] < start[lead][:, None]
    prompt_cols = np.minimum(cols, mb["tokens"].shape[1] - 1)  # a packed row may be wider than a sample's
    out["tokens"][:len(rows)] = np.where(in_prompt, mb["tokens"][lead][:, prompt_cols], 0)
    out["positions"][:len(rows)] = np.where(in_prompt, cols, 0)
    out["segment"][:len(rows)] = np.where(in_prompt, 0, -1)
    # Responses: token j of sample i (j < n_resp[i]) goes to column col0 + j, entry first + j.
    owner = np.repeat(np.arange(len(sample)), n_resp)
    tok = np.arange(len(owner)) - before[owner]
    i, rr = sample[owner], row_of[owner]
    col, entry, src = col0[owner] + tok, first[owner] + tok, start[sample][owner] + tok
    out["tokens"][rr, col] = mb["tokens"][i, src]
    out["positions"][rr, col] = src
    out["segment"][rr, col] = slot[owner] + 1
    out["pred"][rr, entry] = np.where(tok == 0, prompt_len[owner] - 1, col - 1)
    out["target"][rr, entry] = mb["tokens"][i, src]
    out["scored"][rr, entry] = True
    out["sample_len"][rr, entry] = n_resp[owner]
    out["adv"][rr, entry] = mb["adv"][i]
    if "penalty" in mb:
        out["penalty"] = np.ones((r, m), np.float32)
        out["sample_row"] = np.full(len(mb["adv"]), -1, np.int32)
        out["sample_row"][sample] = row_of
    for name in ("inv_temp", "top_p", "penalty"):  # the distribution each token was drawn from
        if name in mb:
            out[name][rr, entry] = mb[name][i]
    out["sampler_logp"][rr, entry] = mb["sampler_logp"][i, src]
    out["sample"][rr, entry] = i
    return out
