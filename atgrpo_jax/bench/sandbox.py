"""Per-run cost of the sandbox's isolation layers, side by side.

`python -m atgrpo_jax.bench sandbox [--programs 50] [--rounds 5] [--code "print(1)"] [--json]`

The same tiny program runs `--programs` times (one after another, as one grader
thread does) under each setting, the settings interleaved round by round so that
load from other jobs hits all of them alike:
- "hook only": no namespaces, the audit hook alone (`Limits(namespaces=False)`);
- "namespaces": user/PID/network namespaces, no private root
  (`Limits(filesystem_isolation=False)`);
- "private root": the default, which adds the mount namespace and the new root.
The file-system plan is listed before timing (once per process; its time is
printed apart). Every run must succeed and report the expected layer.
"""
from __future__ import annotations

import argparse
import json
import os
import time

from atgrpo_jax.bench.common import cpu_model
from atgrpo_jax.envs.sandbox import Limits, filesystem_plan, run_python

SETTINGS = {
    "hook only": (Limits(namespaces=False), "audit-hook"),
    "namespaces": (Limits(filesystem_isolation=False), "audit-hook"),
    "private root": (Limits(), "mount-namespace"),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m atgrpo_jax.bench sandbox", description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, default=50, help="runs per setting")
    parser.add_argument("--rounds", type=int, default=5, help="the runs of each setting are split into this many rounds")
    parser.add_argument("--code", default="print(sum(range(10)))", help="the program")
    parser.add_argument("--json", action="store_true", help="print a JSON line last")
    args = parser.parse_args(argv)
    if args.programs < args.rounds or args.rounds < 1:
        parser.error("--programs must be at least --rounds, which must be at least 1")

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores")
    start = time.perf_counter()
    filesystem_plan()
    plan_s = time.perf_counter() - start
    seconds = {name: 0.0 for name in SETTINGS}
    failures = []
    per_round = [args.programs // args.rounds + (r < args.programs % args.rounds) for r in range(args.rounds)]
    for count in per_round:
        for name, (limits, layer) in SETTINGS.items():
            start = time.perf_counter()
            results = [run_python(args.code, "", limits) for _ in range(count)]
            seconds[name] += time.perf_counter() - start
            failures += [f"{name}: {r}" for r in results if not r.ok or r.isolation != layer]
    per_run_ms = {name: 1000 * s / args.programs for name, s in seconds.items()}
    base = per_run_ms["namespaces"]
    print(f"file-system plan listed in {plan_s:.2f} s (once per process)")
    print(f"{'setting':<14} {'runs':>5} {'total s':>8} {'ms/run':>8} {'vs namespaces':>14}")
    for name, ms in per_run_ms.items():
        print(f"{name:<14} {args.programs:>5} {seconds[name]:>8.2f} {ms:>8.1f} {ms / base:>13.3f}x")
    print(f"the private root costs {per_run_ms['private root'] - base:+.1f} ms per run")
    for line in failures[:5]:
        print("FAILED", line)
    if args.json:
        print(json.dumps({"bench": "sandbox", "machine": cpu_model(), "programs": args.programs, "plan_s": plan_s, "per_run_ms": per_run_ms,
                          "private_root_ratio": per_run_ms["private root"] / base, "failures": len(failures)}))
    return 1 if failures else 0
