"""What to change when a run does not fit: single changes to the config, each re-planned, and a
greedy combination of them that fits (`python -m atgrpo_jax.plan` prints both)."""
from __future__ import annotations

from atgrpo_jax.models.qwen3 import decodes_per_layer
from atgrpo_jax.plan.devices import Device, device_platform, hosts_of
from atgrpo_jax.plan.planned_model import model_config
from atgrpo_jax.plan.memory import Advice, Plan, plan
from atgrpo_jax.train.config import Config, ConfigError
from atgrpo_jax.train.validate import validate


def with_overrides(config: Config, overrides: dict) -> Config:
    """`config` with dotted keys set (`{"optim.mini_batch_size": 8}`), each section checked anew."""
    for key, value in overrides.items():
        config = config.replace_at(key, value)
    return config


def _halvings(value: int, floor: int) -> list[int]:
    out = []
    while value // 2 >= floor:
        value //= 2
        out.append(value)
    return out


def _candidates(config, device: Device, num_devices: int, policies: int) -> list[tuple[str, dict, int, Plan]]:
    """Single changes to `config` as (label, overrides, devices, plan), each re-planned.

    Numeric knobs are halved until the run fits (the first fitting value is
    kept) or their floor is reached (the value with the lowest peak is kept).
    """
    out = []

    def consider(change: str, steps: list[tuple[dict, int]]):
        best = None
        for overrides, devices in steps:
            try:
                p = plan(validate(with_overrides(config, overrides), weights=False), device, devices, policies)
            except (ConfigError, ValueError):
                continue  # this change cannot work here (e.g. the mesh does not divide)
            if best is None or p.fits or p.peak < best[2].peak:
                best = (overrides, devices, p)
            if p.fits:
                break
        if best:
            overrides, devices, p = best
            label = change.format(value=next(iter(overrides.values()), None), devices=devices)
            out.append((label, overrides, devices, p))

    m, r, o = config.model, config.rollout, config.optim
    if not m.remat:
        consider("enable remat (model.remat=True)", [({"model.remat": True}, num_devices)])
    hosts = hosts_of(device, num_devices)
    if (config.mesh.data or hosts) != hosts:  # on several hosts each keeps a whole copy for sampling
        where = "all chips" if hosts == 1 else "the chips of each host"
        consider(f"shard parameters over {where} (mesh.data={hosts}, mesh.fsdp=-1)",
                 [({"mesh.data": hosts, "mesh.fsdp": -1}, num_devices)])
    if m.compute_dtype == "float32":
        consider("bfloat16 compute and KV cache (model.compute_dtype=bfloat16)",
                 [({"model.compute_dtype": "bfloat16"}, num_devices)])
    consider("loss.logprob_chunk={value}",
             [({"loss.logprob_chunk": v}, num_devices) for v in _halvings(config.loss.logprob_chunk, 128)])
    consider("optim.mini_batch_size={value} (more optimizer steps per rollout)",
             [({"optim.mini_batch_size": v}, num_devices) for v in _halvings(o.mini_batch_size, 1)])
    rows = r.num_tasks * r.k
    consider("rollout.decode_slots={value} (fewer rows decoded at once; continuous batching)",
             [({"rollout.decode_slots": v}, num_devices) for v in _halvings(r.decode_slots or rows, 1)])
    if decodes_per_layer(model_config(config), device_platform(device)) and config.model.decode_gather:
        consider("decode steps gather their weights' shards (model.decode_gather=False: no whole copy, each step "
                 "gathers)", [({"model.decode_gather": False}, num_devices)])
    if decodes_per_layer(model_config(config), device_platform(device)):
        consider("decode steps over the stacked weights (model.decode_unroll=1: no per-layer copy, slower steps)",
                 [({"model.decode_unroll": 1}, num_devices)])
    consider("rollout.num_tasks={value} (fewer tasks sampled at once)",
             [({"rollout.num_tasks": v}, num_devices) for v in _halvings(r.num_tasks, 1)])
    if m.param_dtype == "float32":
        consider("bfloat16 weights (model.param_dtype=bfloat16)", [({"model.param_dtype": "bfloat16"}, num_devices)])
    consider("rollout.max_new_tokens={value}",
             [({"rollout.max_new_tokens": v}, num_devices) for v in _halvings(r.max_new_tokens, 128)])
    consider("rollout.max_prompt_len={value}",
             [({"rollout.max_prompt_len": v}, num_devices) for v in _halvings(r.max_prompt_len, 256)])
    consider("{devices} chips (a larger slice; --num-devices={devices})",
             [({}, num_devices * 2**i) for i in range(1, 7)])
    return out


def advise(config, device: Device, num_devices: int, policies: int, base: Plan,
           max_changes: int = 5) -> tuple[list[Advice], Advice | None]:
    """Single changes that lower the peak (fitting ones first), and a combination that fits.

    The combination is greedy: take the first change (in order of preference:
    remat, mesh, bfloat16 compute, smaller chunks and mini-batches, fewer rows decoded at once,
    decode over stacked weights, fewer tasks,
    bfloat16 weights, shorter sequences, more chips) that makes the run fit,
    else the one with the lowest peak; re-plan; repeat.
    """
    single = [Advice(label, ov | ({"num_devices": d} if d != num_devices else {}), p.peak, p.fits)
              for label, ov, d, p in _candidates(config, device, num_devices, policies) if p.peak < base.peak]
    single.sort(key=lambda a: (not a.fits, a.peak))
    overrides: dict = {}
    devices, labels, current = num_devices, [], base
    for _ in range(max_changes):
        options = _candidates(with_overrides(config, overrides), device, devices, policies)
        options = [o for o in options if o[3].peak < current.peak]
        if not options:
            break
        fitting = [o for o in options if o[3].fits]  # candidates come in order of preference
        label, ov, devices, current = fitting[0] if fitting else min(options, key=lambda o: o[3].peak)
        overrides.update(ov)
        labels.append(label)
        if current.fits:
            break
    combined = None
    if labels:
        combined = Advice(" + ".join(labels), overrides | ({"num_devices": devices} if devices != num_devices else {}),
                          current.peak, current.fits)
    return single, combined
