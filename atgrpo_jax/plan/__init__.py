"""Will a training run fit, and how long will it take? `python -m atgrpo_jax.plan --config=CFG`.

  memory.py    the planner: per-device bytes of a run's phases, from the model and the sharding rules
  devices.py   the chips it plans for (TPU generations and slices, GPUs by memory)
  advice.py    what to change when a run does not fit
  command.py   the command (`--compile=TARGET` hands over to compile_cli.py)
"""
from atgrpo_jax.plan.advice import with_overrides  # noqa: F401  (used by scripts and tests)
from atgrpo_jax.plan.command import EXIT_DOES_NOT_FIT, EXIT_USAGE, main  # noqa: F401
