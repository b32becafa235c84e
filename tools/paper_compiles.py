"""Compile every paper config (configs/*_qwen3_*.py) in each regime for its TPU topologies, and model
the paper's runs on TPUs and H100s: the figures of docs/results/tpu.md.

    python tools/paper_compiles.py --out=docs/results/paper_compiles.json [--only=1p7b] [--jobs=2]

Each compile runs `python -m atgrpo_jax.plan --compile=TARGET --json` in its own process (a compiler
crash then costs one row, not the sweep). The five tasks of one model size have the same programs
(the same batch, lengths and sampling settings: train/paper.py `paper_config`), so each (size,
regime, target) is compiled once, from the Plan-Path config, and every task's step is modelled from
its own config (its turns and group filters). The costed table models every config on v5p-8,
v5p-32, one H100, eight and sixteen H100s (plan/costing.py; no compile: memory is the planner's).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = ("plan_path", "sokoban", "sudoku", "math", "code")
REGIMES = ("shared", "per_role", "lora")
# The topologies the README sends each size to, and one of the other generation.
TARGETS = {"1p7b": ("v5p-8", "v6e-8"), "8b": ("v5p-32", "v6e-16")}
MODEL_TARGETS = ("v5p-8", "v5p-32", "h100", "h100x8", "h100x16")  # the costed table's columns
PUBLISHED_HOURS = {("plan_path", "1p7b"): 8, ("code", "1p7b"): 24, ("math", "1p7b"): 16,
                   ("plan_path", "8b"): 16, ("code", "8b"): 48, ("math", "8b"): 32}  # PettingLLMs' docs


def regime_flags(regime: str, chips: int = 2) -> list[str]:
    """per_role puts each model on its own pool of chips where there are chips to split (one chip: both on it)."""
    flags = [f"--config.regime={regime}"]
    return flags + (["--config.policy.pools=True"] if regime == "per_role" and chips > 1 else [])


def compile_one(size: str, regime: str, target: str) -> dict:
    cmd = [sys.executable, "-m", "atgrpo_jax.plan", f"--config=configs/plan_path_qwen3_{size}.py",
           f"--compile={target}", "--json", *regime_flags(regime)]
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    row = {"size": size, "regime": regime, "target": target, "exit": proc.returncode,
           "seconds": round(time.time() - start)}
    lines = proc.stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        row["report"] = json.loads(lines[-1])
    errors = [e for e in proc.stderr.splitlines() if e.startswith(("DOES NOT FIT", "error:", "F1", "Check failed"))]
    row["error"] = "" if proc.returncode == 0 else errors[-1] if errors else proc.stderr.strip()[-300:]
    print(f"{size} {regime} {target}: exit {proc.returncode} in {row['seconds']} s {row['error'][:150]}", flush=True)
    return row


def modelled(size: str, task: str, regime: str, target: str) -> dict:
    """The step model of `task`'s config on `target`, without a compile, and the planner's peak."""
    from atgrpo_jax import cli
    from atgrpo_jax.plan import costing
    from atgrpo_jax.plan.compile_cli import model_step
    from atgrpo_jax.plan.memory import plan
    from atgrpo_jax.plan.targets import parse_target
    from atgrpo_jax.train.validate import resolve

    t = parse_target(target)
    overrides, _ = cli.pop_overrides(["x", *regime_flags(regime, t.chips)])
    config = resolve(cli.config_from_args(os.path.join(ROOT, f"configs/{task}_qwen3_{size}.py"), overrides),
                     weights=False)
    step = model_step(config, t, costing.Assumptions.of(config))
    p = plan(config, t.planner_device(), t.chips)  # pools as the config says
    return {"step_s": step, "run_hours": step["total"] * config.train.steps / 3600, "planned_peak": p.peak,
            "hbm": t.chip.hbm_bytes, "planned_fits": p.peak <= t.chip.hbm_bytes}


def all_models(only: str = "") -> list[dict]:
    return [{"size": s, "task": task, "regime": r, "target": t, **modelled(s, task, r, t)}
            for s in TARGETS for task in TASKS for r in REGIMES for t in MODEL_TARGETS if only in (s, r, "")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results/paper_compiles.json")
    parser.add_argument("--only", default="", help="a size (1p7b, 8b) or regime to restrict the compiles to")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--markdown", action="store_true", help="print docs/results/tpu.md's tables from --out")
    parser.add_argument("--models-only", action="store_true", help="redo the time model (no compile) into --out")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(os.path.join(ROOT, args.out)))
        return 0
    if args.models_only:
        with open(os.path.join(ROOT, args.out)) as f:
            out = json.load(f)
        out["models"] = all_models(args.only)
        with open(os.path.join(ROOT, args.out), "w") as f:
            json.dump(out, f, indent=1)
        return 0
    jobs = [(s, r, t) for s in TARGETS for r in REGIMES for t in TARGETS[s] if args.only in (s, r, "")]
    out = {"compiles": [], "models": all_models(args.only),
           "published_hours": {f"{t}_{s}": h for (t, s), h in PUBLISHED_HOURS.items()}}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for row in pool.map(lambda j: compile_one(*j), jobs):  # saved as each ends: a long sweep cut short keeps its rows
            out["compiles"].append(row)
            with open(os.path.join(ROOT, args.out), "w") as f:
                json.dump(out, f, indent=1)
    return 0



def markdown(path: str) -> str:
    """docs/results/tpu.md's tables from the sweep's JSON."""
    with open(path) as f:
        out = json.load(f)
    gib = 2 ** 30
    lines = ["| size | regime | target | exit | program (pool) | compiled GiB | planned GiB | diff | HBM GiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in out["compiles"]:
        head = f"| {c['size']} | {c['regime']} | {c['target']} | {c['exit']} |"
        if "report" not in c:
            lines.append(f"{head} {c['error'][:120]} | | | | |")
            continue
        for p in c["report"]["programs"]:
            plan = p["planned_peak_bytes"]
            diff = f"{100 * (plan / p['compiled_peak_bytes'] - 1):+.1f}%" if plan else "-"
            planned = f"{plan / gib:.2f}" if plan else "-"
            lines.append(f"{head} {p['name']} ({p['pool']}) | {p['compiled_peak_bytes'] / gib:.2f} | {planned} | "
                         f"{diff} | {p['hbm_bytes'] / gib:.1f} |")
    lines += ["", "| config | regime | " + " | ".join(MODEL_TARGETS) + " | published (8 or 16 GPUs) |",
              "|---|---|" + "---|" * (len(MODEL_TARGETS) + 1)]
    by = {(m["size"], m["task"], m["regime"], m["target"]): m for m in out["models"]}
    for size in TARGETS:
        for task in TASKS:
            for regime in REGIMES:
                cells = []
                for target in MODEL_TARGETS:
                    m = by.get((size, task, regime, target))
                    if m is None:
                        cells.append("")
                        continue
                    fits = "" if m["planned_fits"] else " (does not fit)"
                    cells.append(f"{m['step_s']['total']:.0f} s, {m['run_hours']:.1f} h{fits}")
                published = out["published_hours"].get(f"{task}_{size}")
                lines.append(f"| {task}_qwen3_{size} | {regime} | " + " | ".join(cells)
                             + (f" | {published} h |" if published else " | - |"))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
