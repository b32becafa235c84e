"""Memory measurements for the benchmarks: peak RSS rise over a block, and the
log-prob forward+backward memory of chunked vs full-logits implementations.

Two ways to measure: XLA's compiled temp bytes (JAX only; inputs and outputs
excluded) and the peak RSS rise over the call, sampled every 0.5 ms by a thread
(JAX and PyTorch alike; includes the [D, V] head gradient the call returns).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.algo.logprobs import token_logprobs
from atgrpo_jax.models.model_config import Qwen3Config


@contextlib.contextmanager
def rss_follows_live_buffers():
    """Within the block, glibc serves every allocation >= 64 KiB by mmap (so `free` unmaps
    it) and the heap is trimmed: RSS then follows live buffers instead of what the allocator
    keeps for reuse (also when MALLOC_* variables told it to keep everything). Only for
    memory measurements (it slows allocation); glibc's defaults are restored after.
    Yields False if this is not glibc."""
    import ctypes
    m_trim_threshold, m_mmap_threshold, m_mmap_max, default = -1, -3, -4, 128 * 1024
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = bool(libc.mallopt(m_mmap_threshold, 1 << 16) and libc.mallopt(m_trim_threshold, 0)
                  and libc.mallopt(m_mmap_max, 65536))  # undoes a MALLOC_MMAP_MAX_=0 setting
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        libc, ok = None, False
    try:
        yield ok
    finally:
        if libc is not None:
            libc.mallopt(m_mmap_threshold, default)
            libc.mallopt(m_trim_threshold, default)


class PeakRSS:
    """Peak resident-set rise (bytes) over a `with` block, sampled by a thread."""

    def __init__(self, interval: float = 5e-4):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def _watch(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss() - self.base)
            time.sleep(self.interval)

    def __enter__(self):
        # Buffers of a finished JAX call are freed a few ms after it returns: wait until the
        # RSS stops falling, so the base is not inflated by them.
        self.base = self._rss()
        for _ in range(40):
            time.sleep(0.05)
            now = self._rss()
            if now >= self.base - (1 << 20):
                break
            self.base = now
        self.base = min(self.base, self._rss())
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss() - self.base)


def full_token_logprobs(hidden, head, targets):
    """Log-probs and entropies through the whole [N, V] logits (what we avoid)."""
    logits = jnp.einsum("btd,dv->btv", hidden, head, preferred_element_type=jnp.float32)
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
    return logp, -(jnp.exp(logp_all) * logp_all).sum(-1)


def logprob_grad_fn(logprob_fn):
    """jit of (hidden, head, targets, weights) -> (loss, mean entropy), (d hidden, d head)."""
    def loss(hidden, head, targets, weights):
        logp, ent = logprob_fn(hidden, head, targets)
        return (weights * logp).sum(), ent.mean()
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def logprob_memory(cfg: Qwen3Config, batch: int, seq: int, chunks: list[int]) -> dict:
    """Temp bytes (XLA) and peak RSS rise of the log-prob forward+backward, per implementation:
    ours chunked (one entry per chunk size), a full-logits JAX version, and the PyTorch
    baseline's full log_softmax."""
    import torch
    rng = np.random.RandomState(0)
    shape = (batch, seq - 1)
    hidden = rng.randn(*shape, cfg.hidden_size).astype(np.float32)
    head = (0.02 * rng.randn(cfg.hidden_size, cfg.vocab_size)).astype(np.float32)
    targets = rng.randint(0, cfg.vocab_size, shape).astype(np.int32)
    weights = rng.randn(*shape).astype(np.float32)
    args = [jnp.asarray(x) for x in (hidden, head, targets, weights)]
    impls = {f"jax_chunk_{c}": lambda h, w, y, c=c: token_logprobs(h, w, y, c) for c in chunks}
    impls["jax_full_logits"] = full_token_logprobs
    out = {}
    for name, impl in impls.items():
        fn = logprob_grad_fn(impl)
        temp = fn.lower(*args).compile().memory_analysis().temp_size_in_bytes
        jax.block_until_ready(fn(*args))
        with PeakRSS() as rss:
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            seconds = time.perf_counter() - start
        out[name] = {"xla_temp_bytes": int(temp), "peak_rss_rise_bytes": rss.peak, "seconds": seconds}

    h = torch.tensor(hidden, requires_grad=True)
    w = torch.tensor(head.T.copy(), requires_grad=True)  # torch Linear layout [V, D]
    y, c = torch.tensor(targets, dtype=torch.long), torch.tensor(weights)

    def torch_call():
        h.grad = w.grad = None
        logits = torch.nn.functional.linear(h, w)
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, y[..., None])[..., 0]
        (c * logp).sum().backward()

    torch_call()
    with PeakRSS() as rss:
        start = time.perf_counter()
        torch_call()
        seconds = time.perf_counter() - start
    out["torch_full_logits"] = {"peak_rss_rise_bytes": rss.peak, "seconds": seconds}
    return out
