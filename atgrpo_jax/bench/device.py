"""`python -m atgrpo_jax.bench device`: the accelerator check, one command, minutes.

On one GPU (or one TPU host) it measures, each part in its own process with its own time limit
(a part that crashes, runs out of memory or overruns loses only itself; what it measured before
is kept), and writes `device.json` after every part plus a table at the end:
- facts: the device, the versions, its copy bandwidth and a bf16 matmul's rate (the ceilings);
- parity: logits of ours and of transformers in bf16, each against a float32 reference;
- sampler: Qwen3-1.7B-shaped, bf16, B=64 P=512 N=512 against transformers' generate on the same
  device; the decode step against the weight-read floor; then long-tailed lengths;
- update: Qwen3-1.7B at 4 x 1,024 tokens, bf16 with float32 master weights, each attention backend
  that runs here, MFU; the same loss in PyTorch; peak memory against the planner's prediction;
- step: one AT-GRPO step of configs/plan_path_qwen3_1p7b.py (random weights, small B) through the
  trainer's CLI, its time split into sampling, environment and update;
- decode (only when named in --parts): a decode step's cost at 1 and 64 rows, with the layers
  rolled and unrolled, the LM head and the token selection alone;
- paper_step (named): one step of the paper's Plan-Path run at its full width (32 tasks x K=8,
  both agents; 2 turns of 512 tokens, random weights, so every response runs to its budget)
  beside `atgrpo_jax.plan`'s modelled step for this device at the same lengths;
- torch_update (named): the PyTorch update as verl users run it (compiled; packed without padding
  with Liger's fused linear loss) beside the eager one (`bench/torch_verl.py`).
`--tiny` runs every part with small shapes on any machine (seconds each): the test suite does, so
the check cannot rot. docs/device.md gives the exact call on a lent GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from atgrpo_jax.bench import device_parts, device_update
from atgrpo_jax.bench.torch_verl import torch_update
from atgrpo_jax.cli import config_from_args, packaged_config, pop_overrides
from atgrpo_jax.plan import costing
from atgrpo_jax.plan.compile_cli import model_step
from atgrpo_jax.plan.targets import parse_target
from atgrpo_jax.train.validate import resolve

PARTS = ("facts", "parity", "sampler", "update", "step", "decode", "paper_step", "torch_update")
DEFAULT_PARTS = PARTS[:5]  # the others (diagnoses and the larger runs) are asked for by name
# Seconds each part may run on a device (compilation included). On an H100 the six parts took 430 s
# (docs/device.md: sampler 151, update 60 before its sweep was added, decode 87, step 63, parity
# 53); on an H200 facts 4, update 99, decode 122, sampler 154, step 62, parity 42, and on a fresh
# H200 machine (no compilation cache, slow first CUDA start) facts passed 20 s. The update compiles
# its 28 layers unrolled (~17 s a variant). The default five add up to 595 s, under the device
# tool's 600 s per call, so a part that overruns still leaves the others' figures. paper_step took
# 139 s on a warm H200 machine and more than 200 s on a fresh one.
LIMITS = {"facts": 40, "parity": 75, "sampler": 185, "update": 205, "step": 90, "decode": 240,
          "paper_step": 300, "torch_update": 220}
# The update part's figures that are not a backend's timing.
UPDATE_DIAGNOSES = ("update_split", "update_profile", "update_sweep", "update_hlo")
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


# ---------------------------------------------------------------- one part, in a child process

def run_part(name: str, tiny: bool, out: str) -> None:
    """Run one part, writing its figures to `out` (JSON) as each is measured."""
    shapes = device_parts.TINY if tiny else device_parts.REAL
    figures: dict = {}

    def record(key: str, value) -> None:
        figures[key] = value
        Path(out).write_text(json.dumps(figures, default=float))
        print(f"[{name}] {key}: {json.dumps(value, default=float)[:400]}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        if name == "facts":
            device_parts.facts(shapes, record)
        elif name == "parity":
            device_parts.parity(shapes, record, tmp)
        elif name == "sampler":
            device_parts.sampler(shapes, record, tmp, out_dir=str(Path(out).parent))
        elif name == "update":
            device_update.update(shapes, record, out_dir=str(Path(out).parent))
        elif name == "decode":
            device_parts.decode(shapes, record)
        elif name == "torch_update":
            torch_update(shapes, record)
        elif name == "paper_step":
            step(shapes, record, tmp, shapes.paper_step_overrides, "paper_step")
            modelled_step(shapes, record)
        else:
            step(shapes, record, tmp, shapes.step_overrides, "step")


def modelled_step(shapes, record, kind: str | None = None) -> None:
    """`atgrpo_jax.plan`'s modelled step of the paper_step run on this device (plan/costing.py), at
    the lengths the run samples: every response its full budget (random weights never stop), the
    prompts as the trainer pads them (the smallest bucket that holds a Plan-Path prompt)."""
    import jax
    kind = (kind or jax.devices()[0].device_kind).lower()
    name = "h200" if "h200" in kind else "h100" if "h100" in kind else None
    if name is None:
        record("paper_step_modelled", {"error": f"no modelled chip for {kind!r}"})
        return
    overrides, _ = pop_overrides(shapes.paper_step_overrides)
    config = resolve(config_from_args(str(paper_step_config()), overrides), weights=False)
    r = config.rollout
    a = costing.Assumptions(min(r.prompt_buckets), r.max_new_tokens, 1.0 - config.algo.drop_low_mean_frac)
    record("paper_step_modelled", {"target": name, **model_step(config, parse_target(name), a),
                                   "assumptions": dataclasses.asdict(a)})


def paper_step_config() -> Path:
    config = CONFIGS / "plan_path_qwen3_1p7b.py"
    if not config.is_file():  # an installed (not editable) package: its packaged copy
        config = packaged_config("configs/plan_path_qwen3_1p7b.py") or config
    return config


def step(shapes, record, tmp: str, overrides, key: str) -> None:
    """Two steps of the paper's Plan-Path run through the trainer's CLI; the second step's time
    (the first compiles) split into sampling, environment (host work) and update."""
    config = paper_step_config()
    cmd = [sys.executable, "-m", "atgrpo_jax.train", f"--config={config}", f"--workdir={tmp}/run",
           "--config.model.init=random", "--config.train.steps=2", "--config.train.eval_every=0",
           "--config.train.checkpoint_every=0", "--config.train.log_episodes_every=0", *overrides]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the trainer exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in Path(tmp, "run", "metrics.jsonl").read_text().splitlines()]
    m = rows[-1]
    total = m["rollout_s"] + m["update_s"]
    env = m.get("host_busy", 0.0) * total
    record(key, {"command_seconds": time.perf_counter() - start, "step_seconds": total,
                    "sampling_seconds": m["rollout_s"] - env, "environment_seconds": env,
                    "update_seconds": m["update_s"], "rollout_tokens_per_s": m.get("rollout_tokens_per_s"),
                    "first_step_seconds": rows[0]["rollout_s"] + rows[0]["update_s"],
                    "samples": m.get("samples"), "trained_tokens": m.get("tokens_per_s", 0) * m["update_s"],
                    "response_tokens": m.get("rollout_tokens_per_s", 0) * m["rollout_s"],
                    "overrides": list(overrides)})


# ---------------------------------------------------------------- the parent

def child_env() -> dict:
    env = dict(os.environ)
    # JAX and PyTorch share the GPU in one process: JAX must not take 75% of it up front.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # Nor stop at 75% of it: the einsum update at 4k tokens needs ~60 GiB (out of memory on an H100).
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_all(parts, tiny: bool, out_dir: Path, scale: float) -> dict:
    results: dict = {"tiny": tiny, "parts": {}}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in parts:
        limit = LIMITS[name] * scale
        part_file = out_dir / f"part_{name}.json"
        part_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "atgrpo_jax.bench.device", "--part", name, "--results", str(part_file)]
        cmd += ["--tiny"] if tiny else []
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=child_env(), timeout=limit, stdout=sys.stdout, stderr=subprocess.PIPE,
                                  text=True)
            status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode}): " + \
                " | ".join(proc.stderr.strip().splitlines()[-3:])[-600:]
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit:.0f} s"
        figures = json.loads(part_file.read_text()) if part_file.exists() else {}
        results["parts"][name] = {"status": status, "seconds": time.perf_counter() - start, **figures}
        (out_dir / "device.json").write_text(json.dumps(results, indent=1, default=float))
        print(f"== part {name}: {status} in {time.perf_counter() - start:.0f} s", flush=True)
    return results


def _get(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _fmt(x, spec=".3g", scale=1.0, unit=""):
    return "n/a" if x is None else f"{x * scale:{spec}}{unit}"


def table(results: dict) -> str:
    """The figures the issue asks for, one line each (n/a where a part did not get there)."""
    p = results["parts"]
    lines = (_device_lines(p) + _sampler_lines(p) + _update_lines(p) + _kernel_lines(p) + _step_lines(p)
             + _baseline_and_decode_lines(p))
    for name, r in p.items():
        if r["status"] != "ok":
            lines.append(f"part {name}: {r['status']}")
    return "\n".join(lines)


def _device_lines(p: dict) -> list[str]:
    f = p.get("facts", {})
    kind = _get(f, "device", "kind") or "?"
    bw = f.get("copy_bytes_per_s")
    lines = []
    if f.get("device"):
        lines.append(f"device: {kind} ({_get(f, 'device', 'platform')}), jax {_get(f, 'device', 'jax')}; copy "
                     f"{_fmt(bw, '.2f', 1e-12, ' TB/s')}, bf16 matmul "
                     f"{_fmt(f.get('matmul_bf16_flops_per_s'), '.0f', 1e-12)} TFLOP/s (datasheet "
                     f"{_fmt(f.get('datasheet_bf16_flops_per_s'), '.0f', 1e-12)})")
    par = p.get("parity", {}).get("parity", {})
    if par:
        lines.append("parity (rel. L2 / max rel. vs float32 ref): ours bf16 "
                     f"{_fmt(_get(par, 'ours_bf16_vs_f32_ref', 'rel_l2'))} / "
                     f"{_fmt(_get(par, 'ours_bf16_vs_f32_ref', 'max_rel'))}, transformers bf16 "
                     f"{_fmt(_get(par, 'transformers_bf16_vs_f32_ref', 'rel_l2'))} / "
                     f"{_fmt(_get(par, 'transformers_bf16_vs_f32_ref', 'max_rel'))}; ours f32 "
                     f"{_fmt(_get(par, 'ours_f32_vs_f32_ref', 'rel_l2'))}")
    return lines


def _sampler_lines(p: dict) -> list[str]:
    lines, bw = [], p.get("facts", {}).get("copy_bytes_per_s")
    s = p.get("sampler", {})
    fx, tf = s.get("sampler_fixed", {}), s.get("sampler_fixed_transformers", {})
    if fx:
        floor = fx["weight_bytes"] / bw if bw else None
        step = fx.get("decode_step_ms")
        lines.append(f"sampler B={fx['batch']} P={fx['prompt']} N={fx['new']}: ours {_fmt(fx['ours_tokens_per_s'], '.0f')}"
                     f" tok/s, transformers {_fmt(tf.get('tokens_per_s'), '.0f')} tok/s -> "
                     f"{_fmt(tf.get('speedup'), '.2f', unit='x')}; decode step {_fmt(step, '.2f', unit=' ms')} "
                     f"({fx.get('decode_unroll', '?')} layers per loop iteration) vs "
                     f"weight-read floor {_fmt(floor, '.2f', 1e3, ' ms')} "
                     f"({_fmt(step / 1e3 / floor if step and floor else None, '.2f', unit='x')}; with the mean KV "
                     f"cache read {_fmt((fx['weight_bytes'] + fx['mean_cache_bytes_per_step']) / bw if bw else None, '.2f', 1e3, ' ms')})")
    if s.get("decode_hlo"):
        lines.append(f"decode HLO not written: {s['decode_hlo'].get('error')}")
    lt, ltt = s.get("sampler_longtail", {}), s.get("sampler_longtail_transformers", {})
    if lt:
        lines.append(f"long tail (median {lt['median_length']:.0f}): ours {lt['ours_useful_tokens_per_s']:.0f} useful "
                     f"tok/s, {lt['vs_fixed_lengths']:.2f}x of fixed lengths; transformers "
                     f"{_fmt(ltt.get('useful_tokens_per_s'), '.0f')} -> {_fmt(ltt.get('speedup'), '.2f', unit='x')}")
    return lines


def _update_lines(p: dict) -> list[str]:
    lines = []
    u = p.get("update", {})
    for key in sorted(k for k in u if k.startswith("update_") and k not in UPDATE_DIAGNOSES):
        r = u[key]
        if "error" in r:
            lines.append(f"{key}: {r['error']}")
            continue
        extra = ""
        if "planned_peak_bytes" in r and r.get("peak_bytes_so_far"):
            extra = (f", peak so far {r['peak_bytes_so_far'] / 2**30:.1f} GiB vs planned "
                     f"{r['planned_peak_bytes'] / 2**30:.1f} GiB")
        layers = f" ({r['unroll']} layers per loop iteration)" if r.get("unroll") else ""
        lines.append(f"{key}{layers}: {r['tokens_per_s']:.0f} tok/s, MFU {_fmt(r.get('mfu'), '.1%')}{extra}")
    return lines


def _kernel_lines(p: dict) -> list[str]:
    lines, u = [], p.get("update", {})
    d = p.get("decode", {})
    for name, prof in (("update", u.get("update_profile")), ("decode, layers rolled", d.get("profile_rolled")),
                       ("decode, layers unrolled", d.get("profile_unrolled")),
                       ("decode, Pallas attention", d.get("profile_kernel"))):
        if prof and prof.get("error"):
            lines.append(f"kernels, {name}: no profile ({prof['error']})")
        elif prof and prof.get("kernels_per_call"):
            per = prof.get("steps", 1)  # decode: per step
            lines.append(f"kernels, {name}: {prof['kernels_per_call'] / per:.0f} per {'step' if per > 1 else 'call'}, "
                         f"device busy {prof['busy_fraction']:.0%} of their span, copies "
                         f"{prof.get('copy_kernels_per_call', 0) / per:.0f} taking "
                         f"{prof.get('copy_s_per_call', 0) / per * 1e3:.2f} ms; top: " + ", ".join(
                             f"{k['name'][:40]} {k['s_per_call'] / per * 1e3:.2f} ms" for k in prof["top"][:3]))
    if u.get("update_sweep"):
        lines.append("update by (log-prob chunk, tokens, layers per loop iteration, elementwise): " + ", ".join(
            f"{k} {r['error'][:60]}" if "error" in r else
            f"{r['chunk']} x {r['tokens']} x {r['unroll']} x {'recompute' if r.get('recompute') else 'keep'} "
            f"{min(r['step_seconds']) * 1e3:.1f} ms "
            f"(MFU {_fmt(r.get('mfu'), '.1%')}, compile {r['compile_and_first_s']:.0f} s)"
            for k, r in u["update_sweep"].items()))
    if u.get("update_hlo"):
        lines.append(f"update HLO not written: {u['update_hlo'].get('error')}")
    sp = u.get("update_split")
    if sp and sp.get("error"):
        lines.append(f"update step split: {sp['error']}")
    elif sp:
        lines.append(f"update step {sp['step_s'] * 1e3:.1f} ms = forward {sp['forward_s'] * 1e3:.1f} + backward and "
                     f"the rest {sp['backward_and_rest_s'] * 1e3:.1f} + optimizer {sp['optimizer_s'] * 1e3:.1f} ms")
    return lines


def _step_lines(p: dict) -> list[str]:
    lines = []
    st = _get(p, "step", "step")
    if st:
        lines.append(f"AT-GRPO step (2nd): {st['step_seconds']:.1f} s = sampling {st['sampling_seconds']:.1f} + "
                     f"environment {st['environment_seconds']:.1f} + update {st['update_seconds']:.1f} "
                     f"(first step {st['first_step_seconds']:.1f} s)")
    ps, pm = _get(p, "paper_step", "paper_step"), _get(p, "paper_step", "paper_step_modelled")
    if ps:
        model = (f"; modelled for {pm['target']} {pm['total']:.1f} s = sampling {pm['sampling']:.1f} + update "
                 f"{pm['update']:.1f} (measured / modelled {ps['step_seconds'] / pm['total']:.2f}x)"
                 if pm and "error" not in pm else "")
        lines.append(f"paper-width step (2nd): {ps['step_seconds']:.1f} s = sampling {ps['sampling_seconds']:.1f} + "
                     f"environment {ps['environment_seconds']:.1f} + update {ps['update_seconds']:.1f}{model}")
    return lines


def _baseline_and_decode_lines(p: dict) -> list[str]:
    lines, d = [], p.get("decode", {})
    tu = p.get("torch_update", {})
    ours_key = next((k for k in tu if k.startswith("update_")), None)
    for key in ("torch_eager", "torch_compiled", "torch_verl", ours_key):
        r = tu.get(key) if key else None
        if r:
            loss = f", first loss {r['first_loss']:.5f}" if "first_loss" in r else ""
            lines.append(f"update, {key}: " + (r["error"] if "error" in r else
                         f"{r['tokens_per_s']:.0f} tok/s, MFU {_fmt(r.get('mfu'), '.1%')}{loss}, compile and first "
                         f"step {r['compile_and_first_s']:.0f} s"))
    for key, form in (("decode_step_ms_by_rows", "layers rolled"), ("decode_step_ms_by_rows_unrolled", "layers unrolled"),
                      ("decode_step_ms_by_rows_kernel", "layers unrolled, Pallas attention")):
        if d.get(key, {}).get("error"):
            lines.append(f"decode step, {form}: {d[key]['error']}")
        elif d.get(key):
            lines.append(f"decode step by rows, {form}: "
                         + ", ".join(f"{r} rows {ms:.2f} ms" for r, ms in d[key].items()))
    if "kernel_applies" in d and not d["kernel_applies"]:
        lines.append("decode: the Pallas attention does not take these shapes; its form ran the einsum")
    if (ag := d.get("kernel_vs_einsum")) and "error" not in ag:
        lines.append(f"Pallas vs einsum sampling, same draws: {ag['rows_identical']:.0%} of rows identical over "
                     f"{ag['steps']} steps, first difference after {ag['mean_steps_before_first_difference']:.0f} "
                     f"steps on average (fewest {ag['min_steps_before_first_difference']}), largest log-prob gap "
                     f"before it {_fmt(ag.get('max_logprob_gap_before_it'), '.2g')}")
    if d.get("lm_head_ms"):
        lines.append(f"LM head alone {_fmt(d.get('lm_head_ms'), '.2f', unit=' ms')}, selection (t=1) "
                     f"{_fmt(d.get('select_t1_ms'), '.2f', unit=' ms')}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m atgrpo_jax.bench device", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="small shapes: any machine, seconds per part")
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"comma-separated, of {PARTS}")
    parser.add_argument("--out", default="", help="folder for device.json, each part's figures and the compiled "
                        "programs (default: a new runs/bench_device/<date-time>, named when done)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every part's time limit")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # internal: run one part in this process
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        run_part(args.part, args.tiny, args.results)
        return 0
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        parser.error(f"--parts: unknown {unknown}; choose from {PARTS}")
    if args.time_scale <= 0:
        parser.error("--time-scale must be positive")
    out = Path(args.out or os.path.join("runs", "bench_device", time.strftime("%Y%m%d-%H%M%S")))
    results = run_all(parts, args.tiny, out, args.time_scale)
    print(table(results), flush=True)
    print(f"figures in {out}/ (device.json, part_*.json, the compiled programs)", flush=True)
    return 0 if all(r["status"] == "ok" for r in results["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
