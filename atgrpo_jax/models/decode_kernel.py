"""The sampler's decode attention as a Pallas (Triton) kernel: `model.decode_attention="pallas"`.

One new token per row attends to its prompt's keys (shared by the prompt's K branch rows) and to its
own new keys, as `attention.shared_prefix_attention` does with einsums. The einsum form reads every
slot of both caches, masked or not, and XLA runs it as several kernels per layer (scores, softmax,
outputs, for the prompt and the own part). Here each part is one kernel that walks its keys in
blocks with an online softmax (flash decoding: the keys are split across programs, and the
programs' partial results are merged in float32 afterwards), and reads in each split only the
blocks from the first to the last that hold an allowed slot: not the prompt's left padding, not
the own cache's unwritten slots, nor most of a continuous-batching ring that a late row has not
reached yet.

Layout: the caches are [rows, kv_heads, slots, head_dim] (`KVCache`), so one program reads one
row's one kv head as contiguous [block, head_dim] tiles. A prompt's program takes the queries of
all K of its branch rows and their G query heads per kv head, [K*G, head_dim], so the prompt's keys
are read once per prompt, not once per branch. Triton's matmuls need at least 16 rows, so the
queries are padded to 16 (the kernel is bound by reading keys, not by the matmuls).

Runs compiled on GPUs, in Pallas' interpreter on the CPU (the tests: slow, for correctness only);
TPUs have no Triton (`decode_attention="xla"` there). docs/device.md says how to measure it.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from atgrpo_jax.sharding import logical_spec, target_platform

DECODE_ATTENTION = ("xla", "pallas")
LOW = -1e30  # the running max before any key: finite, so exp(LOW - m) is 0, never inf - inf
MIN_ROWS = 16  # Triton's smallest matmul tile
TARGET_PROGRAMS = 512  # split the keys until about this many programs run (several per SM)
# Triton's settings, untuned on a device (tools/triton_preflight.py compiles them for an H100 here)
MAX_BLOCK, NUM_WARPS, NUM_STAGES = 64, 4, 2


def key_block(slots: int) -> int | None:
    """The largest power of two <= MAX_BLOCK (and >= 16) that divides `slots`, or None."""
    return next((b for b in (128, 64, 32, 16) if b <= MAX_BLOCK and slots % b == 0), None)


def supported(head_dim: int, prefix_slots: int, own_slots: int) -> bool:
    """Whether the kernel takes these shapes (Triton tiles are powers of two >= 16)."""
    pow2 = head_dim >= 16 and head_dim & (head_dim - 1) == 0
    return pow2 and key_block(prefix_slots) is not None and key_block(own_slots) is not None


def _splits(programs: int, blocks: int) -> int:
    """Key splits per (row, kv head): enough programs to fill the device, a divisor of `blocks`."""
    want = max(1, -(-TARGET_PROGRAMS // programs))
    return max(d for d in range(1, blocks + 1) if blocks % d == 0 and d <= want)


def _kernel(q_ref, k_ref, v_ref, mask_ref, first_ref, end_ref, o_ref, m_ref, l_ref, *, block: int, scale: float):
    """One (row, kv head, split): queries [M, D] against the split's key blocks first..end-1 (the
    others have no allowed slot and are not read), with an online softmax."""
    q = q_ref[...]
    rows = q.shape[0]

    def step(i, carry):
        o, m, l = carry
        keys = pl.ds(i * block, block)
        s = jnp.dot(q, k_ref[keys, :].T, preferred_element_type=jnp.float32) * scale
        s = jnp.where((mask_ref[keys] != 0)[None, :], s, LOW)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.exp(s - m_new[:, None])
        correction = jnp.exp(m - m_new)
        v = v_ref[keys, :]
        o = o * correction[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return o, m_new, l * correction + jnp.sum(p, axis=1)

    init = (jnp.zeros((rows, q.shape[1]), jnp.float32), jnp.full((rows,), LOW, jnp.float32),
            jnp.zeros((rows,), jnp.float32))
    o, m, l = jax.lax.fori_loop(first_ref[...], end_ref[...], step, init)
    o_ref[...], m_ref[...], l_ref[...] = o, m, l


def live_blocks(mask, splits: int, block: int):
    """Per row and split of mask [X, L]: the first block with an allowed slot and one past the last
    (both 0 if none), as block indices within the split: [X, splits] int32 each."""
    x, slots = mask.shape
    live = jnp.any(mask.reshape(x, splits, slots // (splits * block), block) != 0, axis=-1)
    n = live.shape[-1]
    first = jnp.where(jnp.any(live, axis=-1), jnp.argmax(live, axis=-1), 0)
    end = jnp.where(jnp.any(live, axis=-1), n - jnp.argmax(live[..., ::-1], axis=-1), 0)
    return first.astype(jnp.int32), end.astype(jnp.int32)


def partials(q, k, v, mask, interpret: bool):
    """`_partials` on each device's rows and kv heads (under a mesh of several devices: a kernel
    runs on the arrays it is given, so it runs per device in `shard_map`)."""
    run = functools.partial(_partials, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or mesh.size == 1:
        return run(q, k, v, mask)
    x, kv = q.shape[:2]
    heads = lambda extra: logical_spec(("batch", "kv_heads") + (None,) * extra, (x, kv) + (1,) * extra, mesh)  # noqa: E731
    rows = logical_spec(("batch", None), (x, 1), mesh)
    return jax.shard_map(run, mesh=mesh, in_specs=(heads(2), heads(2), heads(2), rows),
                         out_specs=(heads(3), heads(2), heads(2)), check_vma=False)(q, k, v, mask)


def _partials(q, k, v, mask, interpret: bool):
    """Unnormalized attention of q [X, KV, M, D] over k, v [X, KV, L, D] where mask [X, L] (int32,
    nonzero = allowed), per split of the keys: o [X, KV, S, M, D] float32 (sum of p * v), m, l
    [X, KV, S, M] (the max score and the sum of p). M is padded to 16 rows here."""
    x, kv, rows, d = q.shape
    slots = k.shape[2]
    block = key_block(slots)
    splits = _splits(x * kv, slots // block)
    per_split = slots // splits
    padded = max(MIN_ROWS, 1 << (rows - 1).bit_length())
    q = jnp.pad(q, ((0, 0), (0, 0), (0, padded - rows), (0, 0)))
    out_shape = [jax.ShapeDtypeStruct((x, kv, splits, padded, d), jnp.float32),
                 jax.ShapeDtypeStruct((x, kv, splits, padded), jnp.float32),
                 jax.ShapeDtypeStruct((x, kv, splits, padded), jnp.float32)]
    kwargs = {} if interpret else {"compiler_params": _gpu_params()}
    o, m, l = pl.pallas_call(
        functools.partial(_kernel, block=block, scale=d ** -0.5),
        grid=(x, kv, splits),
        in_specs=[pl.BlockSpec((None, None, padded, d), lambda i, h, j: (i, h, 0, 0)),
                  pl.BlockSpec((None, None, per_split, d), lambda i, h, j: (i, h, j, 0)),
                  pl.BlockSpec((None, None, per_split, d), lambda i, h, j: (i, h, j, 0)),
                  pl.BlockSpec((None, per_split), lambda i, h, j: (i, j)),
                  pl.BlockSpec((None, None), lambda i, h, j: (i, j)),
                  pl.BlockSpec((None, None), lambda i, h, j: (i, j))],
        out_specs=[pl.BlockSpec((None, None, None, padded, d), lambda i, h, j: (i, h, j, 0, 0)),
                   pl.BlockSpec((None, None, None, padded), lambda i, h, j: (i, h, j, 0)),
                   pl.BlockSpec((None, None, None, padded), lambda i, h, j: (i, h, j, 0))],
        out_shape=out_shape, interpret=interpret, name="decode_attention", **kwargs,
    )(q, k, v, mask, *live_blocks(mask, splits, block))
    return o[..., :rows, :], m[..., :rows], l[..., :rows]


def _gpu_params():
    from jax.experimental.pallas import triton as plgpu
    return plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=NUM_STAGES)


def kernel_shared_prefix_attention(q, prefix_k, prefix_v, prefix_valid, own_k, own_v, own_allowed, branches: int,
                                   interpret: bool | None = None):
    """`attention.shared_prefix_attention` for one new token per row (T = 1), same arguments:
    q [N,1,H,D] (N = B*K rows, prompt-major); prefix_k/v [B,KV,P,D]; prefix_valid [B,P];
    own_k/v [N,KV,S,D]; own_allowed [N,1,S]. Returns [N,1,H,D] in the caches' dtype, as the einsums do."""
    n, t, h, d = q.shape
    b, kv = prefix_k.shape[:2]
    g = h // kv
    if t != 1:
        raise ValueError(f"the Pallas decode attention takes one new token per row, got {t}")
    if interpret is None:
        platform = target_platform()
        if platform == "tpu":
            raise ValueError("model.decode_attention='pallas' is a Triton (GPU) kernel; use 'xla' on TPU")
        interpret = platform != "gpu"
    dt = prefix_k.dtype
    q = q.reshape(b, branches, kv, g, d).astype(dt)
    on_prefix = partials(q.transpose(0, 2, 1, 3, 4).reshape(b, kv, branches * g, d), prefix_k, prefix_v,
                         prefix_valid.astype(jnp.int32), interpret)
    # back to one entry per branch row: [B, KV, S, K*G, ...] -> [N, KV, S, G, ...]
    o_p, m_p, l_p = (jnp.moveaxis(x.reshape(b, kv, x.shape[2], branches, g, *x.shape[4:]), 3, 1)
                     .reshape(n, kv, x.shape[2], g, *x.shape[4:]) for x in on_prefix)
    o_o, m_o, l_o = partials(q.reshape(n, kv, g, d), own_k, own_v, own_allowed[:, 0].astype(jnp.int32), interpret)
    o, m, l = (jnp.concatenate(pair, axis=2) for pair in ((o_p, o_o), (m_p, m_o), (l_p, l_o)))
    top = jnp.max(m, axis=2, keepdims=True)
    weight = jnp.exp(m - top)  # [N, KV, S, G]; 0 for a split that saw no allowed key
    total = jnp.maximum(jnp.sum(l * weight, axis=2), jnp.finfo(jnp.float32).tiny)  # a row that sees no key: 0, not NaN
    out = jnp.sum(o * weight[..., None], axis=2) / total[..., None]
    return out.reshape(n, 1, h, d).astype(own_v.dtype)
