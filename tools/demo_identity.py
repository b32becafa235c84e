"""Does a change leave training bitwise as it was? Runs the CPU demo's first N steps into a workdir and
compares its metrics.jsonl, row by row, with a reference run's, every number but the clocks.

    python tools/demo_identity.py runs/before            # on the old code: the reference
    python tools/demo_identity.py runs/after runs/before # on the new code: exit 1 on any difference

Arguments starting with -- go to the training command (e.g. --config.regime=per_role).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

STEPS = 20
CLOCKS = re.compile(r"(_s$|per_s|_busy|time)")  # wall-clock measurements differ run to run


def rows(workdir: str) -> list[dict]:
    with open(f"{workdir}/metrics.jsonl") as f:
        return [{k: v for k, v in json.loads(line).items() if not CLOCKS.search(k)} for line in f]


def main(workdir: str, reference: str | None, overrides: list[str]) -> int:
    shutil.rmtree(workdir, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "atgrpo_jax.train", "--config=configs/demo.py", f"--workdir={workdir}",
                    f"--config.train.steps={STEPS}", *overrides], check=True, stdout=subprocess.DEVNULL)
    if reference is None:
        return 0
    got, want = rows(workdir), rows(reference)
    diffs = [(w["step"], k, w.get(k), g.get(k)) for g, w in zip(got, want) for k in sorted(set(g) | set(w))
             if g.get(k) != w.get(k)]
    if len(got) != len(want):
        diffs.append(("rows", "", len(want), len(got)))
    for step, k, before, now in diffs[:20]:
        print(f"step {step} {k}: {before!r} -> {now!r}")
    print(f"{len(want)} rows: {'bitwise identical' if not diffs else f'{len(diffs)} differences'}")
    return 1 if diffs else 0


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    sys.exit(main(paths[0], paths[1] if len(paths) > 1 else None, flags))
