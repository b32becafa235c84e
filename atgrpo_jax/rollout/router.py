"""The sample function the rollout calls: route an agent to its policy, then sample."""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.rollout.samples import SampleOut
from atgrpo_jax.sampling.generate import GenerateSettings


def batch_buckets(max_rows: int) -> tuple[int, ...]:
    """A quarter, a half and all of max_rows: as tasks finish, fewer rows are
    sampled, and only three shapes are ever compiled per call site."""
    return tuple(sorted({max(1, max_rows // 4), max(1, max_rows // 2), max_rows}))


@functools.partial(jax.jit, static_argnums=1)
def branch_keys(prompt_keys: jax.Array, k: int) -> jax.Array:
    """Row b*K + j's key: fold_in(prompt_keys[b], j)."""
    fold = lambda key: jax.vmap(lambda j: jax.random.fold_in(key, j))(jnp.arange(k))
    return jax.vmap(fold)(prompt_keys).reshape(-1)


def make_sample_fn(policies, policy_of_agent: np.ndarray, tokenizer, *, sampling: Sequence,
                   stop_ids: Sequence[int], prompt_buckets: Sequence[int], max_tasks: int,
                   temperature: float | None = None, decode_slots: int = 0):
    """SampleFn(agent, prompts, k, keys) for the rollout; `policies` may be updated in place.
    A policy samples (`policy.generate`: sampling.generate with its agent's GenerateSettings) where
    its weights live: on its pool, and with several processes on this process's part of it. sampling[agent]
    (train.config.AgentSampling) sets the agent's temperature (unless `temperature`
    overrides it for all, as `evaluate --temperature` does), top-k, top-p, repetition penalty
    and response length.
    decode_slots > 0: at most that many rows decode at once (continuous batching)."""
    stops = set(int(s) for s in stop_ids)
    settings = [GenerateSettings(temperature=s.temperature if temperature is None else temperature, top_k=s.top_k,
                                 top_p=s.top_p, repetition_penalty=s.repetition_penalty,
                                 pad_id=tokenizer.pad_token_id or 0, buckets=prompt_buckets,
                                 batch_buckets=batch_buckets(max_tasks),
                                 vocab_limit=len(tokenizer),  # never ids the tokenizer lacks
                                 slots=decode_slots or None) for s in sampling]

    def sample_fn(agent: int, prompts, k: int, keys: jax.Array) -> SampleOut:
        policy = policies[int(policy_of_agent[agent])]
        budget = sampling[agent].max_new_tokens
        if not jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
            keys = jax.random.wrap_key_data(keys)  # raw uint32 [n, 2] keys
        gen = policy.generate([list(map(int, p)) for p in prompts], settings[agent], num_branches=k,
                              max_new_tokens=budget, row_keys=branch_keys(keys, k), stop_ids=tuple(stops))
        texts = [tokenizer.decode([int(t) for t in row[:n] if int(t) not in stops])
                 for row, n in zip(gen.tokens, gen.lengths)]
        return SampleOut.from_rows(gen.tokens, gen.lengths, gen.logprobs, texts, budget)

    return sample_fn
