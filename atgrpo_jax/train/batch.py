"""From a step's samples to the update's packed mini-batches, one policy at a time.

`policy_batch` picks a policy's kept samples by their (group, branch) ids, a group's samples
together and the groups shuffled (as verl's mini-batches); `pack` lays a mini-batch of them out
in the update's `Packed` layout straight from the samples: each prompt once (found by the samples'
prompt ids, not by comparing tokens), then the responses to it. `pack(..., slots=1,
share_prompts=False)` is the one-sample-per-row layout (bench/rows.py gives it the PyTorch baseline's
form).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

import numpy as np

from atgrpo_jax.rollout.samples import Samples
from atgrpo_jax.train.update import Packed


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


@dataclasses.dataclass(frozen=True)
class PolicyBatch:
    """One policy's samples of a step, in update order: N slots naming (group, branch) of `samples`,
    a group's samples together, N a multiple of the mini-batch size (the last one padded with empty
    slots, group -1), and the sampling settings each sample was drawn with."""

    samples: Samples
    group: np.ndarray  # [N] int (-1: an empty slot)
    branch: np.ndarray  # [N] int
    adv: np.ndarray  # [N] float32
    inv_temp: np.ndarray  # [N] float32: 1 / its agent's temperature (1: temperature 1)
    top_p: np.ndarray  # [N] float32 (1: no top-p)
    penalty: np.ndarray | None  # [N] float32 repetition penalty (None: no agent has one)
    width: int  # the longest sample (prompt + response), length_bucket-ed: an unshared row's width

    @property
    def num_samples(self) -> int:
        return int((self.group >= 0).sum())

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """([N] prompt, [N] response) length of each slot's sample (0, 0 for an empty slot)."""
        live, g = self.group >= 0, np.maximum(self.group, 0)
        plen = self.samples.prompt_len[self.samples.prompt_of[g, self.branch]]
        return np.where(live, plen, 0), np.where(live, self.samples.response_len[g, self.branch], 0)

    def minibatches(self, size: int) -> list["PolicyBatch"]:
        cut = lambda x, i: None if x is None else x[i:i + size]  # noqa: E731
        return [dataclasses.replace(self, group=cut(self.group, i), branch=cut(self.branch, i), adv=cut(self.adv, i),
                                    inv_temp=cut(self.inv_temp, i), top_p=cut(self.top_p, i),
                                    penalty=cut(self.penalty, i)) for i in range(0, len(self.group), size)]


class Scoring(NamedTuple):
    """Per agent ([A] float32), the distribution the update scores its tokens under."""

    inv_temp: np.ndarray  # 1 / temperature
    top_p: np.ndarray  # 1: no top-p
    penalty: np.ndarray | None = None  # repetition penalty; None: no agent has one

    @classmethod
    def of(cls, scored_as) -> "Scoring":
        """From each agent's AgentSampling (Run.scored_as)."""
        penalty = np.array([s.repetition_penalty for s in scored_as], np.float32)
        return cls(np.array([s.inv_temp for s in scored_as], np.float32),
                   np.array([s.top_p for s in scored_as], np.float32), penalty if (penalty != 1).any() else None)


def policy_batch(samples: Samples, adv: np.ndarray, keep: np.ndarray, agents: np.ndarray, mini_batch: int,
                 rng: np.random.Generator | None, scoring: Scoring | None = None) -> PolicyBatch | None:
    """One policy's kept samples (keep: [G] groups or [G, K] samples; agents: [A] bool, the agents it
    trains) with a response, in a shuffled group order (`rng`; None: the samples' order, as the
    reference's unshuffled mini-batches), each group's samples together (so a mini-batch holds whole
    groups, as verl's, and `pack` can share their prompt), with each sample's agent's `scoring`
    (default: temperature 1, no top-p, no penalty). None: no such sample."""
    keep = keep[:, None] if keep.ndim == 1 else keep  # groups kept, or samples kept
    mine = samples.mask & (samples.response_len > 0) & keep & np.asarray(agents, bool)[samples.sample_agent]
    groups = np.flatnonzero(mine.any(1))
    groups = groups[rng.permutation(len(groups))] if rng is not None else groups
    g, k = np.nonzero(mine[groups])  # group-major: a group's samples together
    g = groups[g]
    if not len(g):
        return None
    n = -(-len(g) // mini_batch) * mini_batch
    pad = lambda x, fill=0: np.concatenate([x, np.full((n - len(x),) + x.shape[1:], fill, x.dtype)])  # noqa: E731
    per_agent = lambda values: pad(np.ones(len(g), np.float32) if values is None else  # noqa: E731
                                   np.asarray(values, np.float32)[samples.sample_agent[g, k]], 1.0)
    scoring = scoring or Scoring(None, None)
    width = length_bucket(int((samples.sample_prompt_len()[g, k] + samples.response_len[g, k]).max()))
    return PolicyBatch(samples, pad(g, -1), pad(k), pad(adv[g, k].astype(np.float32)), per_agent(scoring.inv_temp),
                       per_agent(scoring.top_p), None if scoring.penalty is None else per_agent(scoring.penalty), width)


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


class Minibatch(NamedTuple):
    """A packed mini-batch, on the host."""

    packed: Packed  # NumPy arrays; old_logp and ref_logp None
    sampler_logp: np.ndarray  # [R, M] float32: the sampler's log-prob of each scored entry
    sample: np.ndarray  # [R, M] int32: the mini-batch slot of each scored entry (-1: none)


def pack(mb: PolicyBatch, shards: int = 1, share_prompts: bool = True, slots: int | None = None,
         max_width: int | None = None, sample_ids: bool = False) -> Minibatch:
    """A mini-batch in the `Packed` layout (train/update.py). Consecutive samples that answer one
    prompt (one prompt id) share a row (unless not `share_prompts`), at most `slots` per row (the
    trainer passes K) and as many as fit in `max_width` tokens (default: the batch's `width`; the
    trainer passes the widest a row can be under its config, so a packed mini-batch never needs more
    memory than one sample per row, which is what the planner assumes); R is padded to a power of
    two and a multiple of `shards` (the devices the batch is split over), W to `fine_bucket` and M
    (the most response tokens in a row) to `fine_bucket` at 4 sizes per octave. With a repetition
    penalty, also `penalty` [R, M], `sample` [R, M] and `sample_row` [S] (the packed row of each
    slot's sample, -1 if none): the update rebuilds the ids each token had seen. With `sample_ids`,
    `sample` in any case (the sequence-level ratio averages over each sample's tokens).
    """
    s = mb.samples
    max_width = max(max_width or 0, mb.width)  # a single sample always fits
    plen, rlen = mb.lengths()
    start, end = plen, plen + rlen  # each slot's first response column and the column after its last token
    live = rlen > 0
    if np.any(start[live] == 0):
        raise ValueError("a sample has an empty prompt: its first response token has nothing to be scored from")
    gs, ks = np.maximum(mb.group, 0), mb.branch
    prompt_id = s.prompt_of[gs, ks]
    share = np.where(live, prompt_id if share_prompts else np.arange(len(live)), -1)
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
               inv_temp=np.ones((r, m), np.float32), top_p=np.ones((r, m), np.float32))
    sampler_logp, slot_of = np.zeros((r, m), np.float32), np.full((r, m), -1, np.int32)
    # Prompts: columns [0, p) of each row.
    cols = np.arange(w)
    in_prompt = cols[None, :] < start[lead][:, None]
    prompts = s.prompt[prompt_id[lead]]
    out["tokens"][:len(rows)] = np.where(in_prompt, prompts[:, np.minimum(cols, prompts.shape[1] - 1)], 0)
    out["positions"][:len(rows)] = np.where(in_prompt, cols, 0)
    out["segment"][:len(rows)] = np.where(in_prompt, 0, -1)
    # Responses: token j of sample i (j < n_resp[i]) goes to column col0 + j, entry first + j.
    owner = np.repeat(np.arange(len(sample)), n_resp)
    tok = np.arange(len(owner)) - before[owner]
    i, rr = sample[owner], row_of[owner]
    col, entry = col0[owner] + tok, first[owner] + tok
    ids = s.response[gs[i], ks[i], tok]
    out["tokens"][rr, col] = ids
    out["positions"][rr, col] = start[i] + tok
    out["segment"][rr, col] = slot[owner] + 1
    out["pred"][rr, entry] = np.where(tok == 0, prompt_len[owner] - 1, col - 1)
    out["target"][rr, entry] = ids
    out["scored"][rr, entry] = True
    out["sample_len"][rr, entry] = n_resp[owner]
    out["adv"][rr, entry] = mb.adv[i]
    out["inv_temp"][rr, entry] = mb.inv_temp[i]  # the distribution each token was drawn from
    out["top_p"][rr, entry] = mb.top_p[i]
    sampler_logp[rr, entry] = s.sampler_logp[gs[i], ks[i], tok]
    slot_of[rr, entry] = i
    if sample_ids or mb.penalty is not None:
        out["sample"] = slot_of
    if mb.penalty is not None:
        out["penalty"] = np.ones((r, m), np.float32)
        out["penalty"][rr, entry] = mb.penalty[i]
        out["sample_row"] = np.full(len(mb.group), -1, np.int32)
        out["sample_row"][sample] = row_of
    return Minibatch(Packed(**out), sampler_logp, slot_of)
