"""`python -m atgrpo_jax.miniature --config=configs/miniature.py:plan_path --out=DIR` (see run.py)."""
import types

from absl import flags

from atgrpo_jax import cli
from atgrpo_jax.miniature.run import RECIPES, REGIMES, run_miniature


def main(f, overrides=()):
    if not f.out.value:
        raise cli.UsageError("--out is required")
    unknown = [r for r in f.recipes.value if r not in RECIPES]
    if unknown:
        raise cli.UsageError(f"--recipes: {unknown} are not recipes ({', '.join(RECIPES)})")
    if not 0.0 <= f.noise.value <= 1.0:
        raise cli.UsageError(f"--noise: {f.noise.value} is not a probability in [0, 1]")
    config = cli.apply_overrides(cli.load_config(f.config.value), overrides)
    run_miniature(config, f.out.value, recipes=f.recipes.value, regimes=f.regimes.value, seeds=f.seeds.value,
                  tasks=f.trace_tasks.value, noise=f.noise.value)
    print(open(f"{f.out.value}/table.md").read())


def _flags() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        config=flags.DEFINE_string("config", "configs/miniature.py:plan_path", "config file configs/X.py[:ARG]"),
        out=flags.DEFINE_string("out", None, "directory of the traces, the warm start, the runs and the table"),
        recipes=flags.DEFINE_list("recipes", list(RECIPES), "recipes to compare"),
        regimes=flags.DEFINE_list("regimes", list(REGIMES), "regimes (train.config.REGIMES) to compare"),
        seeds=flags.DEFINE_list("seeds", ["0"], "seeds of the RL runs (the warm start is one)"),
        trace_tasks=flags.DEFINE_integer("trace_tasks", 128, "scripted episodes per recipe and workflow"),
        noise=flags.DEFINE_float("noise", 0.5, "probability that a trace's reply carries random moves"))


if __name__ == "__main__":
    cli.command(main, _flags)
