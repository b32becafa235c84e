"""`python -m atgrpo_jax.plan --config=CFG --compile=TARGET [--json]`: compile a training step's programs
for a TPU topology or a GPU on this machine (no accelerator needed), and report per program its
memory per chip beside the planner's, its FLOPs, bytes and collectives, and a modelled time.
"""
from __future__ import annotations

import re

from atgrpo_jax.plan import costing
from atgrpo_jax.plan.compiled import COLLECTIVES, Analysis, analyze
from atgrpo_jax.plan.devices import Device
from atgrpo_jax.plan.memory import AGENTS, plan
from atgrpo_jax.plan.programs import Program, step_programs
from atgrpo_jax.plan.targets import GiB, Target
from atgrpo_jax.train.config import sharing

_OOM = re.compile(r"Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class DoesNotFit(Exception):
    """A program the compiler refused for lack of memory."""

    def __init__(self, program: Program, need: int, have: int):
        super().__init__(f"{program.name} of {program.pool} needs {need / GiB:.2f} GiB per chip, "
                         f"more than the chip's {have / GiB:.2f} GiB")
        self.program, self.need, self.have = program, need, have


def _compile(program: Program, hbm: int) -> Analysis:
    """`analyze`, with the TPU compiler's out-of-memory refusal turned into DoesNotFit."""
    try:
        return analyze(program)
    except Exception as e:  # noqa: BLE001  (XlaRuntimeError: RESOURCE_EXHAUSTED, with the sizes in its text)
        m = _OOM.search(str(e))
        if "RESOURCE_EXHAUSTED" not in str(e) or not m:
            raise
        need = float(m.group(1)) * _UNITS[m.group(2)]
        raise DoesNotFit(program, int(need + program.resident), hbm) from None


def planned(config, target: Target) -> dict[str, int]:
    """The planner's per-chip peaks of the sampling and update phases on the target."""
    per_role = sharing(config).per_agent and not sharing(config).lora
    p = plan(config, Device(target.chip.name, target.chip.hbm_bytes, 4), target.chips, AGENTS if per_role else 1)
    return {"sampling": p.sampling_peak, "update": p.update_peak}


def modelled_seconds(a: Analysis, cfg, chip) -> float:
    """Modelled seconds of one run of a program at its compiled shape (costing's model)."""
    p = a.program
    chips = p.mesh.devices.size
    flops_per_s = chip.peak_flops * costing.UPDATE_MFU
    if p.name == "decode segment":  # one decode step: what the cost analysis counts of the loop
        ideal = a.optimal_s if a.optimal_s else max(a.flops / chip.peak_flops, a.bytes_accessed / chip.hbm_bytes_per_s)
        return ideal / costing.DECODE_EFFICIENCY
    passes = 3 if p.name == "update" else 1
    return passes * costing.forward_flops(cfg, p.rows, p.length) / (chips * flops_per_s)


def compile_step(config, target: Target, assumptions: costing.Assumptions, devices=None) -> dict:
    """Every program of a training step compiled for `target`; the report as a dict (the --json object)."""
    steps = step_programs(config, target.devices() if devices is None else devices, target.hosts)
    hbm = target.chip.hbm_bytes
    plans = planned(config, target)
    rows = []
    for program in [p for p in steps.programs if p.reported]:
        a = _compile(program, hbm)
        phase = {"update": "update", "old log-probs": None}.get(program.name, "sampling")  # no plan of its own
        rows.append({
            "name": program.name, "pool": program.pool, "compiled_peak_bytes": a.compiled_peak,
            "program_bytes": a.program_bytes, "resident_bytes": program.resident,
            "planned_peak_bytes": plans.get(phase), "hbm_bytes": hbm, "flops": a.flops,
            "bytes_accessed": a.bytes_accessed, "optimal_seconds": a.optimal_s, "collectives": a.collectives,
            "modelled_s": modelled_seconds(a, steps.cfg, target.chip), "compile_s": round(a.compile_s, 1)})
    decode = {r["pool"]: r["modelled_s"] * costing.DECODE_EFFICIENCY for r in rows if r["name"] == "decode segment"}
    sampler_chips = {p.pool: p.mesh.devices.size for p in steps.programs if p.name == "decode segment"}
    pools = [costing.PoolWork(len(s.agents), sampler_chips[s.name], steps.prompts, decode[s.name], s.mesh.devices.size)
             for s in steps.pools]
    in_parallel = len({id(s.mesh) for s in steps.pools}) == len(steps.pools) > 1
    step = costing.step_time(steps.cfg, config, target.chip, pools, in_parallel, assumptions)
    mesh = dict(zip(steps.mesh.axis_names, steps.mesh.devices.shape))
    return {"target": target.name, "chip": target.chip.name, "chips": target.chips, "hosts": target.hosts,
            "mesh": mesh, "fits": all(r["compiled_peak_bytes"] <= hbm for r in rows), "programs": rows,
            "step_modelled_s": step["total"], "step_modelled": step,
            "run_modelled_hours": step["total"] * config.train.steps / 3600,
            "assumptions": {"prompt_tokens": assumptions.prompt_tokens,
                            "response_tokens": assumptions.response_tokens,
                            "kept_fraction": assumptions.kept_fraction,
                            "update_mfu": costing.UPDATE_MFU, "decode_efficiency": costing.DECODE_EFFICIENCY},
            "notes": steps.notes}


def _short(collectives: dict) -> str:
    names = {"all-gather": "ag", "reduce-scatter": "rs", "all-reduce": "ar", "all-to-all": "a2a",
             "collective-permute": "cp"}
    parts = [f"{names[k]} {collectives[k]['count']} ({collectives[k]['bytes'] / 2**20:.0f} MiB)"
             for k in COLLECTIVES if collectives[k]["count"]]
    return ", ".join(parts) or "none"


def text_report(r: dict, steps: int) -> str:
    mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items())
    lines = [f"{r['target']}: {r['chips']} x {r['chip']} ({r['programs'][0]['hbm_bytes'] / GiB:.1f} GiB each), "
             f"{r['hosts']} host{'s' if r['hosts'] > 1 else ''}; mesh {mesh}", "",
             f"{'program':<16} {'pool':<14} {'peak GiB':>9} {'planned':>8} {'diff':>7} {'TFLOP':>8} {'GB':>8} "
             f"{'model s':>8}  collectives (count, result MiB)"]
    for p in r["programs"]:
        plan = p["planned_peak_bytes"]
        planned = (f"{plan / GiB:8.2f} {100 * (plan / p['compiled_peak_bytes'] - 1):+6.1f}%" if plan else
                   f"{'-':>8} {'-':>7}")
        lines.append(f"{p['name']:<16} {p['pool']:<14} {p['compiled_peak_bytes'] / GiB:9.2f} "
                     f"{planned} {p['flops'] / 1e12:8.2f} "
                     f"{p['bytes_accessed'] / 1e9:8.2f} {p['modelled_s']:8.4f}  {_short(p['collectives'])}")
    s, a = r["step_modelled"], r["assumptions"]
    lines += ["", "peak: the program's arguments, outputs and temporaries (XLA's buffer assignment) plus the state "
              "that stays on the chip beside it; planned: the planner's phase peak (python -m atgrpo_jax.plan).",
              "FLOPs and bytes as XLA counts them (a loop's body once: the decode segment's are one decode step).",
              f"Modelled (a model, not a measurement; atgrpo_jax/plan/costing.py): a step {s['total']:.1f} s "
              f"(sampling {s['sampling']:.1f}, update {s['update']:.1f}); {steps} steps "
              f"{r['run_modelled_hours']:.2f} h. Assumed: prompts of {a['prompt_tokens']} tokens, responses of "
              f"{a['response_tokens']}, {a['kept_fraction']:.0%} of samples kept; update MFU {a['update_mfu']:.1%} "
              f"and decode at {a['decode_efficiency']:.0%} of its floor, as measured on an H200."]
    lines += [f"note: {n}" for n in r["notes"]]
    lines.append("FITS: every program fits." if r["fits"] else f"DOES NOT FIT: {over_line(r)}")
    return "\n".join(lines)


def over_line(r: dict) -> str:
    """The first program that does not fit, its need and the chip's memory ("" if all fit)."""
    over = [p for p in r["programs"] if p["compiled_peak_bytes"] > p["hbm_bytes"]]
    if not over:
        return ""
    p = over[0]
    return (f"{p['name']} of {p['pool']} needs {p['compiled_peak_bytes'] / GiB:.2f} GiB per chip, more than the "
            f"chip's {p['hbm_bytes'] / GiB:.2f} GiB")
