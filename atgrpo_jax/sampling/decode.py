"""Jitted prefill and decode on static shapes.

Rows: B prompts, each decoded on K branches, give N = B*K output rows in
prompt-major order (row b*K + k is branch k of prompt b).

`prefill` runs the B left-padded prompts once and keeps the last position's
logits only; it does not depend on K at all. `decode` is a `lax.while_loop`:
each step samples a token per row from the carried logits, records it, and
runs the model on it for the next logits; it ends when every row is done.
The K branches of a prompt read its prompt cache in place (see
`branches.py`); only their new tokens get per-row slots, made inside decode
and updated in place by XLA. Token selection is compiled once, inside the
loop; the price is one forward pass after the last token (1/max_new of the work).

Randomness: row r draws its step-s uniforms from fold_in(row_keys[r], s), so
a row's tokens depend only on its prompt, its key and the settings, never on
the other rows: K branches equal K separate runs with the same row keys.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from atgrpo_jax.models.qwen3 import KVCache
from atgrpo_jax.sampling.branches import branch_step, init_branch_cache
from atgrpo_jax.sampling.cache import constrain_cache, init_cache
from atgrpo_jax.sampling.sample import row_uniforms, select
from atgrpo_jax.sharding import constrain


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """Everything static about a sampling call (a new value compiles anew)."""

    max_new_tokens: int
    num_branches: int = 1
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    top_p_cap: int = 256  # tokens sorted per row at the end of the exact top-p search
    pad_id: int = 0
    cache_dtype: str | None = None  # None: the model's compute dtype
    raw_logprobs: bool = False  # also keep log softmax(logits) of each sampled token
    vocab_limit: int | None = None  # only ids < vocab_limit are sampled (None: all of the LM head's)

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


class Prefilled(NamedTuple):
    cache: KVCache  # B rows, P slots: the prompts' keys and values
    logits: jax.Array  # [B, V] float32, next-token logits of each prompt
    lengths: jax.Array  # [B] int32, real tokens of each prompt (= position of its first new token)


class Decoded(NamedTuple):
    tokens: jax.Array  # [N, max_new] int32, pad_id after a row's end
    logprobs: jax.Array  # [N, max_new] float32 under the distribution sampled from, 0 after the end
    raw_logprobs: jax.Array  # [N, max_new] float32 log softmax(logits); zeros unless asked
    lengths: jax.Array  # [N] int32, response tokens incl. the stop token
    stopped: jax.Array  # [N] bool, ended by a stop token (not by max_new)
    steps: jax.Array  # int32 scalar, loop iterations run (< max_new when all rows stopped early)


class _Loop(NamedTuple):
    own: KVCache  # [layers, N, kv_heads, max_new, head_dim]: each branch's new tokens
    logits: jax.Array  # [N, V]
    positions: jax.Array  # [N]
    done: jax.Array  # [N] bool
    out: Decoded


def _prefill(graphdef, weights, prompt_ids, prompt_mask, *, cache_dtype: str | None = None) -> Prefilled:
    """Run B left-padded prompts once; keeps the last position's logits only. Independent of K."""
    model = nnx.merge(graphdef, weights)
    b, p = prompt_ids.shape
    prompt_ids = constrain(prompt_ids, ("batch", "seq"))
    prompt_mask = constrain(prompt_mask.astype(bool), ("batch", "seq"))
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0).astype(jnp.int32)
    h, cache = model.hidden_states(prompt_ids, positions, prompt_mask,
                                   init_cache(model.cfg, b, p, cache_dtype))
    logits = model.logits(h[:, -1])  # left padding: the last column is every prompt's last token
    return Prefilled(constrain_cache(cache), constrain(logits, ("batch", "vocab")),
                     jnp.sum(prompt_mask, axis=1, dtype=jnp.int32))


def _step_select(s: _Loop, row_keys, stop_ids, params: SamplingParams, settings: DecodeSettings):
    """Sample row tokens from s.logits and record them in live rows; returns (tokens to feed, s)."""
    col = s.out.steps
    sel = select(s.logits, row_uniforms(row_keys, col), params.temperature, top_k=settings.top_k,
                 top_p=settings.top_p, top_p_cap=settings.top_p_cap, raw_logprobs=settings.raw_logprobs,
                 vocab_limit=settings.vocab_limit)
    live = ~s.done
    tok = jnp.where(live, sel.tokens, settings.pad_id)

    def put(buf, x):
        return jax.lax.dynamic_update_slice(buf, x[:, None].astype(buf.dtype), (0, col))

    hit_stop = live & jnp.any(sel.tokens[:, None] == stop_ids, axis=-1)
    out = s.out._replace(
        tokens=put(s.out.tokens, tok),
        logprobs=put(s.out.logprobs, jnp.where(live, sel.logprobs, 0.0)),
        raw_logprobs=put(s.out.raw_logprobs, jnp.where(live, sel.raw_logprobs, 0.0)),
        lengths=jnp.where(live, col + 1, s.out.lengths),
        stopped=s.out.stopped | hit_stop,
        steps=col + 1,
    )
    done = s.done | hit_stop | (col + 1 >= settings.max_new_tokens)
    return tok, s._replace(done=done, out=out)


def start(model, pre: Prefilled, settings: DecodeSettings) -> _Loop:
    """The loop's first state: all that grows with K before decoding (logits copy, branch slots)."""
    k, new = settings.num_branches, settings.max_new_tokens
    n = pre.logits.shape[0] * k
    # The K branches of a prompt start from its logits; copying them is the first step's work.
    logits = constrain(jnp.repeat(pre.logits, k, axis=0), ("batch", "vocab"))
    zeros = jnp.zeros((n, new), jnp.float32)
    out = Decoded(jnp.full((n, new), settings.pad_id, jnp.int32), zeros, zeros,
                  jnp.zeros((n,), jnp.int32), jnp.zeros((n,), bool), jnp.zeros((), jnp.int32))
    own = init_branch_cache(model, n, new, pre.cache.k.dtype)
    return _Loop(own, logits, jnp.repeat(pre.lengths, k), jnp.zeros((n,), bool), out)


def _decode(graphdef, weights, pre: Prefilled, stop_ids, row_keys, params, settings):
    """Sample max_new tokens (fewer if every row stops) on K branches of each prompt.

    stop_ids [B, S] padded with -1; row_keys [N]. The per-branch cache is
    made here and lives only inside the loop, where XLA updates it in place.
    """
    model = nnx.merge(graphdef, weights)
    k, new = settings.num_branches, settings.max_new_tokens
    stop_ids = jnp.repeat(stop_ids.astype(jnp.int32), k, axis=0)
    state = start(model, pre, settings)

    def unfinished(s: _Loop):
        return (s.out.steps < new) & ~jnp.all(s.done)

    def step(s: _Loop):
        tok, s = _step_select(s, row_keys, stop_ids, params, settings)
        h, own = branch_step(model, tok, s.positions, pre.cache, s.own, k)
        logits = constrain(model.logits(h), ("batch", "vocab"))
        return s._replace(own=own, logits=logits, positions=s.positions + 1)

    return jax.lax.while_loop(unfinished, step, state).out


prefill_jit = jax.jit(_prefill, static_argnames=("graphdef", "cache_dtype"))
decode_jit = jax.jit(_decode, static_argnames=("graphdef", "settings"))


def sampling_params(temperature=1.0) -> SamplingParams:
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return SamplingParams(jnp.float32(temperature))


def run(model, prompt_ids, prompt_mask, stop_ids, row_keys, params: SamplingParams,
        settings: DecodeSettings) -> Decoded:
    """Prefill then decode to the end, on device, with static shapes.

    prompt_ids, prompt_mask [B, P] left-padded (every row's last column is
    real); stop_ids [B, S] int32 padded with -1; row_keys [B*K] PRNG keys.
    One compilation per (B, P, S, settings, model structure).
    """
    graphdef, weights = nnx.split(model)
    pre = prefill_jit(graphdef, weights, prompt_ids, prompt_mask, cache_dtype=settings.cache_dtype)
    return decode_jit(graphdef, weights, pre, stop_ids, row_keys, params, settings=settings)
