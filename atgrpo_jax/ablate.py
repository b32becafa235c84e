"""Compare training regimes (or the values of any config key) at an equal budget, over several seeds: a
markdown table and a plot.

    python -m atgrpo_jax.ablate --config=configs/demo.py --regimes=shared,per_role,single_agent,plain_grpo \\
        --seeds=0,1,2 --out=runs/regimes --config.train.steps=80
    python -m atgrpo_jax.ablate --config=configs/demo.py --key=algo.advantage --regimes=grpo,rloo,dr_mas \\
        --seeds=0,1,2 --out=runs/estimators

Each arm (a regime, or with --key a value of that key) and seed trains in OUT/<arm>/seed<k> with the
same config and number of steps
(train.seed and model.init_seed set to the seed, no time budget), resuming a run that was
interrupted and skipping one that is complete. Then OUT/table.md (held-out success at the end:
mean and standard deviation over seeds, each seed's value, samples per step), OUT/table.json
and OUT/curves.png (mean curve per regime with a band of one standard deviation).
"""
from __future__ import annotations

import os
import types

import numpy as np
from absl import flags

from atgrpo_jax import cli, workdir as wd
from atgrpo_jax.train.config import REGIMES
from atgrpo_jax.train.loop import run_training
from atgrpo_jax.train.metrics_files import read_metrics
from atgrpo_jax.train.validate import resolve


def run_configs(config, regimes, seeds, out: str, key: str = "regime") -> dict:
    """{(arm, seed): (config, workdir)} of every run, an arm being a regime or a value of `key`; any bad
    flag or config is a one-line error here, before anything is written."""

    bad = [s for s in seeds if not str(s).isdigit()]
    if bad or not seeds:
        raise cli.UsageError(f"--seeds: {bad or 'none given'}: give whole numbers >= 0 (--seeds=0,1,2)")
    if not regimes:
        raise cli.UsageError(f"--regimes: none given: name some of {', '.join(REGIMES)}" if key == "regime" else
                             f"--regimes: no values of --key={key} given")
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown and key == "regime":
        raise cli.UsageError(f"--regimes: {unknown} are not regimes ({', '.join(REGIMES)})")
    for name, values in (("--regimes", list(regimes)), ("--seeds", [int(s) for s in seeds])):
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:  # one workdir trained twice over, and a seed counted twice in the mean
            raise cli.UsageError(f"{name}: {', '.join(twice)} given more than once")
    runs = {}
    for regime in regimes:
        for seed in seeds:
            c = cli.apply_overrides(config.copy_and_resolve_references(), [(key, regime)])
            c.train.seed, c.model.init_seed, c.train.time_budget_s = int(seed), int(seed), 0.0
            runs[(regime, seed)] = (resolve(c), os.path.join(out, regime, f"seed{seed}"))
    return runs


def run_table(config, regimes, seeds, out: str, key: str = "regime") -> dict:
    """Train every (arm, seed) (see the module docstring); returns table.json's dict."""

    planned = run_configs(config, regimes, seeds, out, key)
    wd.check_writable(out, "--out")  # before hours of training, not after
    os.makedirs(out, exist_ok=True)
    runs = {}
    for (regime, seed), (c, workdir) in planned.items():
        rows = read_metrics(workdir) if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else []
        if not rows or rows[-1]["step"] < c.train.steps:
            print(f"training {regime}, seed {seed}: {workdir}", flush=True)
            run_training(c, workdir)
            rows = read_metrics(workdir)
        runs[(regime, seed)] = rows
    table = summarize(runs, regimes, seeds)
    write_outputs(table, runs, out, key)
    return table


def summarize(runs: dict, regimes, seeds) -> dict:
    """Per regime: the held-out success of each seed at its last evaluation, their mean and std, and
    before training (`start`: each seed's evaluation at step 0, the untrained agents; None without one)."""
    table = {}
    for regime in regimes:
        finals, starts, samples = [], [], []
        for seed in seeds:
            rows = runs[(regime, seed)]
            evals = [r for r in rows if r.get("eval_success") is not None]
            finals.append(evals[-1]["eval_success"] if evals else float("nan"))
            starts.append(next((r["eval_success"] for r in evals if r["step"] == 0), None))
            samples += [r["samples"] for r in rows if r.get("samples") is not None]
        table[regime] = {"final": finals, "mean": float(np.mean(finals)), "std": float(np.std(finals, ddof=1))
                         if len(finals) > 1 else 0.0, "samples_per_step": float(np.mean(samples)) if samples else 0.0,
                         "start": starts}
    return table


def markdown(table: dict, steps: int, key: str = "regime") -> str:
    lines = [f"| {key} | held-out success after {steps} steps (mean ± std) | per seed | before training "
             "(untrained) | samples per step |", "|---|---|---|---|---|"]
    for regime, t in table.items():
        seeds = ", ".join(f"{x:.0%}" for x in t["final"])
        starts = [x for x in t.get("start", ()) if x is not None]
        start = f"{np.mean(starts):.1%}" if starts else "-"
        lines.append(f"| {regime} | {t['mean']:.1%} ± {t['std']:.1%} | {seeds} | {start} | "
                     f"{t['samples_per_step']:.0f} |")
    return "\n".join(lines) + "\n"


def write_outputs(table: dict, runs: dict, out: str, key: str = "regime"):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = max(r["step"] for rows in runs.values() for r in rows)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(markdown(table, steps, key))
    with open(os.path.join(out, "table.json"), "w") as f:
        f.write(cli.dumps(table, indent=2))  # a seed without an evaluation: null, not NaN
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for regime in table:
        curves = [{r["step"]: r["eval_success"] for r in rows if r.get("eval_success") is not None}
                  for (reg, _), rows in runs.items() if reg == regime]
        xs = sorted(set.intersection(*(set(c) for c in curves)))
        ys = np.array([[c[x] for x in xs] for c in curves])
        ax.plot(xs, ys.mean(0), marker="o", markersize=3, label=f"{regime} ({len(curves)} seeds)")
        ax.fill_between(xs, ys.mean(0) - ys.std(0), ys.mean(0) + ys.std(0), alpha=0.2)
    ax.set_xlabel("training step")
    ax.set_ylabel("success rate (held out)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"))


def main(f, overrides=()):
    """The command (run by `cli.command`: flags parsed, errors as one line)."""
    if not f.out.value:
        raise cli.UsageError("--out is required")
    config = cli.apply_overrides(cli.load_config(f.config.value), overrides)
    run_table(config, f.regimes.value, f.seeds.value, f.out.value, f.key.value)
    print(open(os.path.join(f.out.value, "table.md")).read())


def _flags() -> types.SimpleNamespace:
    """The command's flags (defined when it runs, so importing this module defines none)."""
    return types.SimpleNamespace(
        config=flags.DEFINE_string("config", None, "config file configs/X.py[:ARG]; its keys: --config.KEY=VALUE"),
        regimes=flags.DEFINE_list("regimes", ["shared", "per_role", "single_agent", "plain_grpo"],
                                  "the arms to compare: regimes (train.config.REGIMES), or with --key its values"),
        key=flags.DEFINE_string("key", "regime", "the config key the arms set (e.g. algo.advantage)"),
        seeds=flags.DEFINE_list("seeds", ["0", "1", "2"], "seeds (train.seed and model.init_seed)"),
        out=flags.DEFINE_string("out", None, "directory of the runs, the table and the plot"))


if __name__ == "__main__":
    cli.command(main, _flags)
