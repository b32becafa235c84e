"""`python -m atgrpo_jax.bench <name> [flags]`: run one benchmark.

Each benchmark is a module of this package with a `main(argv)` function; it
runs this project and its baseline side by side in one process and prints
ratios, with a JSON line last when asked (`--json`).
"""
import importlib
import sys

BENCHMARKS = {
    "envs": "atgrpo_jax.bench.envs",
    "sampler": "atgrpo_jax.bench.sampler",
    "train": "atgrpo_jax.bench.train",
    "e2e": "atgrpo_jax.bench.e2e",
    "sandbox": "atgrpo_jax.bench.sandbox",
    "system": "atgrpo_jax.bench.system",
    "attention": "atgrpo_jax.bench.attention",
    "device": "atgrpo_jax.bench.device",
    "trl": "atgrpo_jax.bench.trl",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        names = ", ".join(sorted(BENCHMARKS))
        print(f"usage: python -m atgrpo_jax.bench {{{names}}} [flags]", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(BENCHMARKS[argv[0]])
    except ModuleNotFoundError as e:
        if e.name != BENCHMARKS[argv[0]]:
            raise
        print(f"benchmark {argv[0]!r} is not built yet", file=sys.stderr)
        return 2
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
