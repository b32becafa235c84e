"""The decoder in Flax NNX: Qwen3, and the Llama and Qwen2 families (models/model_config.py FAMILIES).

The layers are one stack of weights with a leading `layers` axis, run with
`lax.scan`, so compile time does not grow with depth. Decode steps on GPUs and
TPUs instead run every layer unrolled on per-layer copies (`layer_weights`,
`decodes_per_layer`): inside the decode loop a slice of a stack is a copy at
every step. Every parameter carries its logical axes (`logical_axes` metadata)
for `atgrpo_jax.sharding`.

Numerics follow `transformers`' Qwen3: RMSNorm in float32, q/k RMSNorm over
head_dim before RoPE (rotate-half form), grouped-query attention with softmax
in float32, SwiGLU MLP, no embedding scaling. Llama drops the q/k norms (and may
scale RoPE's frequencies as Llama 3 does); Qwen2 drops them and adds q/k/v biases.
Positions are explicit, so left padding works: a padded slot is masked as a key and
its own output is unused.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from atgrpo_jax.models.model_config import Qwen3Config
from atgrpo_jax.models.strategies import KVCache, cached, causal
from atgrpo_jax.sharding import RULES, constrain, target_platform

# name -> (shape as a function of cfg, logical axes). One place for the layout.
LAYER_PARAMS = {
    "attn_norm": (lambda c: (c.hidden_size,), ("norm",)),
    "wq": (lambda c: (c.hidden_size, c.num_heads, c.head_dim), ("embed", "heads", "head_dim")),
    "wk": (lambda c: (c.hidden_size, c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim")),
    "wv": (lambda c: (c.hidden_size, c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim")),
    "wo": (lambda c: (c.num_heads, c.head_dim, c.hidden_size), ("heads", "head_dim", "embed")),
    "q_norm": (lambda c: (c.head_dim,), ("norm",)),
    "k_norm": (lambda c: (c.head_dim,), ("norm",)),
    "bq": (lambda c: (c.num_heads, c.head_dim), ("heads", "head_dim")),
    "bk": (lambda c: (c.num_kv_heads, c.head_dim), ("kv_heads", "head_dim")),
    "bv": (lambda c: (c.num_kv_heads, c.head_dim), ("kv_heads", "head_dim")),
    "mlp_norm": (lambda c: (c.hidden_size,), ("norm",)),
    "w_gate": (lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp")),
    "w_up": (lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp")),
    "w_down": (lambda c: (c.intermediate_size, c.hidden_size), ("mlp", "embed")),
}
NORMS = ("attn_norm", "q_norm", "k_norm", "mlp_norm")
BIASES = ("bq", "bk", "bv")


def layer_params(cfg: Qwen3Config) -> dict:
    """LAYER_PARAMS of the parameters `cfg`'s family has (q/k norms: Qwen3; q/k/v biases: Qwen2)."""
    absent = (() if cfg.qk_norm else ("q_norm", "k_norm")) + (() if cfg.qkv_bias else BIASES)
    return {name: spec for name, spec in LAYER_PARAMS.items() if name not in absent}


# Weights that get a low-rank adapter, with the number of leading "in" dims.
LORA_TARGETS = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1}


class LoRAParam(nnx.Param):
    """A low-rank adapter weight: trainable while the base Params stay frozen."""


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * x32.astype(x.dtype)


def rope_frequencies(head_dim: int, theta: float, llama3: tuple = ()) -> jax.Array:
    """RoPE's inverse frequencies [head_dim // 2]; with `llama3` = (factor, low_freq_factor,
    high_freq_factor, original context), Llama 3's scaling: wavelengths longer than
    context / low_freq_factor are stretched by `factor`, shorter than context / high_freq_factor kept,
    and those between interpolated linearly in context / wavelength."""
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim // 2, dtype=jnp.float32) * 2.0 / head_dim)
    if not llama3:
        return inv_freq
    factor, low, high, context = llama3
    wavelength = 2 * math.pi / inv_freq
    smooth = jnp.clip((context / wavelength - low) / (high - low), 0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def rope(x: jax.Array, positions: jax.Array, theta: float, llama3: tuple = ()) -> jax.Array:
    """Rotate-half RoPE; x [B, T, heads, head_dim], positions [B, T]."""
    half = x.shape[-1] // 2
    inv_freq = rope_frequencies(x.shape[-1], theta, llama3)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, half]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def project(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [B, T, *in] @ w [*in, *out] -> [B, T, *out] (`in_dims` leading dims of w are
    contracted) as one 2-D matmul: XLA:CPU differentiates the 3-D einsum through slow
    transposing copies (a decoder layer's backward pass ~20% slower). On a CPU a bfloat16 product is
    asked for in float32 and rounded once: XLA:CPU sends that to its AMX kernels (~5x float32's
    speed on a CPU with AMX) and a bfloat16 result to a slow loop."""
    b, t = x.shape[:2]
    n_in = x.ndim - 2
    d_in = math.prod(w.shape[:n_in])
    y = jnp.matmul(x.reshape(b * t, d_in), w.reshape(d_in, -1), preferred_element_type=cpu_accumulation(x))
    return y.astype(x.dtype).reshape(b, t, *w.shape[n_in:])


def cpu_accumulation(x: jax.Array):
    """float32 for a bfloat16 matmul traced for a CPU (XLA:CPU's AMX kernels take only that; see
    `project`), else None: GPUs and TPUs accumulate in float32 anyway, and a float32 product there
    would make the backward pass's cotangents float32 too (twice their memory)."""
    return jnp.float32 if x.dtype == jnp.bfloat16 and target_platform() == "cpu" else None


def decoder_layer(cfg: Qwen3Config, w: dict, h, positions, attend, recompute: bool = False):
    """One pre-norm block. `attend(q [B,T,H,D], k, v [B,T,KV,D]) -> ([B,T,H,D], carry)` is the
    attention over whatever keys apply (the carry: a cache it wrote k, v into, or None).
    Returns the new hidden states and that carry.

    recompute (a differentiated layer with `cfg.recompute_elementwise`, and not `cfg.remat`, which
    recomputes the whole layer anyway): the norms, RoPE
    and SwiGLU run under `jax.checkpoint`, so the backward pass recomputes them from what the
    matmuls need anyway (the layer's input, the q/k/v projections, gate and up) instead of keeping
    their intermediates: the float32 copies the norms make, and four of the MLP's six [T, mlp]
    tensors. The matmuls inside those blocks are not run again (their outputs are not needed by
    the backward pass, so JAX drops them). docs/device.md has what this saves."""
    dt, eps = cfg.dtype, cfg.rms_norm_eps
    block = jax.checkpoint if recompute else (lambda f: f)

    @block
    def normed_projections(h, norm, *ws):
        x = rms_norm(h, norm, eps)
        return tuple(project(x, wi) for wi in ws)

    @block
    def norm_rope(x, norm):
        x = x if norm is None else rms_norm(x, norm, eps)
        return rope(x, positions, cfg.rope_theta, cfg.rope_llama3)

    @block
    def mlp_out(gate, up, w_down):
        mlp = constrain(jax.nn.silu(gate) * up, ("batch", "seq", "mlp"))
        return project(mlp, w_down)

    if "wqkv" in w:  # fused (`fuse_projections`): [B, T, KV, G + 2, D], each kv head's queries, key, value
        (qkv,) = normed_projections(h, w["attn_norm"], w["wqkv"].astype(dt))
        qkv = qkv + w["bqkv"].astype(dt) if "bqkv" in w else qkv
        g = qkv.shape[3] - 2
        q, k, v = qkv[:, :, :, :g].reshape(*qkv.shape[:2], -1, qkv.shape[-1]), qkv[:, :, :, g], qkv[:, :, :, g + 1]
    else:
        q, k, v = normed_projections(h, w["attn_norm"], *(w[name].astype(dt) for name in ("wq", "wk", "wv")))
        if "bq" in w:  # Qwen2's biases
            q, k, v = q + w["bq"].astype(dt), k + w["bk"].astype(dt), v + w["bv"].astype(dt)
    q, k = norm_rope(q, w.get("q_norm")), norm_rope(k, w.get("k_norm"))
    q = constrain(q, ("batch", "seq", "heads", "head_dim"))
    a, carry = attend(q, k, v)
    h = h + project(a, w["wo"].astype(dt))
    h = constrain(h, ("batch", "seq", "embed"))
    if "w_gate_up" in w:  # fused: [B, T, 2, mlp]; an einsum, as `project`'s merge of (2, mlp) would cut mlp's
        # tensor shards apart and gather the weight at every step
        gate_up = jnp.einsum("btd,dkf->btkf", rms_norm(h, w["mlp_norm"], eps), w["w_gate_up"].astype(dt),
                             preferred_element_type=cpu_accumulation(h)).astype(dt)
        gate, up = gate_up[:, :, 0], gate_up[:, :, 1]
    else:
        gate, up = normed_projections(h, w["mlp_norm"], w["w_gate"].astype(dt), w["w_up"].astype(dt))
    h = h + mlp_out(gate, up, w["w_down"].astype(dt))
    return constrain(h, ("batch", "seq", "embed")), carry


FUSED_AXES = {"wqkv": ("embed", "kv_heads", None, "head_dim"), "bqkv": ("kv_heads", None, "head_dim"),
              "w_gate_up": ("embed", None, "mlp")}


def fuse_projections(w: dict, rules: dict = RULES) -> dict:
    """One layer's weights with q, k and v as one matrix [embed, kv_heads, G + 2, head_dim] (each kv
    head's G query heads, then its key and its value) and gate and up as one [embed, 2, mlp]: a
    decode step then runs 4 matmuls per layer, not 7. The layout keeps every head's columns on the
    device that holds the head, so a tensor-sharded model needs no communication to split them.
    Every weight is laid out by `rules` (GATHERED_RULES: whole over fsdp)."""
    w = dict(w)
    wq, wk, wv = w.pop("wq"), w.pop("wk"), w.pop("wv")
    d, kv, hd = wk.shape
    wq = wq.reshape(d, kv, wq.shape[1] // kv, hd)
    w["wqkv"] = jnp.concatenate([wq, wk[:, :, None], wv[:, :, None]], axis=2)
    if "bq" in w:  # Qwen2's biases, in the same order: [kv_heads, G + 2, head_dim]
        bq, bk, bv = w.pop("bq"), w.pop("bk"), w.pop("bv")
        w["bqkv"] = jnp.concatenate([bq.reshape(kv, -1, hd), bk[:, None], bv[:, None]], axis=1)
    w["w_gate_up"] = jnp.stack([w.pop("w_gate"), w.pop("w_up")], axis=1)
    axes = {**{name: axes for name, (_, axes) in LAYER_PARAMS.items()}, **FUSED_AXES}
    return {name: constrain(x, axes[name], rules) for name, x in w.items()}


def layer_unroll(cfg: Qwen3Config, t: int, platform: str | None = None) -> int:
    """Layers per iteration of the layer loop for a call of t tokens per row.

    Auto (decode_unroll 0) unrolls every layer of a one-token decode step on GPUs and TPUs,
    which then reads per-layer weights and caches (`decodes_per_layer`). A rolled step slices
    each layer's weights and cache out of the stacks, and XLA's matmuls read whole buffers, so
    every step copies them (docs/sampler_performance.md; the per-layer step's speed-up on a GPU is in
    docs/device.md), and on a TPU a loop keeps XLA from fetching the next layer's weights during
    this one's work. A CPU keeps the rolled loop in float32: its per-layer step wins with wide layers
    and many rows but loses with many narrow ones, and compiles several times slower. In bfloat16 a
    CPU with AMX runs the matmuls several times faster (float32 accumulation: `project`), so the
    copies dominate and the per-layer step wins (SmolLM2's shape: docs/sampler_performance.md).
    Longer calls (prefill, the update; auto: sequence_unroll 0) unroll every layer on GPUs: the
    rolled update zero-fills its stacked activations and slices each layer's weights at every
    step, so the unrolled update is faster, for a longer compile (docs/device.md has the figures).
    CPUs and TPUs keep one layer per iteration, so compile time stays flat in depth."""
    platform = platform or target_platform()
    if t != 1:
        if cfg.sequence_unroll:
            return min(cfg.sequence_unroll, cfg.num_layers)
        return cfg.num_layers if platform == "gpu" else 1
    if cfg.decode_unroll:
        return min(cfg.decode_unroll, cfg.num_layers)
    if platform == "cpu" and cfg.compute_dtype != "bfloat16":
        return 1
    return cfg.num_layers


def decodes_per_layer(cfg: Qwen3Config, platform: str | None = None) -> bool:
    """Decode steps run every layer unrolled, on per-layer weights (`Qwen3.layer_weights`) and
    caches (`KVCache.per_layer`), each sliced out of its stack once per sampling call."""
    return layer_unroll(cfg, 1, platform) == cfg.num_layers


def _param(rngs: nnx.Rngs, shape, axes, dtype, ones=False) -> nnx.Param:
    value = jnp.ones(shape, dtype) if ones else (0.02 * jax.random.normal(rngs.params(), shape)).astype(dtype)
    return nnx.Param(value, logical_axes=axes)


class Layers(nnx.Module):
    """All decoder layers' weights, stacked on a leading `layers` axis.

    With cfg.lora_rank > 0, each target weight W also has adapters A [L, in, r]
    (random) and B [L, r, out] (zeros), and the layer uses
    W + (lora_alpha / r) * (A @ B) reshaped to W's shape.
    """

    def __init__(self, cfg: Qwen3Config, rngs: nnx.Rngs):
        self.lora_scale = cfg.lora_alpha / cfg.lora_rank if cfg.lora_rank else 0.0
        self.names = tuple(layer_params(cfg))
        for name, (shape_fn, axes) in layer_params(cfg).items():
            shape = (cfg.num_layers, *shape_fn(cfg))
            value = _param(rngs, shape, ("layers", *axes), cfg.weight_dtype, name in NORMS)
            if name in BIASES:
                value.set_value(jnp.zeros(shape, cfg.weight_dtype))
            setattr(self, name, value)
        for name, n_in in (LORA_TARGETS.items() if cfg.lora_rank else ()):
            shape = LAYER_PARAMS[name][0](cfg)
            d_in, d_out = math.prod(shape[:n_in]), math.prod(shape[n_in:])
            a = jax.random.normal(rngs.params(), (cfg.num_layers, d_in, cfg.lora_rank)) / math.sqrt(d_in)
            setattr(self, f"lora_a_{name}", LoRAParam(a.astype(jnp.float32), logical_axes=("layers", None, "lora_rank")))
            setattr(self, f"lora_b_{name}", LoRAParam(jnp.zeros((cfg.num_layers, cfg.lora_rank, d_out)),
                                                      logical_axes=("layers", "lora_rank", None)))

    def weights(self) -> dict[str, jax.Array]:
        w = {name: getattr(self, name)[...] for name in self.names}
        for name in (LORA_TARGETS if self.lora_scale else ()):
            delta = getattr(self, f"lora_a_{name}")[...] @ getattr(self, f"lora_b_{name}")[...]
            w[name] = w[name] + (self.lora_scale * delta).reshape(w[name].shape).astype(w[name].dtype)
        return w


class Qwen3(nnx.Module):
    def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
        self.cfg = cfg
        wd = cfg.weight_dtype
        self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), wd)
        self.layers = Layers(cfg, rngs)
        self.final_norm = _param(rngs, (cfg.hidden_size,), ("norm",), wd, ones=True)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), wd)

    def __call__(self, tokens, positions, mask=None, cache: KVCache | None = None):
        """Logits [B, T, V] float32 of every position, and the updated cache (None without one).
        mask [B, T] bool marks real tokens (default all); with a cache, the T tokens go to slots
        index..index+T-1."""
        mask = jnp.ones(tokens.shape, bool) if mask is None else mask
        h, cache = self.hidden_states(tokens, positions, causal(mask) if cache is None else cached(cache, mask))
        return self.logits(h), cache

    def hidden_states(self, tokens, positions, attention=None, layers=None):
        """Final-normed hidden states [B, T, D], and what the attention strategy returns (the
        updated cache, or None): the one forward pass of every caller (`strategies.py`).

        tokens, positions [B, T] int; attention defaults to causal over all T tokens. layers:
        the per-layer weights (`layer_weights`), run in order with no loop; None: the stacked
        weights under `lax.scan` (`layer_unroll` layers per iteration).
        """
        cfg = self.cfg
        attention = causal(jnp.ones(tokens.shape, bool)) if attention is None else attention
        h = self.embed[...].astype(cfg.dtype)[tokens]
        h = constrain(h, ("batch", "seq", "embed"))

        def body(carry, xs):
            h, kv = carry
            w, i = xs
            h, kv = decoder_layer(cfg, w, h, positions, lambda q, k, v: attention.attend(cfg, i, q, k, v, kv),
                                  recompute=attention.remat and cfg.recompute_elementwise and not cfg.remat)
            return (h, kv), None

        if layers is not None:
            carry = (h, attention.init())
            for i, w in enumerate(layers):
                carry, _ = body(carry, (w, i))
            h, kv = carry
        else:
            body = jax.checkpoint(body) if cfg.remat and attention.remat else body
            xs = (self.layers.weights(), jnp.arange(cfg.num_layers))
            (h, kv), _ = jax.lax.scan(body, (h, attention.init()), xs, unroll=layer_unroll(cfg, tokens.shape[1]))
        return rms_norm(h, self.final_norm[...], cfg.rms_norm_eps), attention.finish(kv, tokens.shape[1])

    def layer_weights(self, rules: dict = RULES) -> tuple[dict[str, jax.Array], ...]:
        """Each layer's weights as arrays of their own (LoRA merged, projections fused:
        `fuse_projections`), laid out by `rules`, for `hidden_states(layers=)`. The decode loop
        takes these, made once per sampling call: a slice of the stacked weights inside the loop is
        a copy of the layer at every step (three weight reads, not one)."""
        w = self.layers.weights()
        return tuple(fuse_projections({name: x[i] for name, x in w.items()}, rules)
                     for i in range(self.cfg.num_layers))

    def head_weight(self) -> jax.Array:
        """The output projection as [D, V] (the embedding's transpose when tied)."""
        return self.embed[...].T if self.cfg.tie_word_embeddings else self.lm_head[...]

    def logits(self, h: jax.Array) -> jax.Array:
        return head_logits(h, self.head_weight().astype(self.cfg.dtype))


def head_logits(h: jax.Array, head: jax.Array) -> jax.Array:
    """Float32 logits of hidden states h [..., D] through an LM head [D, V] (of h's dtype)."""
    return jnp.einsum("...d,dv->...v", h, head, preferred_element_type=jnp.float32)
