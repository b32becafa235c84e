"""Per-device memory of an AT-GRPO run, as reported by `python -m atgrpo_jax.plan`.

Two phases share the chips. Sampling holds the KV cache of num_tasks*k rows;
the update (train/update.py) holds the gradients, the optimizer's update tree
and the activations of one mini-batch. Parameters, the AdamW moments and (with
a KL term) the reference weights stay resident in both. The peak is the
larger phase.

Parameters come from the model itself (`nnx.eval_shape`, each param's
`logical_axes`) and are split with `atgrpo_jax.sharding.logical_spec`, so the
plan follows the model and the rule table rather than a copy of them.

Activations are the buffers XLA keeps for the backward pass of the scanned
layers. Without remat the scan stacks every layer's residuals: per layer two
float32 [B, H, T, T] attention buffers (scores and probabilities) and 20
sequence-sized tensors (6 of width hidden, 4 of q width, 4 of kv width, 6 of
mlp width). With remat only each layer's input is stacked. On top of that
comes the working set of one layer's backward pass or of the chunked log-prob
head, whichever is larger. The working-set factors below were read from XLA's
buffer assignment (float32, CPU); tests/test_plan.py checks the totals against
`compiled.memory_analysis()`. That holds for the einsum backend (`xla`), whose
[B, H, T, T] buffers grow with the square of the sequence length. The blockwise
and fused backends (models/attention.py) keep per layer only each query's
log-sum-exp and work on one [B, H, block, block] tile at a time (chunked) or in
the kernel's on-chip memory (splash, cuDNN; cuDNN also reads a [B, T, T] boolean
mask), so their activations grow linearly in T.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any, Sequence

import jax.numpy as jnp
from jax.sharding import AbstractMesh, AxisType

from atgrpo_jax.algo.logprobs import chunks_per_head_product
from atgrpo_jax.models.model_config import DTYPES, Qwen3Config
from atgrpo_jax.models.qwen3 import (LAYER_PARAMS, LORA_TARGETS, KVCache, decodes_per_layer, layer_params,
                                     layer_unroll)
from atgrpo_jax.plan.planned_model import largest_role, model_config, planned_backend, planned_roles
from atgrpo_jax.plan.devices import Device, device_platform, hosts_of
from atgrpo_jax.sharding import (GATHERED_RULES, MESH_AXES, RULES, TRAIN_RULES, MeshSettings, logical_spec,
                                 pool_sizes)
from atgrpo_jax.models.qwen3 import LoRAParam, Qwen3
from atgrpo_jax.train.batch import length_bucket


# Working sets of the backward pass, in units of one layer's tensors (see docstring).
NO_REMAT_SCORE_BUFFERS = 3.0  # [B, H, T, T] float32 gradients in flight
NO_REMAT_SEQ_FACTOR = 1.0  # times one layer's 20 sequence-sized residuals
REMAT_SCORE_BUFFERS = 2.0  # the recomputed scores and probabilities
REMAT_SEQ_FACTOR = 1.4  # the recomputed residuals plus their gradients in flight
HEADROOM = 0.10  # fraction of memory kept free: estimate error, fragmentation, runtime


def abstract_mesh(sizes: dict[str, int]) -> AbstractMesh:
    return AbstractMesh(tuple(sizes[a] for a in MESH_AXES), MESH_AXES,
                        axis_types=(AxisType.Auto,) * len(MESH_AXES))


def pool_mesh_sizes(mesh: dict, num_devices: int, pools: int, hosts: int = 1) -> dict[str, int]:
    """Mesh sizes of one policy pool, as `sharding.sub_meshes` splits the full mesh."""
    full = MeshSettings(**mesh).resolve(num_devices, hosts)
    return full if pools == 1 else pool_sizes(full, pools, hosts)


def local_bytes(shape: Sequence[int], axes: Sequence[str | None], itemsize: float, mesh,
                rules: dict = RULES) -> int:
    """Bytes of one device's shard of an array with logical `axes`."""
    spec = logical_spec(axes, shape, mesh, rules)
    n = 1
    for dim, entry in zip(shape, spec):
        names = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        n *= dim // math.prod(mesh.shape[a] for a in names)
    return int(n * itemsize)


def _itemsize(dtype: str) -> int:
    return jnp.dtype(DTYPES[dtype]).itemsize


@functools.lru_cache(maxsize=32)
def model_params(cfg: Qwen3Config) -> tuple[tuple[tuple[int, ...], Any, tuple, bool], ...]:
    """(shape, dtype, logical axes, is_adapter) of every parameter, from an abstract model."""
    from flax import nnx


    model = nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0)))
    return tuple((tuple(v.shape), v.dtype, tuple(v.logical_axes), isinstance(v, LoRAParam))
                 for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))


def param_bytes(params, mesh, itemsize: float | None = None, rules: dict = RULES) -> int:
    """Per-device bytes of `params` (their own dtype unless `itemsize` is given), laid out by `rules`."""
    return sum(local_bytes(shape, axes, jnp.dtype(dt).itemsize if itemsize is None else itemsize, mesh, rules)
               for shape, dt, axes, _ in params)


CHUNKED_TILES = 4.0  # [B, H, block, block] float32 tiles alive in the chunked backward (p, dp, ds, scores)


def attention_buffers(cfg: Qwen3Config, mesh, batch: int, queries: int, keys: int, backend: str) -> dict[str, int]:
    """Bytes of one layer's attention: `scores` (kept for the backward: the score matrix, or the
    log-sum-exp of each query), `working` (alive while it runs) and `mask`, for `backend`."""
    h = cfg.num_heads
    full = local_bytes((batch, h, queries, keys), ("batch", "heads", "seq", None), 4, mesh)
    if backend == "xla":
        return {"scores": full, "working": full, "mask": full // 4}
    lse = local_bytes((batch, h, queries), ("batch", "heads", "seq"), 4, mesh)
    if backend == "chunked":
        block = min(cfg.attention_block, queries), min(cfg.attention_block, keys)
        tile = local_bytes((batch, h) + block, ("batch", "heads", None, None), 4, mesh)
        return {"scores": lse, "working": int(CHUNKED_TILES * tile), "mask": 0}
    mask = local_bytes((batch, queries, keys), ("batch", "seq", None), 1, mesh) if backend == "cudnn" else 0
    return {"scores": lse, "working": 0, "mask": mask}


def unrolled_on_gpu(cfg: Qwen3Config, seq: int, platform: str) -> bool:
    """Whether the update runs every layer unrolled on a GPU (`layer_unroll`), which peaks lower."""
    return platform == "gpu" and layer_unroll(cfg, seq, platform) == cfg.num_layers


def update_activations(cfg: Qwen3Config, mesh, batch: int, seq: int, chunk: int,
                       remat: bool, backend: str = "xla") -> dict[str, int]:
    """Per-device bytes of the forward+backward activations over [batch, seq] tokens, by term."""
    act = _itemsize(cfg.compute_dtype)
    d, h, kv, hd, f, v = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                          cfg.intermediate_size, cfg.vocab_size)
    hidden = local_bytes((batch, seq, d), ("batch", "seq", "embed"), act, mesh)
    q = local_bytes((batch, seq, h, hd), ("batch", "seq", "heads", "head_dim"), act, mesh)
    kvs = local_bytes((batch, seq, kv, hd), ("batch", "seq", "kv_heads", "head_dim"), act, mesh)
    mlp = local_bytes((batch, seq, f), ("batch", "seq", "mlp"), act, mesh)
    attn = attention_buffers(cfg, mesh, batch, seq, seq, backend)
    scores, working = attn["scores"], attn["working"]
    seq_sized = 6 * hidden + 4 * q + 4 * kvs + 6 * mlp  # one layer's tensors: the unit of its working set
    # What the backward pass of a layer reads from its forward: with `recompute_elementwise` the layer's
    # input and the MLP's input, q and k before the norms and RoPE and after them (as the attention
    # keeps them), v, the attention's output, gate and up; without it the norms' float32 copies and
    # SwiGLU's intermediates besides (the 20 of `seq_sized`).
    residuals = 2 * hidden + 2 * q + 3 * kvs + 2 * mlp if cfg.recompute_elementwise else seq_sized
    # Under FSDP each layer's weights are gathered for its matmuls.
    no_fsdp = {**RULES, "embed": ()}
    gathered = sum(local_bytes(fn(cfg), axes, act, mesh, no_fsdp) for fn, axes in layer_params(cfg).values())
    gathered = gathered if mesh.shape["fsdp"] > 1 else 0
    if cfg.lora_rank:  # each layer's W + A @ B, and its gradient, in float32 (A, B are replicated)
        gathered += 2 * 4 * sum(math.prod(LAYER_PARAMS[name][0](cfg)) for name in LORA_TARGETS)
    if remat:
        saved = cfg.num_layers * hidden
        layer = REMAT_SCORE_BUFFERS * working + REMAT_SEQ_FACTOR * seq_sized + gathered
    else:
        saved = cfg.num_layers * ((2 if backend == "xla" else 1) * scores + residuals)
        layer = NO_REMAT_SCORE_BUFFERS * working + NO_REMAT_SEQ_FACTOR * seq_sized + gathered
    # Chunked log-probs: the head's float32 gradient, the logits' gradients of the chunks multiplied
    # into it at once (`chunks_per_head_product`) and one [chunk, V] float32 logits block.
    chunk = min(chunk, batch * seq)
    kept = chunk * chunks_per_head_product(-(-batch * seq // chunk), chunk, d, act)
    head = local_bytes((d, v), ("embed", "vocab"), 4, mesh) + local_bytes((kept, v), (None, "vocab"), act, mesh)
    logits = local_bytes((chunk, v), (None, "vocab"), 4, mesh)
    terms = {
        "saved_residuals": saved,
        "attention_mask": attn["mask"],
        "layer_backward": int(layer),
        "logprob_head": head + logits,
    }
    terms["total"] = saved + terms["attention_mask"] + max(terms["layer_backward"], terms["logprob_head"])
    # A forward pass alone (the old log-probs, train/update.py logprobs_fn): no residuals are kept, so one
    # layer's working set at a time, or the last hidden states beside one float32 logits block.
    terms["forward"] = attn["mask"] + max(working + residuals + gathered, hidden + logits)
    return terms


def update_memory(cfg: Qwen3Config, mesh, trainable, batch: int, width: int, chunk: int,
                  with_ref_logp: bool = False, backend: str = "xla", platform: str = "cpu",
                  rules: dict = RULES) -> dict[str, int]:
    """Per-device bytes that one jitted update (train/update.py) adds to the resident state.

    The mini-batch is [batch, width] rows (tokens, valid, is_resp, old log-probs,
    and reference log-probs with a KL term); the model reads tokens[:, :-1].
    The gradients and the optimizer's `updates` tree are the size of the trainable params (no updates
    tree with every layer unrolled on a GPU, below).
    """
    grads = param_bytes(trainable, mesh, rules=rules)
    acts = update_activations(cfg, mesh, batch, width - 1, chunk, cfg.remat, backend)
    # With every layer unrolled on a GPU, the compiled update holds no second gradient-sized tree at its
    # peak: a fit to compiles for an H100 (tools/gpu_aot.sh; docs/device.md has how close it is), which
    # stays above the compiled peaks.
    updates = 0 if unrolled_on_gpu(cfg, width - 1, platform) else grads
    row_bytes = 4 + 1 + 1 + 4 + (4 if with_ref_logp else 0)
    inputs = local_bytes((batch, width), ("batch", "seq"), row_bytes, mesh)
    return {"gradients": grads, "updates": updates, "activations": acts["total"], "batch": inputs,
            "total": grads + updates + acts["total"] + inputs}


def kv_cache_bytes(cfg: Qwen3Config, mesh, rows: int, length: int, itemsize: int) -> int:
    shape = KVCache.shape(cfg, rows, length)
    return (2 * local_bytes(shape, KVCache.AXES, itemsize, mesh)
            + local_bytes((rows, length), ("batch", "cache_seq"), 1, mesh))


def sampling_memory(cfg: Qwen3Config, mesh, num_tasks: int, k: int, prompt_len: int,
                    new_tokens: int, cache_itemsize: int, backend: str = "xla",
                    decode_slots: int = 0, penalty: bool = False, platform: str | None = None) -> dict[str, int]:
    """KV cache of one sampling call and the working sets of prefill and decode.

    As in sampling/decode.py and segments.py: prefill writes the num_tasks
    prompts' keys and values once; each decoded row owns only the slots of its
    new tokens (a prompt's K branches read its slots in place). With
    decode_slots < num_tasks*k rows (continuous batching) only that many rows
    decode at once, each with its own copy of its prompt's slots. A decode step
    reads one layer's keys and values at a time and turns [rows, V] float32
    logits into tokens; with a repetition penalty each row also keeps a [V] bool set of the ids
    it has seen. Decode steps on per-layer weights and caches (`decodes_per_layer` on `platform`,
    the default on GPU and TPU) hold a per-layer copy of the layer weights for the call and copy
    the prompts' cache once, at the end of prefill; rolled ones copy one layer's keys and values
    out of the stack per layer.
    """
    rows = num_tasks * k
    decoding = min(rows, decode_slots) if decode_slots else rows
    prompt_cache = kv_cache_bytes(cfg, mesh, num_tasks, prompt_len, cache_itemsize)
    own_cache = kv_cache_bytes(cfg, mesh, decoding, new_tokens, cache_itemsize)
    gathered = kv_cache_bytes(cfg, mesh, decoding, prompt_len, cache_itemsize) if decoding < rows else 0
    cache = prompt_cache + own_cache + gathered
    attn = attention_buffers(cfg, mesh, num_tasks, prompt_len, prompt_len, "chunked" if backend == "splash" else backend)
    prefill = 2 * attn["working"] + attn["mask"]
    logits = 3 * local_bytes((decoding, cfg.vocab_size), ("batch", "vocab"), 4, mesh)  # logits + selection
    if penalty:  # the rows' seen-id sets, and the prompts' from prefill
        logits += local_bytes((decoding + num_tasks, cfg.vocab_size), ("batch", "vocab"), 1, mesh)
    per_layer = decodes_per_layer(cfg, platform)
    if per_layer:  # the per-layer weights and the LM head of sampling/decode.py's DecodeWeights
        layer_kv = 0
        rules = GATHERED_RULES if cfg.decode_gather else RULES
        layer_weights = (param_bytes([p for p in model_params(cfg) if not p[3] and p[2][0] == "layers"], mesh,
                                     rules=rules)
                         + local_bytes((cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"),
                                       _itemsize(cfg.compute_dtype), mesh, rules))
    else:
        layer_kv = cache // cfg.num_layers  # one layer's keys and values, copied out of the stack
        layer_weights = 0
    # Two phases: prefill holds the prompts' cache (twice at its end with per-layer decode steps: the
    # stack it wrote and the per-layer copy it returns) and its attention; decoding holds every cache,
    # the per-layer weights and the logits. Neither holds the other's working set.
    prefill_phase = (2 if per_layer else 1) * prompt_cache + prefill
    decode_phase = cache + layer_weights + layer_kv + logits
    working = max(prefill_phase, decode_phase) - cache
    return {"kv_cache": cache, "prompt_cache": prompt_cache, "new_token_cache": own_cache + gathered,
            "decode_rows": decoding, "prefill_attention": prefill, "decode_layer_kv": layer_kv,
            "decode_logits": logits, "layer_weights": layer_weights, "working": working,
            "prefill_phase": prefill_phase, "decode_phase": decode_phase}


@dataclasses.dataclass(frozen=True)
class Advice:
    change: str
    overrides: dict
    peak: int
    fits: bool


@dataclasses.dataclass
class Plan:
    """Bytes per device (per device of one policy pool when policies have their own pools)."""

    device: str
    hbm_bytes: int
    usable_bytes: int
    num_devices: int
    policies: int
    pool_mesh: dict
    model: str
    attention: str  # the update's attention backend on this device (models/attention.py)
    num_params: int
    mini_batch: int
    seq_len: int
    params: int
    optimizer: int
    reference: int
    gradients: int
    updates: int
    batch: int
    activations: int
    activations_remat: int
    activations_no_remat: int
    activation_terms: dict
    kv_cache: int
    sampling_working: int
    sampling_terms: dict
    update_peak: int
    sampling_peak: int
    logprob_peak: int  # the old log-probs' forward pass over one mini-batch
    peak: int
    fits: bool
    notes: list = dataclasses.field(default_factory=list)
    advice: list = dataclasses.field(default_factory=list)
    combined: Advice | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)


def plan(config, device: Device, num_devices: int, policies: int | None = None) -> Plan:
    """The memory plan of a (validated) training config on `num_devices` of `device`."""

    config, unequal = largest_role(config)
    cfg = model_config(config)
    layout = config.layout(len(planned_roles(config)))
    if policies is None:  # pools: one per agent's model with policy.pools, else all models on one mesh
        policies = layout.pools
    models = (1 if layout.lora else layout.policies) if policies == 1 else 1  # full models on one device's mesh
    sizes = pool_mesh_sizes(config.mesh.to_dict(), num_devices, policies, hosts_of(device, num_devices))
    mesh = abstract_mesh(sizes)
    params = model_params(cfg)
    r, lo = config.rollout, config.loss
    notes = [unequal] if unequal else []
    base = [p for p in params if not p[3]]
    adapters = [p for p in params if p[3]]
    lora = layout.lora
    trainable = adapters if lora else base
    copies = layout.adapter_sets  # adapter sets on the shared base
    # Over several data rows (hosts) a full model's trained state is split over the data axis too, and the
    # sampler gathers a whole copy per row (sharding.TRAIN_RULES, train/policies.py).
    regather = not lora and sizes["data"] > 1
    rules = TRAIN_RULES if regather else RULES
    lower = not lora and config.optim.master_dtype == "float32" and cfg.param_dtype != "float32"
    if lower:
        # float32 masters are trained (AdamW's moments and gradients in float32 too) and the sampler's
        # copy in param_dtype stays cached beside them (train/policies.py)
        trainable = tuple((shape, jnp.float32, axes, adapter) for shape, _, axes, adapter in base)
        notes.append(f"float32 master weights (optim.master_dtype) beside the sampler's {cfg.param_dtype} copy")
    if regather:
        notes.append(f"the trained state is split over all {math.prod(sizes.values())} devices of a pool; the "
                     f"sampler's copy is whole on each of its {sizes['data']} data rows (hosts)")
    p_bytes = models * (param_bytes(trainable, mesh, rules=rules) + copies * param_bytes(adapters, mesh)
                        + (param_bytes(base, mesh) if lower or regather or lora else 0))
    if config.system.staleness:  # train/prefetch.py: the weights the rollouts in flight were made with
        p_bytes += models * copies * config.system.staleness * param_bytes(trainable, mesh, rules=rules)
        notes.append(f"system.staleness={config.system.staleness}: as many copies of each policy's trained "
                     "weights are kept for the rollouts in flight (counted in params)")
    optimizer = models * copies * 2 * param_bytes(trainable, mesh, rules=rules)  # adamw: mu and nu as the params
    reference = models * copies * param_bytes(trainable, mesh, rules=rules) if lo.kl_coef else 0  # the start
    if models > 1:
        notes.append(f"{models} models (policy.sharing=per_role) on the same {num_devices} devices: each keeps its "
                     "state there (policy.pools=True gives each its own part of the mesh)")
    merged = 0
    if adapters:
        merged = param_bytes(base, mesh)  # the sampler runs W + A @ B, merged into one more copy
        whose = "per agent" if config.policy.routing.per_agent else "shared by the agents"
        notes.append(f"LoRA: {sum(math.prod(p[0]) for p in adapters):,} adapter parameters {whose} "
                     "are trained; the sampler uses a merged copy of the weights")

    # Rows are padded to a power of two times 32 (train/batch.py), so 4096 + 2048 tokens -> 8192.
    width = length_bucket(r.max_prompt_len + config.rollout.longest_response())
    platform = device_platform(device)
    backend = planned_backend(config, cfg, platform, width - 1)
    upd = update_memory(cfg, mesh, trainable, config.optim.mini_batch_size, width, lo.logprob_chunk,
                        bool(lo.kl_coef), backend, platform, rules)
    acts = {remat: update_activations(cfg.replace(remat=remat), mesh, config.optim.mini_batch_size, width - 1,
                                      lo.logprob_chunk, remat, backend) for remat in (False, True)}
    sampling = sampling_memory(cfg, mesh, r.num_tasks, r.k, r.max_prompt_len, config.rollout.longest_response(),
                               _itemsize(cfg.compute_dtype), backend, r.decode_slots,  # the cache: compute dtype
                               penalty=r.repetition_penalty != 1 or any(
                                   a.get("repetition_penalty", 1) != 1 for a in r.agents.values()), platform=platform)
    resident = p_bytes + optimizer + reference
    update_peak = resident + upd["total"]
    logprob_peak = resident + upd["batch"] + acts[cfg.remat]["forward"]
    sampling_peak = resident + merged + sampling["kv_cache"] + sampling["working"]
    peak = max(update_peak, sampling_peak)
    usable = int(device.hbm_bytes * (1 - HEADROOM))
    if policies > 1:
        notes.append(f"{policies} policies, each on its own pool of {num_devices // policies} devices; "
                     "numbers are per device of one pool")
    if device.name.startswith("GPU"):
        notes.append("JAX preallocates 75% of GPU memory by default; "
                     "set XLA_PYTHON_CLIENT_MEM_FRACTION=.95 to use the rest")
    return Plan(
        device=device.name, hbm_bytes=device.hbm_bytes, usable_bytes=usable, num_devices=num_devices,
        policies=policies, pool_mesh=sizes, model=config.model.hf_path or config.model.preset, attention=backend,
        num_params=cfg.num_params(), mini_batch=config.optim.mini_batch_size, seq_len=width,
        params=p_bytes, optimizer=optimizer, reference=reference, gradients=upd["gradients"],
        updates=upd["updates"], batch=upd["batch"],
        activations=upd["activations"], activations_remat=acts[True]["total"],
        activations_no_remat=acts[False]["total"], activation_terms=acts[cfg.remat],
        kv_cache=sampling["kv_cache"], sampling_working=sampling["working"] + merged, sampling_terms=sampling,
        update_peak=update_peak, sampling_peak=sampling_peak, logprob_peak=logprob_peak, peak=peak, fits=peak <= usable, notes=notes)
