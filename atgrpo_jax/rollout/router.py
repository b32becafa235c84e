"""The sample function the rollout calls: route an agent to its policy, then sample."""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from atgrpo_jax.rollout.tree import SampleOut
from atgrpo_jax.sampling import generate


def batch_buckets(max_rows: int) -> tuple[int, ...]:
    """A quarter, a half and all of max_rows: as tasks finish, fewer rows are
    sampled, and only three shapes are ever compiled per call site."""
    return tuple(sorted({max(1, max_rows // 4), max(1, max_rows // 2), max_rows}))


def make_sample_fn(policies, policy_of_agent: np.ndarray, tokenizer, *, max_new_tokens: int,
                   temperature: float, top_k: int, top_p: float, stop_ids: Sequence[int],
                   prompt_buckets: Sequence[int], max_tasks: int):
    """SampleFn(agent, prompts, k, key) for the rollout; `policies` may be updated in place."""
    rows = batch_buckets(max_tasks)
    pad_id = tokenizer.pad_token_id or 0
    stops = set(int(s) for s in stop_ids)

    def sample_fn(agent: int, prompts, k: int, key: jax.Array) -> SampleOut:
        model = policies[int(policy_of_agent[agent])].sampler_model()
        gen = generate(model, [list(map(int, p)) for p in prompts], max_new_tokens=max_new_tokens,
                       key=key, temperature=temperature, top_k=top_k, top_p=top_p,
                       stop_ids=tuple(stops), num_branches=k, pad_id=pad_id, buckets=prompt_buckets,
                       batch_buckets=rows)
        ids = [gen.tokens[i, :gen.lengths[i]] for i in range(len(gen.lengths))]
        logps = [gen.logprobs[i, :gen.lengths[i]] for i in range(len(gen.lengths))]
        texts = [tokenizer.decode([t for t in x if int(t) not in stops]) for x in ids]
        return SampleOut(ids, logps, texts)

    return sample_fn
