"""Attention with a backend per platform: one call, `attention(q, k, v, mask, backend)`.

- `xla`: the einsum with a [B, H, T, S] float32 score matrix. Fast for short rows,
  and always used to decode (one query: O(S) already), except the sampler's branch rows with
  `decode_attention="pallas"` (`decode_kernel.py`: one Triton kernel per cache, on GPUs).
- `chunked`: blockwise with an online softmax and an O(T) backward (flash.py), plain JAX,
  any platform: the CPU choice for long rows.
- `splash`: the Pallas TPU splash-attention kernel that ships with JAX, per device under
  `shard_map`. It knows causal masks and segment ids only, so it takes rows without a
  cache that hold one prompt and one response (`optim.share_prompts=False`); elsewhere
  (a prefill into the KV cache) the chunked path runs.
- `cudnn`: `jax.nn.dot_product_attention`'s cuDNN fused kernel (GPU, bf16/fp16) with the
  mask as a dense boolean (1 byte per query-key pair, not 4 + 4 of scores and probs).
- `auto`: TPU chunked (the trainer picks splash where it applies), GPU cudnn in 16-bit
  (else chunked), CPU the einsum up to `DENSE_MAX` queries x keys, chunked above.

All backends give the einsum's result (tests: outputs and gradients within 1e-5 in
float32 with GQA, packed segments and left padding; splash and the dot-product call in
Pallas interpret mode / XLA on CPU, since no TPU or GPU runs here).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from atgrpo_jax.models.flash import chunked_attention
from atgrpo_jax.models.mask import Mask  # noqa: F401  (re-exported: callers build masks here)
from atgrpo_jax.sharding import logical_spec, target_platform

BACKENDS = ("auto", "xla", "chunked", "splash", "cudnn")
DENSE_MAX = 2048 * 2048  # CPU auto: beyond this many query-key pairs per row, go blockwise
SPLASH_ALIGN = 128  # splash blocks are multiples of 128 tokens


def configured_backend(backend: str, platform: str, share_prompts: bool) -> str:
    """The model's backend for a run's config: `auto` on TPU becomes splash when the update's rows
    hold one response each (the kernel's masks express that), else stays for `resolve_backend`."""
    if backend == "auto" and platform == "tpu" and not share_prompts:
        return "splash"
    return backend


def resolve_backend(backend: str, t: int, s: int, dtype, cached: bool, platform: str | None = None) -> str:
    """The backend that runs a [t queries, s keys] attention (static: shapes are known when tracing)."""
    if backend not in BACKENDS:
        raise ValueError(f"model.attention must be one of {BACKENDS}, got {backend!r}")
    if t == 1:
        return "xla"
    platform = platform or target_platform()
    if backend == "auto":
        sixteen_bit = jnp.dtype(dtype).itemsize == 2
        backend = {"tpu": "chunked", "gpu": "cudnn" if sixteen_bit else "chunked"}.get(
            platform, "xla" if t * s <= DENSE_MAX else "chunked")
    if backend == "splash" and cached:
        return "chunked"
    return backend


def attention(q, k, v, mask: Mask, backend: str = "xla", heads_first: bool = False, cached: bool = False,
              block: int = 512):
    """q [B,T,H,D]; k, v [B,S,KV,D] (or [B,KV,S,D] if heads_first); the mask says who sees whom."""
    if heads_first:
        if q.shape[1] == 1:
            return dense_attention(q, k, v, mask.dense(), heads_first=True)
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    backend = resolve_backend(backend, q.shape[1], k.shape[1], q.dtype, cached)
    if backend == "xla":
        return dense_attention(q, k, v, mask.dense())
    if backend == "chunked":
        return chunked_attention(q, k, v, mask, block)
    if backend == "cudnn":
        impl = "cudnn" if target_platform() == "gpu" else None
        return jax.nn.dot_product_attention(q, k, v, mask=mask.dense()[:, None], implementation=impl)
    return splash_attention(q, k, v, mask, interpret=target_platform() != "tpu")


def dense_attention(q, k, v, allowed, heads_first=False):
    """The einsum: q [B,T,H,D]; k, v [B,S,KV,D] (or [B,KV,S,D] if heads_first); allowed [B,T,S]."""
    b, t, h, d = q.shape
    kv = k.shape[1] if heads_first else k.shape[2]
    q = q.reshape(b, t, kv, h // kv, d)
    keys = "bksd" if heads_first else "bskd"
    # Operand order matters on XLA:CPU (keys/values first: 1.2x for the scores, 2-5x for the output, measured)
    scores = jnp.einsum(f"{keys},btkgd->bkgts", k, q, preferred_element_type=jnp.float32)
    scores = scores * (d ** -0.5)
    scores = jnp.where(allowed[:, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum(f"{keys},bkgts->btkgd", v, probs)
    return out.reshape(b, t, h, d)


def shared_prefix_attention(q, prefix_k, prefix_v, prefix_valid, own_k, own_v, own_allowed, branches: int):
    """Attention of K branch rows that share one prompt's keys (the sampler's decode step).

    q [N,T,H,D] with N = B*K rows (prompt-major); prefix_k/v [B,KV,P,D]: prompt b's keys, read
    in place by its K rows, never copied; prefix_valid [B,P]; own_k/v [N,KV,S,D]: each row's
    own new tokens; own_allowed [N,T,S]. One softmax over both. Returns [N,T,H,D]."""
    n, t, h, d = q.shape
    b, kv, p = prefix_k.shape[0], prefix_k.shape[1], prefix_k.shape[2]
    s = own_k.shape[2]
    q = q.reshape(b, branches, t, kv, h // kv, d)
    own_k = own_k.reshape(b, branches, kv, s, d)
    own_v = own_v.reshape(b, branches, kv, s, d)
    scale = d ** -0.5
    low = jnp.finfo(jnp.float32).min
    # keys/values as the first operand: 1.2x (scores) and 6x (outputs) on XLA:CPU, measured
    on_prefix = jnp.einsum("bkpd,bjtkgd->bjkgtp", prefix_k, q, preferred_element_type=jnp.float32) * scale
    on_prefix = jnp.where(prefix_valid[:, None, None, None, None, :], on_prefix, low)
    on_own = jnp.einsum("bjksd,bjtkgd->bjkgts", own_k, q, preferred_element_type=jnp.float32) * scale
    own_allowed = own_allowed.reshape(b, branches, 1, 1, t, s)
    on_own = jnp.where(own_allowed, on_own, low)
    probs = jax.nn.softmax(jnp.concatenate([on_prefix, on_own], axis=-1), axis=-1).astype(own_v.dtype)
    out = (jnp.einsum("bkpd,bjkgtp->bjtkgd", prefix_v, probs[..., :p])
           + jnp.einsum("bjksd,bjkgts->bjtkgd", own_v, probs[..., p:]))
    return out.reshape(n, t, h, d)


def splash_attention(q, k, v, mask: Mask, interpret: bool = False):
    """Splash attention on rows without a cache and with at most one response per row.

    Its masks are static (causal) plus segment ids compared for equality: a real token
    gets id 1, padding id 0, so real queries see real keys causally. Padding queries see
    padding keys (their outputs are never read). Rows are padded to a multiple of 128.
    """
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    b, t, h, d = q.shape
    kv = k.shape[2]
    tp = -(-t // SPLASH_ALIGN) * SPLASH_ALIGN
    block = next(n for n in (512, 256, 128) if tp % n == 0)
    pad = ((0, 0), (0, tp - t), (0, 0), (0, 0))
    q = jnp.pad(q * jnp.asarray(d ** -0.5, q.dtype), pad)  # the kernel does not scale
    k, v = jnp.pad(k, pad), jnp.pad(v, pad)
    ids = jnp.pad(mask.k_valid.astype(jnp.int32), ((0, 0), (0, tp - t)))
    heads = sm.MultiHeadMask([sm.CausalMask((tp, tp)) for _ in range(h // kv)])
    kernel = sk.make_splash_mqa_single_device(heads, block_sizes=sk.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block, block_kv_dkv=block,
        block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block), interpret=interpret)

    def per_device(q, k, v, ids):  # [b, T, KV, G, D], [b, T, KV, D], [b, T]
        one = lambda q1, k1, v1, i1: kernel(q1, k1, v1, segment_ids=sk.SegmentIds(i1, i1))  # noqa: E731
        per_kv = jax.vmap(one, in_axes=(0, 0, 0, None))  # over kv heads: [G, T, D] queries per [T, D] key
        out = jax.vmap(per_kv)(q.transpose(0, 2, 3, 1, 4), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), ids)
        return out.transpose(0, 3, 1, 2, 4)

    args = (q.reshape(b, tp, kv, h // kv, d), k, v, ids)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is not None and not mesh.empty and mesh.size > 1:  # the kernel runs per device
        specs = [logical_spec(axes, x.shape, mesh) for axes, x in zip(
            (("batch", None, "kv_heads", None, None), ("batch", None, "kv_heads", None), ("batch", None, "kv_heads", None),
             ("batch", None)), args)]
        per_device = jax.shard_map(per_device, mesh=mesh, in_specs=tuple(specs), out_specs=specs[0],
                                   check_vma=False)
    return per_device(*args)[:, :t].reshape(b, t, h, d)

