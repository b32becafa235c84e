"""From rollout samples to fixed-shape training batches, one set per policy."""
from __future__ import annotations

import numpy as np

from atgrpo_jax.rollout.tree import Samples


def length_bucket(n: int, multiple: int = 32) -> int:
    """Sequence length rounded up to a power of two times `multiple` (few static shapes)."""
    size = multiple
    while size < n:
        size *= 2
    return size


def policy_batches(samples: Samples, adv: np.ndarray, keep: np.ndarray, policy_of_agent: np.ndarray,
                   num_policies: int, mini_batch: int, rng: np.random.Generator) -> list[dict | None]:
    """Per policy: arrays tokens/valid/is_resp/sampler_logp [N, L], adv [N], with N a
    multiple of `mini_batch` (the last mini-batch padded with empty rows) and rows
    shuffled. A policy with no kept sample gets None.
    """
    out: list[dict | None] = []
    for p in range(num_policies):
        rows = [(g, k) for g in np.flatnonzero(keep & (policy_of_agent[samples.agent] == p))
                for k in np.flatnonzero(samples.mask[g])]
        rows = [(g, k) for g, k in rows if len(samples.response[g][k])]
        if not rows:
            out.append(None)
            continue
        rows = [rows[i] for i in rng.permutation(len(rows))]
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
