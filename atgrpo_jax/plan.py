"""Will a training run fit? `python -m atgrpo_jax.plan --config=configs/X.py [--config.k=v ...]`.

Flags: --device=v5p|v4|v5e|v6e|gpu or an accelerator type (v5p-32, v5litepod-8,
v6e-16); --num-devices=N (default: the chips of that slice, or of one host);
--gpu-memory-gb=80 with --device=gpu; --policies=N (default 2 for
policy.sharing=per_role, else 1); --json for a machine-readable plan.

Prints the per-device bytes of parameters, optimizer state, gradients,
update activations (with and without remat) and the sampler's KV cache,
compares the peak with the device's memory, and when it does not fit, the
changes that would help, each re-planned. The numbers come from
`atgrpo_jax.plan_memory`. Exits 0 when the run fits, 1 when it does not, 2 on a bad flag.
"""
from __future__ import annotations

import copy
import sys

from absl import flags

from atgrpo_jax import cli
from atgrpo_jax.models.qwen3 import decodes_per_layer
from atgrpo_jax.plan_devices import GiB, Device, device_platform, parse_device
from atgrpo_jax.plan_memory import Advice, Plan, model_config, plan
from atgrpo_jax.train.config import ConfigError
from atgrpo_jax.train.validate import resolve, validate

EXIT_USAGE = 2
EXIT_DOES_NOT_FIT = 1  # a script (or launch.sh) can stop before it starts a run that cannot fit


def with_overrides(config, overrides: dict):
    """A copy of `config` with dotted keys set (`{"optim.mini_batch_size": 8}`)."""
    c = copy.deepcopy(config)
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split(".")
        for name in parents:
            node = node[name]
        node[leaf] = value
    return c


def _halvings(value: int, floor: int) -> list[int]:
    out = []
    while value // 2 >= floor:
        value //= 2
        out.append(value)
    return out


def hosts_of(device: Device, num_devices: int) -> int:
    """Hosts of a slice: the mesh's data axis must be a multiple of this (see distributed.py)."""
    return max(1, num_devices // device.default_chips) if device.name.startswith("TPU") else 1


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
    if config.mesh.data != hosts:  # on several hosts each keeps a whole copy for sampling
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


def _gib(n: int) -> str:
    return f"{n / GiB:8.2f}"


def _verdict(a: Advice, usable: int) -> str:
    return "fits" if a.fits else f"still {(a.peak - usable) / GiB:.2f} GiB over"


def report(p: Plan) -> str:
    """The plan as a table of GiB per device, the verdict, and the advice."""
    mesh = " ".join(f"{k}={v}" for k, v in p.pool_mesh.items())
    t, s = p.activation_terms, p.sampling_terms
    lines = [
        f"{p.model} ({p.num_params / 1e9:.2f} B parameters) on {p.num_devices} x {p.device} "
        f"({p.hbm_bytes / GiB:.1f} GiB each, {p.usable_bytes / GiB:.1f} GiB usable)",
        f"mesh{' per policy pool' if p.policies > 1 else ''}: {mesh}; "
        f"update mini-batch {p.mini_batch} x {p.seq_len} tokens; attention backend {p.attention} "
        f"(model.attention; models/attention.py)",
        "",
        "GiB per device",
        f"  parameters                  {_gib(p.params)}",
        f"  optimizer state (AdamW)     {_gib(p.optimizer)}",
    ]
    if p.reference:
        lines.append(f"  KL reference weights        {_gib(p.reference)}")
    lines += [
        f"  gradients                   {_gib(p.gradients)}",
        f"  optimizer update tree       {_gib(p.updates)}",
        f"  mini-batch arrays           {_gib(p.batch)}",
        f"  update activations          {_gib(p.activations)}   "
        f"(remat on: {p.activations_remat / GiB:.2f}, off: {p.activations_no_remat / GiB:.2f})",
        f"    saved for backward        {_gib(t['saved_residuals'])}",
        f"    one layer's backward      {_gib(t['layer_backward'])}",
        f"    chunked log-prob head     {_gib(t['logprob_head'])}",
        f"  KV cache (sampling)         {_gib(p.kv_cache)}   (prompts {s['prompt_cache'] / GiB:.2f}, new tokens of "
        f"{s['decode_rows']} rows decoded at once {s['new_token_cache'] / GiB:.2f})",
        f"  sampling working set        {_gib(p.sampling_working)}   "
        f"(prefill attention {s['prefill_attention'] / GiB:.2f}, decode logits {s['decode_logits'] / GiB:.2f}, "
        f"per-layer weights {s['layer_weights'] / GiB:.2f})",
        "",
        f"  update peak                 {_gib(p.update_peak)}",
        f"  sampling peak               {_gib(p.sampling_peak)}",
        f"  peak                        {_gib(p.peak)}   "
        f"= {100 * p.peak / p.usable_bytes:.0f}% of usable memory",
        "",
    ]
    if p.fits:
        lines.append(f"FITS: {(p.usable_bytes - p.peak) / GiB:.2f} GiB to spare per device.")
        without_remat = p.update_peak - p.activations_remat + p.activations_no_remat
        if p.activations == p.activations_remat and max(without_remat, p.sampling_peak) <= p.usable_bytes:
            lines.append("  It also fits without remat (model.remat=False), which is faster.")
    else:
        lines.append(f"DOES NOT FIT: {(p.peak - p.usable_bytes) / GiB:.2f} GiB over per device.")
    if p.advice:
        lines.append("What to change (each alone, re-planned):")
        lines += [f"  - {a.change}: peak {a.peak / GiB:.2f} GiB, {_verdict(a, p.usable_bytes)}" for a in p.advice]
    if p.combined:
        a = p.combined
        flags_ = " ".join(f"--config.{k}={v}" for k, v in a.overrides.items() if k != "num_devices")
        if "num_devices" in a.overrides:
            flags_ += f" --num-devices={a.overrides['num_devices']}"
        lines.append(f"Together: {a.change}: peak {a.peak / GiB:.2f} GiB, {_verdict(a, p.usable_bytes)}")
        lines.append(f"  {flags_.strip()}")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def _flags() -> flags.FlagValues:
    fv = flags.FlagValues()
    flags.DEFINE_string("config", None, "training config file configs/X.py[:ARG]; its keys: --config.KEY=VALUE",
                        flag_values=fv)
    flags.DEFINE_string("device", "v5p", "v4, v5e, v5p, v6e, gpu, or an accelerator type (v5p-32)",
                        flag_values=fv)
    flags.DEFINE_integer("num-devices", None, "devices in the run (default: chips of the slice)",
                         flag_values=fv)
    flags.DEFINE_float("gpu-memory-gb", 80.0, "memory per GPU in GiB (with --device=gpu)", flag_values=fv)
    flags.DEFINE_integer("policies", None, "policy pools (default: 2 for policy.sharing=per_role, else 1)",
                         flag_values=fv)
    flags.DEFINE_boolean("json", False, "print the plan as JSON", flag_values=fv)
    return fv


def main(argv: list[str]) -> int:
    fv = _flags()
    if any(a in ("-h", "--help", "--helpfull") for a in argv[1:]):
        print(__doc__.strip() + "\n\nflags:\n" + fv.get_help())
        return 0
    try:
        overrides, rest = cli.pop_overrides(argv)
        extra = fv(rest)
        if len(extra) > 1:
            raise flags.Error(f"unexpected arguments: {extra[1:]}")
        for name in ("num-devices", "policies"):  # None: the default; 0 is not "the default"
            if fv[name].value is not None and fv[name].value < 1:
                raise cli.UsageError(f"--{name}={fv[name].value}: must be >= 1")
        config = resolve(cli.config_from_args(fv.config, overrides), weights=False)
        device, chips = parse_device(fv.device, fv["gpu-memory-gb"].value)
        num_devices = fv["num-devices"].value or chips
        p = plan(config, device, num_devices, fv.policies)
        hosts = hosts_of(device, num_devices)
        if config.mesh.data % hosts:
            p.notes.append(f"{hosts} hosts: set mesh.data to a multiple of {hosts} (e.g. --config.mesh.data={hosts}) "
                           "so that every host holds a whole copy of each policy to sample with")
        if not p.fits:
            p.advice, p.combined = advise(config, device, num_devices, p.policies, p)
    except (flags.Error, ConfigError, cli.UsageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(p.to_json() if fv.json else report(p))
    return 0 if p.fits else EXIT_DOES_NOT_FIT


if __name__ == "__main__":
    sys.exit(main(sys.argv))
