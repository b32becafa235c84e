"""Where the test suite's time goes: each area's seconds against its budget, from a timed run.

    ATGRPO_TEST_TIMES=/tmp/times.json python -m pytest -q -n 2     # the default tier, every test's seconds
    python tools/suite_budget.py /tmp/times.json [--markdown]

The seconds are each test's setup + call + teardown, summed over the two xdist workers; the tier's wall
time is about half their sum. The budgets (docs/design/developers.md) add up to 2 x 600 s: ten minutes
of wall time on two cores, two under the default tier's 12-minute budget (tests/tiers.py BUDGET_S),
for a machine that is slower or busier than the one that measured them. Nothing fails on a figure:
the machine is shared and noisy; the table says where a new test's seconds should come from.
"""
from __future__ import annotations

import argparse
import collections
import json

# area -> (the test paths it holds, by prefix; its budget in test-seconds)
AREAS = {
    "models and tokenizers": (("tests/models/",), 130),
    "sampling": (("tests/sampling/",), 125),
    "algorithm": (("tests/algo/",), 65),
    "training (rollout, update, async, roles, checkpoints, multi-process)": (("tests/train/",), 300),
    "faults (the trainer as a user runs it)": (("tests/faults/",), 200),
    "environments and sandbox": (("tests/envs/",), 80),
    "benchmarks": (("tests/bench/",), 60),
    "planner and TPU compiles": (("tests/test_plan", "tests/test_tpu_scripts.py", "tests/test_sharding.py"), 75),
    "end to end (paper configs, API, README, export, sft, ablations, miniature)":
        (("tests/test_paper_path.py", "tests/test_api.py", "tests/test_readme_example.py", "tests/test_export.py",
          "tests/test_sft.py", "tests/test_ablate.py", "tests/miniature/", "tests/test_recipes.py"), 150),
    "commands, configs, docs, data": (("tests/",), 15),  # the rest
}


def area_of(nodeid: str) -> str:
    for name, (prefixes, _) in AREAS.items():
        if nodeid.startswith(prefixes):
            return name
    raise ValueError(nodeid)


def table(times: dict, markdown: bool) -> str:
    seconds, count = collections.defaultdict(float), collections.Counter()
    for nodeid, s in times["seconds"].items():
        seconds[area_of(nodeid)] += s
        count[area_of(nodeid)] += 1
    rows = [(name, count[name], seconds[name], budget) for name, (_, budget) in AREAS.items()]
    total = sum(r[2] for r in rows)
    if markdown:
        out = ["| area | tests | seconds | budget |", "|---|---|---|---|"]
        out += [f"| {n} | {c} | {s:.0f} | {b} |" for n, c, s, b in rows]
        out.append(f"| all ({times['tier']} tier, wall {times['wall_s']:.0f} s) | {sum(count.values())} | {total:.0f} "
                   f"| {sum(b for *_, b in rows)} |")
    else:
        out = [f"{s:7.0f} s of {b:4d} {'OVER' if s > b else '    '}  {c:4d} tests  {n}" for n, c, s, b in rows]
        out.append(f"{total:7.0f} s of {sum(b for *_, b in rows):4d}       {sum(count.values()):4d} tests  "
                   f"all (the {times['tier']} tier: {times['wall_s']:.0f} s of wall time)")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("times", help="the file ATGRPO_TEST_TIMES named")
    parser.add_argument("--markdown", action="store_true", help="a table for docs/design/developers.md")
    args = parser.parse_args(argv)
    with open(args.times) as f:
        print(table(json.load(f), args.markdown))


if __name__ == "__main__":
    main()
