"""Will a training run fit? `python -m atgrpo_jax.plan --config=configs/X.py [--config.k=v ...]`.

Flags: --device=v5p|v4|v5e|v6e|gpu or an accelerator type (v5p-32, v5litepod-8,
v6e-16); --num-devices=N (default: the chips of that slice, or of one host);
--gpu-memory-gb=80 with --device=gpu; --policies=N (default: one pool per role of the
workflow with policy.pools, else 1); --json for a machine-readable plan.

--compile=TARGET compiles the step's programs for a TPU topology or a GPU instead
(plan/compile_cli.py) and reports what the compiler says beside the plan.

Prints the per-device bytes of parameters, optimizer state, gradients,
update activations (with and without remat) and the sampler's KV cache,
compares the peak with the device's memory, and when it does not fit, the
changes that would help, each re-planned. The numbers come from
`atgrpo_jax.plan.memory`. Exits 0 when the run fits, 1 when it does not, 2 on a bad flag.
"""
from __future__ import annotations

import json
import sys

from absl import flags

from atgrpo_jax import cli
from atgrpo_jax.plan import compile_cli, costing
from atgrpo_jax.plan.advice import advise
from atgrpo_jax.plan.devices import GiB, hosts_of, parse_device
from atgrpo_jax.plan.gpu_target import GpuCompileUnavailable
from atgrpo_jax.plan.targets import parse_target
from atgrpo_jax.plan.memory import Advice, Plan, plan
from atgrpo_jax.train.config import ConfigError
from atgrpo_jax.train.validate import resolve

EXIT_USAGE = 2
EXIT_DOES_NOT_FIT = 1  # a script (or launch.sh) can stop before it starts a run that cannot fit


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
    flags.DEFINE_integer("policies", None, "policy pools (default: one per role of the workflow with policy.pools, else 1)",
                         flag_values=fv)
    flags.DEFINE_boolean("json", False, "print the plan as JSON", flag_values=fv)
    flags.DEFINE_string("compile", None, "compile the step's programs for a TPU topology (v5p:2x2x1, v5p-32, v6e-8, "
                        "...) or a GPU (h100, h200) on this machine and report what the compiler says",
                        flag_values=fv)
    flags.DEFINE_integer("prompt-tokens", 0, "with --compile: prompt tokens the time model assumes "
                         "(default: half of rollout.max_prompt_len)", flag_values=fv)
    flags.DEFINE_integer("response-tokens", 0, "with --compile: response tokens (decode steps per sampling call) "
                         "the time model assumes (default: half of the longest response budget)", flag_values=fv)
    return fv


def _compile(config, target_name: str, as_json: bool, prompt_tokens: int, response_tokens: int) -> int:
    """--compile: 0 every program fits, 1 one does not or the compiler failed (one line), 2 bad input (one
    line, raised). Progress lines on stderr as each program compiles."""
    target = parse_target(target_name)
    if prompt_tokens < 0 or response_tokens < 0:
        raise cli.UsageError("--prompt-tokens and --response-tokens must be >= 0 (0: the default)")
    assumptions = costing.Assumptions.of(config, prompt_tokens, response_tokens)
    if target.platform == "tpu":
        print(f"compiling the step's programs for {target_name} (each may take minutes on a CPU)", file=sys.stderr)
    try:
        report = compile_cli.compile_step(config, target, assumptions,
                                          progress=lambda line: print(line, file=sys.stderr, flush=True))
    except compile_cli.DoesNotFit as e:
        print(f"DOES NOT FIT on {target_name}: {e}", file=sys.stderr)
        print(what_lowers(config, target), file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    except (compile_cli.CompilerFailed, compile_cli.CompileDied) as e:
        print(f"{'' if isinstance(e, compile_cli.CompilerFailed) else 'error: '}{e}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    print(json.dumps(report) if as_json else compile_cli.text_report(report, config.train.steps))
    if not report["fits"]:
        print(f"DOES NOT FIT on {target_name}: {compile_cli.over_line(report)}", file=sys.stderr)
        print(what_lowers(config, target), file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return 0


def what_lowers(config, target, shown: int = 4) -> str:
    """The planner's single changes that lower the peak most, to try with --compile next (the
    planner's peak is a prediction; the compile after the change is the answer)."""
    device = target.planner_device()
    base = plan(config, device, target.chips)
    single, _ = advise(config, device, target.chips, base.policies, base)
    lines = [f"  - {a.change}: {(base.peak - a.peak) / GiB:.2f} GiB less"
             for a in single[:shown]]  # those the planner thinks fit first
    return "what lowers the peak (the planner's estimate; compile again to confirm):\n" + "\n".join(lines) \
        if lines else "the planner finds no single change that lowers the peak"


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
        if fv.compile:
            return _compile(config, fv.compile, fv.json, fv["prompt-tokens"].value, fv["response-tokens"].value)
        device, chips = parse_device(fv.device, fv["gpu-memory-gb"].value)
        num_devices = fv["num-devices"].value or chips
        p = plan(config, device, num_devices, fv.policies)
        hosts = hosts_of(device, num_devices)
        if config.mesh.data % hosts:
            p.notes.append(f"{hosts} hosts: set mesh.data to a multiple of {hosts} (e.g. --config.mesh.data={hosts}) "
                           "so that every host holds a whole copy of each policy to sample with")
        if not p.fits:
            p.advice, p.combined = advise(config, device, num_devices, p.policies, p)
    except (flags.Error, ConfigError, cli.UsageError, ValueError, GpuCompileUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(p.to_json() if fv.json else report(p))
    return 0 if p.fits else EXIT_DOES_NOT_FIT
