"""Attention backends side by side: memory and time of a forward + backward pass.

`python -m atgrpo_jax.bench attention [--lengths 1024,2048,4096] [--heads 16 --kv-heads 8 --head-dim 128]
 [--block 512] [--backends xla,chunked] [--repeats 3] [--json]`

One packed row (a prompt, then responses to it, as the trainer's update sees it) of
each length goes through the gradient of a weighted sum of one attention layer's
output, for each backend in turn. Memory is XLA's own analysis of the compiled
function (temporary bytes); time is the best of `--repeats` calls. Reported:
each backend's figures and its ratio to the einsum's (`xla`) at the same length.
On this CPU only `xla` and `chunked` run natively (splash needs a TPU, cuDNN a GPU;
their interpret/XLA paths are tested for equality, not timed).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.bench.common import machine_notes, print_json_last, timed
from atgrpo_jax.models.attention import Mask, attention


def packed_segments(t: int, responses: int = 4) -> np.ndarray:
    """[1, t]: a prompt of t/4 tokens, then `responses` equal responses filling the rest."""
    prompt = t // 4
    seg = np.zeros((1, t), np.int32)
    seg[0, prompt:] = 1 + (np.arange(t - prompt) * responses) // (t - prompt)
    return seg


def measure(backend: str, t: int, heads: int, kv_heads: int, head_dim: int, block: int, repeats: int) -> dict:
    ks = jax.random.split(jax.random.key(t), 4)
    q = jax.random.normal(ks[0], (1, t, heads, head_dim))
    k, v = (jax.random.normal(key, (1, t, kv_heads, head_dim)) for key in ks[1:3])
    w = jax.random.normal(ks[3], q.shape)
    seg = jnp.asarray(packed_segments(t))

    def loss(q, k, v, seg):
        return jnp.sum(attention(q, k, v, Mask.packed(seg), backend, block=block) * w)

    fn = jax.jit(jax.grad(loss, (0, 1, 2)))
    compiled = fn.lower(q, k, v, seg).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    seconds = min(timed(compiled, q, k, v, seg, repeats=repeats))
    return {"backend": backend, "length": t, "temp_mib": temp / 2**20, "seconds": seconds}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m atgrpo_jax.bench attention", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="1024,2048,4096", help="comma-separated row lengths")
    p.add_argument("--heads", type=int, default=16, help="query heads (Qwen3-1.7B: 16)")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads (Qwen3: 8)")
    p.add_argument("--head-dim", type=int, default=128, help="head dimension (Qwen3: 128)")
    p.add_argument("--block", type=int, default=512, help="the chunked backend's block")
    p.add_argument("--backends", default="xla,chunked", help="comma-separated; xla is the reference")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per point (best counts)")
    p.add_argument("--json", action="store_true", help="print a JSON line last")
    a = p.parse_args(argv)
    backends = a.backends.split(",")
    if "xla" not in backends:
        p.error("--backends must include xla, the reference the ratios are taken against")
    rows = [measure(b, int(t), a.heads, a.kv_heads, a.head_dim, a.block, a.repeats)
            for t in a.lengths.split(",") for b in backends]
    ref = {r["length"]: r for r in rows if r["backend"] == "xla"}
    print(f"one attention layer, forward + backward, {a.heads} heads / {a.kv_heads} KV heads x {a.head_dim}, "
          f"one packed row; {machine_notes()}")
    print(f"{'length':>7} {'backend':>8} {'temp MiB':>10} {'x einsum':>9} {'seconds':>9} {'x einsum':>9}")
    for r in rows:
        base = ref[r["length"]]
        r["memory_ratio"], r["time_ratio"] = r["temp_mib"] / base["temp_mib"], r["seconds"] / base["seconds"]
        print(f"{r['length']:>7} {r['backend']:>8} {r['temp_mib']:>10.1f} {r['memory_ratio']:>9.3f} "
              f"{r['seconds']:>9.3f} {r['time_ratio']:>9.2f}")
    print_json_last({"rows": rows}, a.json)
    return 0
