"""`generate`: ragged prompts in, NumPy arrays out (bucketing and padding on the host).

Prompts are left-padded to the smallest length bucket that holds the longest
one, so calls whose prompts fall into known buckets reuse the compiled
prefill and decode (also give `batch_buckets` if the number of prompts varies).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.sampling.decode import DecodeSettings, sampling_params
from atgrpo_jax.sampling.segments import run

DEFAULT_BUCKETS = tuple(2 ** i for i in range(4, 15))  # 16 .. 16384
STOP_BUCKET = 4  # stop sets are padded to a multiple of this, so their size rarely recompiles


class Generation(NamedTuple):
    """One row per (prompt, branch), row b*K + k = branch k of prompt b; all NumPy.

    A trainer's sequence is prompt_ids ++ tokens with mask prompt_mask ++ mask:
    no re-tokenization needed.
    """

    tokens: np.ndarray  # [N, max_new] int32; pad_id after each row's end
    mask: np.ndarray  # [N, max_new] bool; True on response tokens incl. the stop token
    lengths: np.ndarray  # [N] int32
    logprobs: np.ndarray  # [N, max_new] float32 under the distribution sampled from; 0 off mask
    raw_logprobs: np.ndarray | None  # [N, max_new] log softmax(logits) of the token, if asked
    stopped: np.ndarray  # [N] bool: ended with a stop token (False: cut at max_new)
    prompt_ids: np.ndarray  # [N, P] int32, left-padded with pad_id, as fed to the model
    prompt_mask: np.ndarray  # [N, P] bool
    num_branches: int
    row_steps: int = 0  # decode work: rows in the batch times steps, summed over segments (finished rows too)


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    fits = [b for b in sorted(buckets) if b >= length]
    if not fits:
        raise ValueError(f"length {length} exceeds the largest bucket {max(buckets)}")
    return fits[0]


def _as_prompt_list(prompts, prompt_lengths) -> list[list[int]]:
    if prompt_lengths is not None:
        ids = np.asarray(prompts)
        lengths = np.asarray(prompt_lengths)
        if ids.ndim != 2 or lengths.shape != ids.shape[:1]:
            raise ValueError(f"a padded prompt array must be [B, P] with lengths [B]; got "
                             f"{ids.shape} and {lengths.shape}")
        return [list(map(int, row[:n])) for row, n in zip(ids, lengths)]
    return [list(map(int, p)) for p in prompts]


def left_pad(prompts: list[list[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), bool)
    for i, p in enumerate(prompts):
        if p:
            ids[i, length - len(p):] = p
            mask[i, length - len(p):] = True
    return ids, mask


def stop_array(stop_ids, num_prompts: int) -> np.ndarray:
    """[B, S] int32 padded with -1 from one shared stop set or one set per prompt."""
    stop_ids = list(stop_ids)
    per_row = bool(stop_ids) and not np.isscalar(stop_ids[0])
    if per_row and len(stop_ids) != num_prompts:
        raise ValueError(f"per-row stop_ids needs {num_prompts} sets, got {len(stop_ids)}")
    sets = [list(map(int, s)) for s in stop_ids] if per_row else [list(map(int, stop_ids))] * num_prompts
    width = max(STOP_BUCKET, -(-max(map(len, sets)) // STOP_BUCKET) * STOP_BUCKET)
    out = np.full((num_prompts, width), -1, np.int32)
    for i, s in enumerate(sets):
        out[i, :len(s)] = s
    return out


@jax.jit
def _fold_rows(key, rows):
    return jax.vmap(lambda r: jax.random.fold_in(key, r))(rows)


def row_keys_for(key, num_rows: int) -> jax.Array:
    """Row r's key: fold_in(key, r). A raw uint32[2] key is accepted too."""
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return _fold_rows(key, np.arange(num_rows, dtype=np.int32))


def budgets_for(max_new_tokens, num_prompts: int) -> np.ndarray:
    """[B] int32 token budgets from one int or one per prompt; each must be >= 1."""
    budget = np.asarray(max_new_tokens)
    if budget.ndim == 0:
        budget = np.full(num_prompts, budget)
    if budget.shape != (num_prompts,) or not np.issubdtype(budget.dtype, np.integer):
        raise ValueError(f"max_new_tokens must be an int or {num_prompts} ints (one per prompt), "
                         f"got {np.asarray(max_new_tokens).tolist()}")
    if (budget < 1).any():
        raise ValueError(f"max_new_tokens must be >= 1, got {budget.min()}")
    return budget.astype(np.int32)


def _checked_prompts(prompt_list: list, vocab: int) -> list:
    """The prompts, each non-empty with ids in [0, vocab), or an error naming the first that is not."""
    if not prompt_list:
        raise ValueError("no prompts")
    for i, p in enumerate(prompt_list):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
    return prompt_list


def _keys_of_rows(key, row_keys, n: int, n_padded: int):
    """[n_padded] PRNG keys: fold_in(key, r) per row, or the given row_keys ([n]; filler rows reuse key 0)."""
    if (key is None) == (row_keys is None):
        raise ValueError("give exactly one of key and row_keys")
    if row_keys is None:
        return row_keys_for(key, n_padded)
    keys = row_keys if jax.dtypes.issubdtype(row_keys.dtype, jax.dtypes.prng_key) else jax.random.wrap_key_data(row_keys)
    if keys.shape != (n,):
        raise ValueError(f"row_keys must hold {n} keys (B*K), got shape {keys.shape}")
    if n_padded > n:  # filler rows' output is dropped
        keys = jnp.concatenate([keys, jnp.repeat(keys[:1], n_padded - n)])
    return keys


@dataclasses.dataclass(frozen=True)
class GenerateSettings:
    """How `generate` samples: the distribution, the branches and the shapes it compiles for.

    temperature 0 is greedy. repetition_penalty (1 = off): vLLM's, the logits of ids in the prompt
    or the response so far divided by it where positive, multiplied where not, before temperature.
    vocab_limit: only ids < vocab_limit are ever sampled (pass the tokenizer's size when the LM head
    has more rows than it has ids, as Qwen3's 151,936 vs 151,669); None or >= the head's size: all.
    raw_logprobs adds temperature-1 log-probs over the whole head. Changing temperature or a penalty
    other than 1 reuses the compiled sampler; the penalty on or off, top_k, top_p, vocab_limit and
    the shapes (bucketed prompt length, batch, max_new_tokens, K) select one.

    segment: steps between drops of finished rows (the live rows move to a smaller batch; see
    segments.py); 0 decodes the whole batch to the end. slots: decode at most this many rows at
    once (continuous batching: the B*K rows start in order as slots free up, every `segment` steps);
    it bounds the cache of new tokens to slots x max_new_tokens and keeps the batch full while long
    rows finish. None: all rows at once. grow_own: the rows' own caches start at 128 slots and
    double as the steps need them (segments.py); False: max_new_tokens slots from the start. The
    result depends on none of these three.
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    repetition_penalty: float = 1.0  # 1 = off
    num_branches: int = 1  # K continuations of each prompt
    pad_id: int = 0
    buckets: tuple[int, ...] = DEFAULT_BUCKETS  # prompt lengths compiled for (left-padded up to one)
    batch_buckets: tuple[int, ...] | None = None  # numbers of prompts compiled for (None: the exact number)
    raw_logprobs: bool = False
    cache_dtype: str | None = None  # None: the model's compute dtype
    top_p_cap: int = 256  # tokens sorted per row at the end of the exact top-p search
    vocab_limit: int | None = None
    segment: int = 16
    slots: int | None = None
    grow_own: bool = True

    def __post_init__(self):
        for name in ("buckets", "batch_buckets"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(int(b) for b in getattr(self, name)))
        if self.segment < 0:
            raise ValueError(f"segment must be >= 0, got {self.segment}")
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"slots must be >= 1 or None, got {self.slots}")


def generate(model, prompts, settings: GenerateSettings | None = None, *, max_new_tokens, key=None, row_keys=None,
             stop_ids=(), prompt_lengths=None, **changes) -> Generation:
    """Sample `settings.num_branches` continuations of each prompt.

    prompts: B sequences of token ids (ragged), or a [B, P] array whose row b
    holds its prompt in the first `prompt_lengths[b]` entries. stop_ids: one
    set for all prompts (ints) or one set per prompt; a row ends after
    emitting one of its stop tokens. max_new_tokens: one budget for all, or
    one per prompt (each row of prompt b produces at most max_new_tokens[b]
    tokens; the outputs have max(max_new_tokens) columns). key: one PRNG key, row r uses
    fold_in(key, r); or row_keys: [B*K] keys, one per output row.
    settings: a `GenerateSettings` (default: its defaults); `changes` replace its fields by name,
    so `generate(model, ids, max_new_tokens=64, key=key, temperature=0.7)` works without one.
    Log-probs are under the distribution sampled from (after the limit, temperature, top-k, top-p).
    """
    s = _with_changes(settings or GenerateSettings(), changes)
    prompt_list = _checked_prompts(_as_prompt_list(prompts, prompt_lengths), model.cfg.vocab_size)
    b, k = len(prompt_list), s.num_branches
    if s.slots is not None and s.segment == 0 and s.slots < b * k:
        raise ValueError(f"slots={s.slots} < {b * k} rows needs segment >= 1 to refill")
    vocab_limit = s.vocab_limit  # >= the head's size: nothing to drop, the same sampler as without a limit
    vocab_limit = int(vocab_limit) if vocab_limit is not None and vocab_limit < model.cfg.vocab_size else None
    budget = budgets_for(max_new_tokens, b)
    max_new_tokens = int(budget.max())
    static = DecodeSettings(max_new_tokens, k, s.top_k, s.top_p, s.top_p_cap, s.pad_id, s.cache_dtype,
                            s.raw_logprobs, vocab_limit, s.repetition_penalty != 1.0)
    params = sampling_params(s.temperature, s.repetition_penalty)
    b_padded = b if s.batch_buckets is None else bucket_for(b, s.batch_buckets)
    n, n_padded = b * k, b_padded * k
    keys = _keys_of_rows(key, row_keys, n, n_padded)
    length = bucket_for(max(map(len, prompt_list)), s.buckets)
    filler = [[s.pad_id]] * (b_padded - b)
    ids, mask = left_pad(prompt_list + filler, length, s.pad_id)
    stops = stop_array(stop_ids, b)
    stops = np.concatenate([stops, np.full((b_padded - b, stops.shape[1]), -1, np.int32)])
    budget = np.concatenate([budget, np.ones(b_padded - b, np.int32)])  # filler prompts: one token
    decoded, row_steps = run(model, ids, mask, stops, keys, params, static, budget, s.segment, slots=s.slots,
                             grow_own=s.grow_own)
    out = jax.device_get({"tokens": decoded.tokens, "lengths": decoded.lengths, "logprobs": decoded.logprobs,
                          "raw": decoded.raw_logprobs, "stopped": decoded.stopped})
    lengths = out["lengths"][:n]
    return Generation(
        tokens=out["tokens"][:n],
        mask=np.arange(max_new_tokens)[None, :] < lengths[:, None],
        lengths=lengths,
        logprobs=out["logprobs"][:n],
        raw_logprobs=out["raw"][:n] if s.raw_logprobs else None,
        stopped=out["stopped"][:n],
        prompt_ids=np.repeat(ids[:b], k, axis=0),
        prompt_mask=np.repeat(mask[:b], k, axis=0),
        num_branches=k,
        row_steps=row_steps,
    )


def _with_changes(settings: GenerateSettings, changes: dict) -> GenerateSettings:
    unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(GenerateSettings)})
    if unknown:
        raise TypeError(f"generate() got {unknown}, which are neither its arguments nor GenerateSettings' fields "
                        f"({', '.join(f.name for f in dataclasses.fields(GenerateSettings))})")
    return dataclasses.replace(settings, **changes) if changes else settings
