"""`python -m atgrpo_jax.plan --config=CFG --compile=TARGET [--json]`: compile a training step's programs
for a TPU topology or a GPU on this machine (no accelerator needed), and report per program its
memory per chip beside the planner's, its FLOPs, bytes and collectives, and a modelled time.
"""
from __future__ import annotations

import math

from atgrpo_jax.plan import costing
from atgrpo_jax.plan.compiled import COLLECTIVES, Analysis, analyze
from atgrpo_jax.plan.architecture import model_config
from atgrpo_jax.plan.memory import AGENTS, plan
from atgrpo_jax.plan.programs import DoesNotFit, agent_names, step_programs  # noqa: F401  (DoesNotFit: callers)
from atgrpo_jax.plan.targets import GiB, Target
from atgrpo_jax.sharding import MeshConfig, pool_sizes
from atgrpo_jax.train.roles import role_config


def planned(config, target: Target) -> dict[str, int]:
    """The planner's per-chip peaks on the target (python -m atgrpo_jax.plan), by program."""
    pools = AGENTS if config.policy.routing.per_agent and not config.policy.routing.lora and config.policy.pools else 1
    p = plan(config, target.planner_device(), target.chips, pools)
    s = p.sampling_terms
    beside = p.sampling_peak - max(s["prefill_phase"], s["decode_phase"])  # what both sampling phases hold
    return {"prefill": beside + s["prefill_phase"], "decode segment": beside + s["decode_phase"],
            "update": p.update_peak}


def modelled_seconds(a: Analysis, cfg, chip) -> float:
    """Modelled seconds of one run of a program at its compiled shape (costing's model)."""
    p = a.program
    chips = p.mesh.devices.size
    flops_per_s = chip.peak_flops * costing.DENSE_MFU
    if p.name == "decode segment":  # one step with every cache slot of the compiled call
        mesh = dict(zip(p.mesh.axis_names, p.mesh.devices.shape))
        prompts = p.args[3].prefix.valid.shape[0]  # the rows' groups: one per prompt
        return costing.decode_step_seconds(cfg, chip, mesh, prompts, p.length, p.rows, p.args[3].own.slots)
    passes = 3 if p.name == "update" else 1
    return passes * costing.forward_flops(cfg, p.rows, p.length) / (chips * flops_per_s)


def model_step(config, target: Target, assumptions: costing.Assumptions, agents: int = AGENTS) -> dict:
    """The modelled seconds of a training step of `config` on `target` (plan/costing.py; no compile):
    the pools and meshes as train/setup.py lays them out, each host sampling its share of the tasks."""
    layout = config.policy.routing
    pools = agents if layout.per_agent and not layout.lora and config.policy.pools else 1
    full = MeshConfig.from_mapping(config.mesh.to_dict()).resolve(target.chips, target.hosts)
    pool = full if pools == 1 else pool_sizes(full, pools)
    r = config.rollout
    prompts = r.num_tasks // target.hosts * (1 if r.tree else r.k)
    models = agents if layout.per_agent and not layout.lora else 1  # each model learns from its agents only
    roles = agent_names(config)[0] if config.policy.role_models and models > 1 else []
    cfgs = [model_config(role_config(config, name)) for name in roles] if len(roles) == models else [None] * models
    work = [costing.PoolWork(agents // models, dict(pool, data=1), prompts, prompts * (r.k if r.tree else 1),
                             math.prod(pool.values()), cfg)
            for cfg in cfgs]
    return costing.step_time(model_config(config), config, target.chip, work, pools > 1, assumptions)


def compile_step(config, target: Target, assumptions: costing.Assumptions, devices=None) -> dict:
    """Every program of a training step compiled for `target`; the report as a dict (the --json object)."""
    steps = step_programs(config, target.devices() if devices is None else devices, target.hosts, target.on_one_host)
    hbm = target.chip.hbm_bytes
    plans = planned(config, target)
    rows = []
    for program in [p for p in steps.programs if p.reported]:
        a = analyze(program)
        rows.append({
            "name": program.name, "pool": program.pool, "compiled_peak_bytes": a.compiled_peak,
            "program_bytes": a.program_bytes, "resident_bytes": program.resident,
            "planned_peak_bytes": plans.get(program.name), "hbm_bytes": hbm, "flops": a.flops,
            "bytes_accessed": a.bytes_accessed, "optimal_seconds": a.optimal_s, "collectives": a.collectives,
            "modelled_s": modelled_seconds(a, steps.pool_cfgs[a.program.pool], target.chip), "compile_s": round(a.compile_s, 1)})
    step = model_step(config, target, assumptions, sum(len(s.agents) for s in steps.pools))
    mesh = dict(zip(steps.mesh.axis_names, steps.mesh.devices.shape))
    return {"target": target.name, "chip": target.chip.name, "chips": target.chips, "hosts": target.hosts,
            "mesh": mesh, "fits": all(r["compiled_peak_bytes"] <= hbm for r in rows), "programs": rows,
            "step_modelled_s": step["total"], "step_modelled": step,
            "run_modelled_hours": step["total"] * config.train.steps / 3600,
            "assumptions": {"prompt_tokens": assumptions.prompt_tokens,
                            "response_tokens": assumptions.response_tokens,
                            "kept_fraction": assumptions.kept_fraction,
                            "update_mfu": costing.UPDATE_MFU, "decode_efficiency": costing.DECODE_EFFICIENCY,
                            "row_step_seconds": costing.ROW_STEP_SECONDS},
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
              f"(the trainer's, at the paper's width), decode at {a['decode_efficiency']:.0%} of its floor plus "
              f"{a['row_step_seconds'] * 1e6:.1f} us per row and step, as measured on an H200."]
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
