"""`python -m atgrpo_jax.plan --config=CFG --compile=TARGET [--json]`: compile a training step's programs
for a TPU topology or a GPU on this machine (no accelerator needed), and report per program its
memory per chip beside the planner's, its FLOPs, bytes and collectives, and a modelled time.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import re
import signal
import tempfile
from typing import Callable

from atgrpo_jax.plan import costing
from atgrpo_jax.plan.compiled import COLLECTIVES, Analysis, analyze
from atgrpo_jax.plan.planned_model import model_config, planned_roles
from atgrpo_jax.plan.memory import plan
from atgrpo_jax.plan.programs import DoesNotFit, compile_progress, step_programs  # noqa: F401  (DoesNotFit: callers)
from atgrpo_jax.plan.targets import GiB, Target
from atgrpo_jax.sharding import MeshSettings, pool_sizes


def planned(config, target: Target) -> dict[str, int]:
    """The planner's per-chip peaks on the target (python -m atgrpo_jax.plan), by program."""
    p = plan(config, target.planner_device(), target.chips)  # pools as the trainer cuts them
    s = p.sampling_terms
    beside = p.sampling_peak - max(s["prefill_phase"], s["decode_phase"])  # what both sampling phases hold
    return {"prefill": beside + s["prefill_phase"], "decode segment": beside + s["decode_phase"],
            "old log-probs": p.logprob_peak, "update": p.update_peak}


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


def model_step(config, target: Target, assumptions: costing.Assumptions) -> dict:
    """The modelled seconds of a training step of `config` on `target` (plan/costing.py; no compile):
    the pools and meshes as train/setup.py lays them out, each host sampling its share of the tasks."""
    roles = planned_roles(config)
    agents = len(roles)
    layout = config.layout(agents)
    pools = layout.pools
    full = MeshSettings.from_mapping(config.mesh.to_dict()).resolve(target.chips, target.hosts)
    pool = full if pools == 1 else pool_sizes(full, pools, target.hosts)
    r = config.rollout
    prompts = r.num_tasks // target.hosts * (1 if r.tree else r.k)
    models = 1 if layout.lora else layout.policies  # each model learns from its agents only
    roles = roles if config.policy.role_models and models > 1 else []
    cfgs = [model_config(config.role(name)) for name in roles] if len(roles) == models else [None] * models
    work = [costing.PoolWork(agents // models, dict(pool, data=1), prompts, prompts * (r.k if r.tree else 1),
                             math.prod(pool.values()), cfg)
            for cfg in cfgs]
    return costing.step_time(model_config(config), config, target.chip, work, pools > 1, assumptions)


class CompilerFailed(Exception):
    """The compiler aborted (a failed CHECK ends its process) or failed an internal check compiling one
    program: a compiler bug, not the config's. The message is the command's one line."""

    def __init__(self, program: str, pool: str, target: str, check: str, aborted: bool = True):
        super().__init__(f"libtpu {'aborted' if aborted else 'failed'} compiling {program} of {pool} for {target} "
                         f"(a compiler bug: {check}); try another slice or cut (--config.policy.pools=False keeps "
                         "every policy on all chips) or another libtpu (pip install -U \"jax[tpu]\")")
        self.program, self.pool, self.target, self.check, self.aborted = program, pool, target, check, aborted

    def __reduce__(self):  # raised in the child, raised again in the command
        return CompilerFailed, (self.program, self.pool, self.target, self.check, self.aborted)


class CompileDied(Exception):
    """The compile's process ended without a report and without a compiler CHECK (killed, out of memory)."""


# What a failed CHECK (the process aborts) or RET_CHECK (an INTERNAL error) in libtpu says, and where.
_CHECK = re.compile(r"(\S+\.cc:\d+)\] (Check failed: .*?)\s*$")
_RET_CHECK = re.compile(r"RET_CHECK failure \((\S+\.cc:\d+)\) (.*?)(?: :: |$)", re.M)
NO_PROGRAM = ("its programs", "the step")  # (program, pool) named when the compiler died before the first


def compile_step(config, target: Target, assumptions: costing.Assumptions, devices=None,
                 progress: Callable[[str], None] | None = None, work: Callable | None = None) -> dict:
    """Every program of a training step compiled for `target`; the report as a dict (the --json object).

    On a TPU target the compiles run in a child process: libtpu ends its process on a failed internal
    CHECK, so a compiler bug ends that child, not the command, and comes back as one CompilerFailed
    naming the program it was compiling. `devices` given (or a GPU): in this process. progress(line):
    a line as each program starts and ends compiling. work: what the child runs (`_compile_here`'s
    signature, a module-level function)."""
    work = work or _compile_here
    if devices is not None or target.platform != "tpu":
        return work(config, target, assumptions, devices, progress and (lambda line, _: progress(line)))
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile("w+", prefix="atgrpo-compile-", suffix=".log") as log:
        child = ctx.Process(target=_child, args=(work, config, target, assumptions, send, log.name), daemon=True)
        child.start()
        send.close()
        current, result = NO_PROGRAM, None
        try:
            while result is None:
                try:
                    kind, *body = receive.recv()
                except EOFError:  # the child ended without a result: aborted by the compiler, or killed
                    break
                if kind == "line":
                    current = tuple(body[1])
                    if progress:
                        progress(body[0])
                else:
                    result = (kind, body[0])
        finally:
            child.join()
        if result is None:
            raise _died(child.exitcode, current, target.name, log.name)
    kind, value = result
    if kind == "error":
        raise value
    return value


def _died(exitcode, current: tuple[str, str], target: str, log_path: str) -> Exception:
    """The error of a child that ended without a report: the compiler's failed CHECK where it printed one."""
    with open(log_path, errors="replace") as f:
        lines = f.read().splitlines()
    check = next((f"{m.group(2)} at {m.group(1)}" for m in map(_CHECK.search, lines) if m), None)
    if check or exitcode == -signal.SIGABRT:
        return CompilerFailed(*current, target, check or "SIGABRT, no CHECK printed")
    how = f"signal {-exitcode}" if exitcode and exitcode < 0 else f"exit {exitcode}"
    why = " (killed: out of memory?)" if exitcode == -signal.SIGKILL else ""
    return CompileDied(f"compiling {current[0]} of {current[1]} for {target}: the compile's process ended "
                       f"({how}){why} without a report")


def _child(work, config, target: Target, assumptions, send, log_path: str) -> None:
    """plan --compile's child: what libtpu prints (a CHECK's stack trace among it) goes to `log_path`;
    ("line", text, (program, pool)) as each compile starts and ends, then ("report", dict) or
    ("error", exception) go to `send`."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        result = ("report", work(config, target, assumptions, None,
                                 lambda line, current: send.send(("line", line, current))))
    except Exception as e:  # noqa: BLE001  (sent to the command, which raises it)
        m = _RET_CHECK.search(str(e))
        if m:  # an INTERNAL error of the compiler: one line naming the program
            e = CompilerFailed(*getattr(e, "_atgrpo_program", NO_PROGRAM), target.name,
                               f"RET_CHECK {m.group(2)} at {m.group(1)}", aborted=False)
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:  # noqa: BLE001  (an exception that cannot travel: its type and first line)
            e = RuntimeError(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
        result = ("error", e)
    send.send(result)
    send.close()


def _compile_here(config, target: Target, assumptions, devices, progress) -> dict:
    """The report, compiled in this process; progress(line, (program, pool)) as each program starts and ends.
    An exception raised on the way carries the program it was compiling (`_atgrpo_program`)."""
    current = NO_PROGRAM

    def report(program, seconds):
        nonlocal current
        current = (program.name, program.pool)
        if progress is not None:
            progress(f"compiling {program.name} of {program.pool} for {target.name}" if seconds is None else
                     f"  compiled {program.name} of {program.pool} in {seconds:.0f} s", current)

    try:
        with compile_progress(report):
            return _compile_report(config, target, assumptions, devices)
    except Exception as e:
        e._atgrpo_program = current
        raise


def _compile_report(config, target: Target, assumptions: costing.Assumptions, devices=None) -> dict:
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
    step = model_step(config, target, assumptions)
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
