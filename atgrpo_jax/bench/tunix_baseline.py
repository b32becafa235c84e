"""Tunix's sampler as an optional baseline of `python -m atgrpo_jax.bench sampler` (`--tunix`).

Install google-tunix 0.1.7 in a venv beside the main environment (its own
requirements would upgrade transformers, tokenizers, safetensors and
huggingface_hub here), with only the modules that `import tunix` needs:

    python -m venv --system-site-packages /tmp/tunixvenv
    /tmp/tunixvenv/bin/pip install --no-deps google-tunix==0.1.7 google-metrax clu tensorboardX \\
        jaxtyping wadler_lindig perfetto pandas pytz tzdata
    HF_HUB_OFFLINE=1 /tmp/tunixvenv/bin/python -m atgrpo_jax.bench sampler \\
        --configs=bench-qwen-like --batch=32 --prompt=128 --new=128 --tunix=on --json

Same weights: Tunix's own loader (`tunix.models.qwen3.params.create_model_from_safe_tensors`)
reads the HF checkpoint the bench writes from our model (`save_pretrained`), and
`check_logits` compares its logits with ours on one prompt before any timing
(an error if they differ by more than 1e-4). Same prompts, same settings:
Tunix's `Sampler.__call__` (its public API) at temperature 1 with top_p 1 and
no top-k (Tunix then draws from the full softmax, as we do), float32 weights,
activations and KV cache, a cache of exactly prompt + new slots,
`max_prompt_length` = the prompt length (no padding), and -1 as both the pad
and the stop id: it is never sampled, so every row makes all `new` tokens
(`run` checks it).

Its API takes strings, so `IdTokenizer` maps a row of ids to the string of its
decimal ids and back, one to one; the prompts' strings are made before timing,
and encoding one is a dict look-up.

What is timed: one whole `Sampler.__call__`, best of `repeats` after one
warm-up call that compiles its jitted prefill and decode loop (later calls
reuse them). That is its host-side set-up (cache and buffers, made eagerly),
the prefill, the `while_loop` decode, copying the tokens to the host and
cutting out each row's new ones, plus the tokenizer adapter, whose share is
timed on its own and reported (`tunix_tokenizer_seconds`: milliseconds).
Tunix's own choices are counted as its cost: its prefill computes the logits
of every prompt position (its Qwen3 has no last-token-only option), its loop
runs `new` decode steps after the prefill, one more than ours (the last one
samples a token past its buffer and drops it), and it draws each token with
`jax.random.categorical` (Gumbel noise over the whole vocabulary).
"""
from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np

from atgrpo_jax.models.model_config import Qwen3Config

NOT_INSTALLED = "tunix: not installed (pip install google-tunix)"
NO_ID = -1  # pad and stop id of Tunix's runs: never sampled, never a prompt token
TUNIX_ROPE_THETA = 1_000_000  # Tunix 0.1.7's Qwen3 attention uses this theta whatever its config says
_import_error: str | None = None


def available() -> bool:
    """Whether Tunix's sampler and Qwen3 model import (the reason why not: `missing_message()`)."""
    global _import_error
    try:
        import tunix.generate.sampler  # noqa: F401
        import tunix.models.qwen3.params  # noqa: F401
    except ImportError as e:
        _import_error = str(e)
        return False
    _import_error = None
    return True


def missing_message() -> str:
    """The not-installed line, with the import error if Tunix is there but does not import."""
    if _import_error and "'tunix'" not in _import_error:
        return f"{NOT_INSTALLED}; import failed: {_import_error}"
    return NOT_INSTALLED


def model_config_kwargs(cfg: Qwen3Config) -> dict:
    """Fields of Tunix's `qwen3.model.ModelConfig` for the architecture `cfg` (pure: no Tunix needed)."""
    if cfg.rope_theta != TUNIX_ROPE_THETA:
        raise ValueError(f"Tunix's Qwen3 applies RoPE with theta {TUNIX_ROPE_THETA:g} whatever its config says; "
                         f"this model has {cfg.rope_theta:g}")
    if cfg.lora_rank:
        raise ValueError("the HF checkpoint holds no LoRA adapters: compare models without them")
    return dict(num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
                hidden_dim=cfg.intermediate_size, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps,
                use_tied_embedding=cfg.tie_word_embeddings, dtype=cfg.dtype, param_dtype=cfg.weight_dtype)


class IdTokenizer:
    """Token ids <-> strings of decimal ids, one to one, with the methods Tunix's adapter asks for.

    `prepare` makes the prompts' strings ahead; `seconds` adds up the time spent in encode/decode."""

    def __init__(self):
        self._ids: dict[str, list[int]] = {}
        self.seconds = 0.0

    def prepare(self, rows) -> list[str]:
        texts = [" ".join(map(str, row)) for row in np.asarray(rows).tolist()]
        self._ids.update((t, [int(x) for x in t.split()]) for t in texts)
        return texts

    def encode(self, text: str, **_) -> list[int]:
        start = time.perf_counter()
        ids = self._ids[text] if text in self._ids else [int(x) for x in text.split()]
        self.seconds += time.perf_counter() - start
        return list(ids)

    def decode(self, ids, **_) -> str:
        start = time.perf_counter()
        text = " ".join(map(str, ids))
        self.seconds += time.perf_counter() - start
        return text

    def bos_id(self):
        return None  # no BOS is prepended

    def eos_id(self) -> int:
        return NO_ID

    def pad_id(self) -> int:
        return NO_ID


def load_model(cfg: Qwen3Config, checkpoint_dir: str):
    """Tunix's Qwen3 with the weights of the HF checkpoint at `checkpoint_dir`, read by Tunix's loader."""
    from tunix.models.qwen3 import model as qwen3_model
    from tunix.models.qwen3 import params as qwen3_params
    config = qwen3_model.ModelConfig(**model_config_kwargs(cfg))
    return qwen3_params.create_model_from_safe_tensors(checkpoint_dir, config, dtype=cfg.weight_dtype)


def check_logits(tunix_model, ours, prompt, atol: float = 1e-4) -> float:
    """Max |logit difference| of the two models over one prompt [P]; a RuntimeError above atol."""
    tokens = jnp.asarray(prompt, jnp.int32)[None]
    positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
    causal = jnp.tril(jnp.ones((1, tokens.shape[1], tokens.shape[1]), bool))
    theirs, _ = tunix_model(tokens, positions, None, causal)
    mine, _ = ours(tokens, positions)
    diff = float(jnp.max(jnp.abs(theirs - mine)))
    if not diff <= atol:
        raise RuntimeError(f"Tunix's model and ours disagree: max |logit difference| {diff:.3g} > {atol:g} "
                           "on one prompt, so they do not hold the same weights (or not the same architecture)")
    return diff


def run(tunix_model, ours, prompts, new: int, repeats: int) -> dict:
    """Best seconds of Tunix's sampler on `tunix_model` making `new` tokens for each row of `prompts`
    [B, P], after a logits check against `ours` and a warm-up call; with the adapter's share and the
    max logit difference."""
    from tunix.generate.sampler import CacheConfig, Sampler
    cfg = ours.cfg
    prompts = np.asarray(prompts, np.int32)
    b, p = prompts.shape
    diff = check_logits(tunix_model, ours, prompts[0])
    tokenizer = IdTokenizer()
    texts = tokenizer.prepare(prompts)
    cache = CacheConfig(cache_size=p + new, num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
                        head_dim=cfg.head_dim)
    sampler = Sampler(tunix_model, tokenizer, cache)

    def call():
        return sampler(texts, max_generation_steps=new, max_prompt_length=p, temperature=1.0, top_p=1.0,
                       top_k=None, eos_tokens=[NO_ID], seed=0, echo=False)

    call()  # warm-up: compiles the prefill and the decode loop
    times, adapter = [], []
    for _ in range(repeats):
        tokenizer.seconds = 0.0
        start = time.perf_counter()
        out = call()  # returns host arrays: nothing left to wait for
        times.append(time.perf_counter() - start)
        adapter.append(tokenizer.seconds)
    lengths = sorted({len(row) for row in out.tokens})
    if len(out.tokens) != b or lengths != [new]:
        raise RuntimeError(f"Tunix's sampler made {lengths} tokens in {len(out.tokens)} rows, not {new} in {b}")
    tokens = np.stack(out.tokens)
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise RuntimeError(f"Tunix's sampler returned ids in [{tokens.min()}, {tokens.max()}], "
                           f"not in [0, {cfg.vocab_size})")
    if not np.array_equal(np.asarray(out.padded_prompt_tokens), prompts):
        raise RuntimeError("Tunix's sampler did not take the prompts as given")
    best = int(np.argmin(times))
    return {"seconds": times[best], "tokenizer_seconds": adapter[best], "logit_max_diff": diff}
