"""Compile the 1.7B per-role configs with one device pool per role on every slice users rent: the pool
sweep of docs/results/tpu.md.

    python tools/pool_sweep.py --out=docs/results/pool_sweep.json      # compiles what the file lacks
    python tools/pool_sweep.py --out=docs/results/pool_sweep.json --markdown

Two pools: Plan-Path's tool and plan agents (configs/plan_path_qwen3_1p7b.py, regime=per_role); three
pools: math aggregation's reasoner, tool agent and aggregator (configs/math_aggregation_qwen3_1p7b.py).
Each (pools, slice) is one `python -m atgrpo_jax.plan --compile=SLICE --json` in its own process, saved
to --out as it ends, so a sweep cut short resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLICES = ("v5p:2x2x1", "v5p:2x2x2", "v5p:2x2x4", "v5p:2x4x4", "v6e:2x2", "v6e:2x4", "v6e:4x4", "v5e:2x4",
          "v5p:2x2x3")  # the last: 3 hosts, one per pool of three (refused: each host samples with every model)
CONFIGS = {2: "configs/plan_path_qwen3_1p7b.py", 3: "configs/math_aggregation_qwen3_1p7b.py"}
FLAGS = ("--config.regime=per_role", "--config.policy.pools=True", "--config.model.init=random")


def compile_one(pools: int, target: str) -> dict:
    cmd = [sys.executable, "-m", "atgrpo_jax.plan", f"--config={CONFIGS[pools]}", f"--compile={target}",
           "--json", *FLAGS]
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    row = {"pools": pools, "target": target, "exit": proc.returncode, "seconds": round(time.time() - start)}
    lines = proc.stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        row["report"] = json.loads(lines[-1])
    said = [e for e in (proc.stdout + proc.stderr).splitlines()
            if e.startswith(("DOES NOT FIT", "error:", "libtpu"))]
    row["error"] = "" if proc.returncode == 0 else (said[-1] if said else proc.stderr.strip()[-300:])
    row["what_lowers"] = [e.strip("- ") for e in proc.stderr.splitlines() if e.startswith("  - ")]  # plan's advice
    print(f"{pools} pools {target}: exit {proc.returncode} in {row['seconds']} s {row['error'][:160]}", flush=True)
    return row


def short(row: dict) -> str:
    """A failed row's one line, shortened for the table."""
    e = row["error"]
    if m := re.search(r"neither (.+)", e):
        return f"cannot be cut: neither {m.group(1)}"
    if m := re.search(r"over (\d+) hosts into (\d+) pools with devices on every host .*: (a host's .+)", e):
        return f"cannot be cut: {m.group(2)} pools need chips on each of the {m.group(1)} hosts; {m.group(3)}"
    if m := re.search(r"DOES NOT FIT on \S+: (.+?) needs ([\d.]+) GiB per chip, more than the ([\d.]+) GiB", e):
        changes = [a for a in row.get("what_lowers", []) if "larger slice" not in a]  # a setting, on this slice
        advice = f"; the planner's first change: {changes[0]}" if changes else ""
        return f"does not fit: {m.group(1)} needs {m.group(2)} of {m.group(3)} GiB per chip{advice}"
    if m := re.search(r"libtpu (aborted|failed) compiling (.+?) for \S+ \(a compiler bug: (.+?)\); try", e):
        check = re.search(r"RET_CHECK failure \([^)]*\) (.+?)(?: at \S+\.cc:\d+)?$", m.group(3))
        return f"libtpu {m.group(1)} compiling {m.group(2)}: {(check.group(1) if check else m.group(3))[:160]}"
    return e[:200]


def markdown(rows: list[dict]) -> str:
    """One line per (pools, slice): what it says, and each program's compiled peak against the plan."""
    gib = 2 ** 30
    out = ["| pools | slice | result | prefill | decode segment | old log-probs | update | HBM / chip |",
           "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["pools"], SLICES.index(r["target"]))):
        head = f"| {r['pools']} | {r['target']} |"
        rep = r.get("report")
        if rep is None:
            out.append(f"{head} {short(r).replace('|', '/')} | | | | | |")
            continue
        cells = {}
        for p in rep["programs"]:  # each pool's programs: show the worst planner error of each program
            plan, peak = p["planned_peak_bytes"], p["compiled_peak_bytes"]
            err = 100 * (plan / peak - 1) if plan else None
            old = cells.get(p["name"])
            if old is None or (err is not None and (old[1] is None or abs(err) > abs(old[1]))):
                cells[p["name"]] = (peak, err)
        names = ("prefill", "decode segment", "old log-probs", "update")
        shown = [f"{cells[n][0] / gib:.2f} ({cells[n][1]:+.0f}%)" if n in cells and cells[n][1] is not None
                 else (f"{cells[n][0] / gib:.2f} (-)" if n in cells else "") for n in names]
        result = "fits" if rep["fits"] else "does not fit"
        hbm = rep["programs"][0]["hbm_bytes"] / gib
        out.append(f"{head} {result} | " + " | ".join(shown) + f" | {hbm:.0f} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results/pool_sweep.json")
    parser.add_argument("--markdown", action="store_true", help="print the table from --out")
    parser.add_argument("--only", default="", help="compile only the slices containing this text")
    args = parser.parse_args()
    path = os.path.join(ROOT, args.out)
    rows = json.load(open(path)) if os.path.exists(path) else []
    if args.markdown:
        print(markdown(rows))
        return 0
    done = {(r["pools"], r["target"]) for r in rows}
    for pools in CONFIGS:
        for target in SLICES:
            if (pools, target) in done or args.only not in target or (pools == 2 and target == "v5p:2x2x3"):
                continue
            rows.append(compile_one(pools, target))
            with open(path, "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
