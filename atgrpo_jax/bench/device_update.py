"""The update part of `bench device`: the trainer's update of a Qwen3-1.7B-shaped model in
bf16 (float32 master weights and AdamW state, bf16 matmuls) on rows x width tokens, with each
attention backend that runs here, against the same loss in PyTorch on the same device; and
the update's peak device memory against the planner's prediction.

- Ours: `train.update.make_update_fns` (chunked log-probs, clipped token-mean loss, clip 1.0,
  AdamW wd 0.01), jitted with donated state, one compile per backend.
- Where our step goes (first backend): its kernels in a profile (`bench.kernels`), the forward
  pass alone and the optimizer alone; then the step at twice the tokens, keeping the layers'
  elementwise intermediates instead of recomputing them, and with the layers in a rolled loop
  (`Shapes.update_sweep`: `recompute_elementwise` keeps 9 of a layer's 20 sequence-sized
  tensors; the rolled loop zero-fills its stacked activations and slices each layer's weights
  every step); and the compiled step's HLO (`update_hlo.txt.gz`).
- PyTorch: transformers' Qwen3 in float32 under `torch.autocast(bfloat16)` (its default sdpa
  attention), full `log_softmax`, the same loss, `clip_grad_norm_`, fused AdamW.
MFU = useful FLOPs (`bench.train.update_flops`: 6 x params per token plus causal attention) /
step time / the device's datasheet bf16 peak.
"""
from __future__ import annotations

import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.bench.common import timed
from atgrpo_jax.bench.device_parts import Shapes, datasheet_peak, error, torch_device, torch_sync, write_hlo
from atgrpo_jax.bench.kernels import profile_kernels
from atgrpo_jax.bench.train import (bench_optimizer, jax_batch, jax_update, make_batch, old_logprobs, optim_config,
                                    scoring_rows, update_flops)
from atgrpo_jax.bench.torch_baseline import random_hf_model, torch_loss, torch_token_logprobs
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.attention import BACKENDS
from atgrpo_jax.models.qwen3 import layer_unroll
from atgrpo_jax.plan.memory import abstract_mesh, model_params, param_bytes, update_memory
from atgrpo_jax.train.update import TrainState

CHUNK = 512  # the trainer's default log-prob chunk


def backends_here() -> tuple[str, ...]:
    """Attention backends worth timing on this platform (splash needs a TPU, cuDNN a GPU)."""
    fused = {"gpu": ("cudnn",), "tpu": ("splash",)}.get(jax.default_backend(), ())
    return tuple(b for b in (*fused, "xla", "chunked") if b in BACKENDS)


def planned_peak(cfg, rows: int, width: int, backend: str) -> int:
    """The planner's peak of an update step (plan.memory.plan's update_peak) on one device."""
    mesh = abstract_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    params = model_params(cfg)
    resident = param_bytes(params, mesh) * 3  # weights, AdamW's mu and nu
    return resident + update_memory(cfg, mesh, params, rows, width, CHUNK, False, backend,
                                    jax.default_backend())["total"]


def peak_bytes() -> int | None:
    return (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")


def timed_steps(update_fn, state, batch, steps: int):
    """(state, metrics, compile-and-first seconds, [step seconds]) of `steps` steps after the first."""
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        state, m = update_fn(state, batch)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - start)
    return state, m, times[0], times[1:]


def new_update(cfg, chunk: int):
    """(logprobs_fn, update_fn, state) of the trainer's update of a fresh random `cfg` model."""
    model = nnx.jit(lambda: Qwen3(cfg, rngs=nnx.Rngs(0)))()
    return jax_update(model, optim_config(), LossSettings(), chunk)


def ours_timed(shapes: Shapes, record, backend: str) -> None:
    """Only the timing of ours with one backend (`update_BACKEND`), for a part that compares."""
    rows, width = shapes.update_rows
    cfg = get_preset(shapes.preset).replace(param_dtype="float32", compute_dtype="bfloat16", attention=backend)
    data = make_batch(cfg.vocab_size, rows, width)
    peak = datasheet_peak(jax.devices()[0].device_kind)
    try:
        logprobs_fn, update_fn, state = new_update(cfg, CHUNK)
        batch = jax_batch(data, old_logprobs(logprobs_fn, state.params, data))
        state, m, first, times = timed_steps(update_fn, state, batch, shapes.update_steps)
    except Exception as e:
        record(f"update_{backend}", error(e))
        return
    record(f"update_{backend}", {"tokens": rows * width, "compile_and_first_s": first, "step_seconds": times,
                                 "tokens_per_s": rows * width / min(times), "loss": float(m["loss"]),
                                 "mfu": update_flops(cfg, rows, width) / min(times) / peak if peak else None})


def ours(shapes: Shapes, record, backends=None, out_dir: str | None = None) -> None:
    """Time each backend's update (compile first), in an order that lets the process-wide peak
    be read for each: cuDNN / splash (smallest score memory) before the einsum's [B, H, T, T]."""
    rows, width = shapes.update_rows
    base = get_preset(shapes.preset).replace(param_dtype="float32", compute_dtype="bfloat16")
    data = make_batch(base.vocab_size, rows, width)
    flops = update_flops(base, rows, width)
    peak = datasheet_peak(jax.devices()[0].device_kind)
    batch = None
    for backend in backends or backends_here():
        cfg = base.replace(attention=backend)
        state = update_fn = None  # the last backend's state is freed before the next one's is made
        try:
            logprobs_fn, update_fn, state = new_update(cfg, CHUNK)
            if batch is None:  # one batch for every backend
                batch = jax_batch(data, old_logprobs(logprobs_fn, state.params, data))
            state, m, first, times = timed_steps(update_fn, state, batch, shapes.update_steps)
            best = min(times)
            record(f"update_{backend}", {
                "rows": rows, "width": width, "tokens": rows * width, "unroll": layer_unroll(cfg, width),
                "compile_and_first_s": first,
                "step_seconds": times, "tokens_per_s": rows * width / best, "mfu": flops / best / peak if peak else None,
                "loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]), "skipped": float(m["skipped"]),
                "peak_bytes_so_far": peak_bytes(), "planned_peak_bytes": planned_peak(cfg, rows, width, backend)})
        except Exception as e:  # one backend that does not run here must not hide the others
            record(f"update_{backend}", error(e))
            continue
        if backend == (backends or backends_here())[0]:
            try:
                where_time_goes(record, update_fn, logprobs_fn, state, batch, data, best)
            except Exception as e:  # a diagnosis: it must not cost the timings above
                record("update_split", error(e))
            if out_dir:  # the compiled step, for reading off the device
                write_hlo(update_fn, ((state, batch), {}), Path(out_dir) / "update_hlo.txt.gz", record, "update_hlo")
    state = update_fn = None
    sweep(shapes, record, base.replace(attention=(backends or backends_here())[0]), peak)


def sweep_key(chunk: int, rows: int, unroll: int, recompute: bool) -> str:
    return f"{chunk}:{rows}:{unroll}:{'recompute' if recompute else 'keep'}"


def sweep(shapes: Shapes, record, cfg, peak) -> None:
    """The first backend's step at other log-prob chunks, token counts, layer unrolls and
    elementwise recomputation (`Shapes.update_sweep`)."""
    width = shapes.update_rows[1]
    found = {}
    for chunk, rows, unroll, recompute in shapes.update_sweep:
        key = sweep_key(chunk, rows, unroll, recompute)
        state = update_fn = None  # freed before the next variant's are made
        try:
            logprobs_fn, update_fn, state = new_update(
                cfg.replace(sequence_unroll=unroll, recompute_elementwise=recompute), chunk)
            data = make_batch(cfg.vocab_size, rows, width)
            batch = jax_batch(data, old_logprobs(logprobs_fn, state.params, data))
            state, m, first, times = timed_steps(update_fn, state, batch, shapes.update_steps)
            found[key] = {"chunk": chunk, "rows": rows, "unroll": unroll, "recompute": recompute, "tokens": rows * width,
                          "compile_and_first_s": first, "step_seconds": times,
                          "mfu": update_flops(cfg, rows, width) / min(times) / peak if peak else None,
                          "loss": float(m["loss"])}
        except Exception as e:  # one variant that does not fit must not hide the others
            found[key] = error(e)
        record("update_sweep", found)


def where_time_goes(record, update_fn, logprobs_fn, state, batch, data: dict, step_s: float) -> None:
    """Where the first backend's update step goes: its kernels (a profile of one step), the
    forward pass alone (the chunked log-probs of the same rows) and the optimizer alone (the same
    clipping and AdamW on zero gradients, state donated); the rest is the backward pass."""
    box = [state]  # the update donates its state: each call takes the last one's

    def one_step():
        box[0], metrics = update_fn(box[0], batch)
        return metrics
    record("update_profile", profile_kernels(one_step))
    state = box[0]
    rows = scoring_rows(data["tokens"], data["valid"])  # packed once: the timing is the device's
    forward = min(timed(logprobs_fn, state.params, rows, repeats=3, warmup=1))
    tx = bench_optimizer(optim_config())  # the update's own clipping and AdamW

    @functools.partial(jax.jit, donate_argnums=0)
    def optimizer_step(state: TrainState, grads) -> TrainState:
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        return TrainState(optax.apply_updates(state.params, updates), opt_state, state.step + 1)

    grads = jax.tree.map(jnp.zeros_like, state.params)  # an argument: inside, XLA would fold the zeros away
    times = []
    for _ in range(4):  # the first compiles
        start = time.perf_counter()
        state = jax.block_until_ready(optimizer_step(state, grads))
        times.append(time.perf_counter() - start)
    optimizer = min(times[1:])
    record("update_split", {"step_s": step_s, "forward_s": forward, "optimizer_s": optimizer,
                            "backward_and_rest_s": step_s - forward - optimizer})


def pytorch(shapes: Shapes, record) -> None:
    """The same loss in PyTorch on the same device: autocast bf16 over float32 weights."""
    import torch
    rows, width = shapes.update_rows
    cfg = get_preset(shapes.preset)
    dev = torch_device()
    model = random_hf_model(cfg, dev)
    optim = optim_config()
    opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay,
                            fused=dev.type == "cuda")
    data = make_batch(cfg.vocab_size, rows, width)
    t = {k: torch.tensor(v).to(dev) for k, v in data.items()}
    tokens, valid = t["tokens"].long(), t["valid"].long()
    with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
        old = torch_token_logprobs(model(input_ids=tokens, attention_mask=valid).logits, tokens).float()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=tokens, attention_mask=valid).logits
        logp = torch_token_logprobs(logits, tokens)
        loss = torch_loss(LossSettings(), logp, old, t["adv"], t["is_resp"].float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        opt.step()
        return loss

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step()
    times = []
    for _ in range(shapes.update_steps):
        torch_sync()
        start = time.perf_counter()
        loss = step()
        torch_sync()
        times.append(time.perf_counter() - start)
    best = min(times)
    peak = datasheet_peak(jax.devices()[0].device_kind)
    flops = update_flops(cfg, rows, width)
    record("update_pytorch", {"step_seconds": times, "tokens_per_s": rows * width / best,
                              "mfu": flops / best / peak if peak else None, "loss": float(loss),
                              "attention": model.config._attn_implementation,
                              "peak_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else None})


def update(shapes: Shapes, record, out_dir: str | None = None) -> None:
    """PyTorch first (it frees its memory after), so a slow compile on our side cannot cost the
    baseline; JAX's peak-memory figure counts JAX's allocations only."""
    pytorch(shapes, record)  # its model and optimizer are freed when it returns
    if torch_device().type == "cuda":
        import torch
        torch.cuda.empty_cache()  # give the cached blocks back for JAX's allocator
    ours(shapes, record, out_dir=out_dir)
