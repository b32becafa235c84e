"""`python -m atgrpo_jax.sft --config=configs/X.py --workdir=DIR --config.sft.train_path=FILE [--config.KEY=VALUE ...]`.

Supervised training on chat data (loss on the assistant tokens only) in a workdir laid out as a
`train` run of one shared policy: metrics.jsonl, TensorBoard, checkpoints, config.json. The same
command resumes it; `python -m atgrpo_jax.export --checkpoint=DIR` exports it and `train
--config.model.init_from=DIR` starts from it. The loop itself is `atgrpo_jax.sft.loop.run_sft`.
"""
from __future__ import annotations

import types

from absl import flags

from atgrpo_jax import cli
from atgrpo_jax.train.progress import say


def main(f, overrides=()):
    """The command (run by `cli.command`: flags parsed, errors as one line)."""
    if not f.workdir.value:
        raise cli.UsageError("--workdir is required")
    config = cli.config_from_args(f.config.value, overrides)
    say(f"sft {f.config.value} in {f.workdir.value}: loading jax and the trainer")
    from atgrpo_jax.sft.loop import run_sft  # (after the config: a bad one is refused in a second)

    run_sft(config, f.workdir.value, allow_config_change=f.allow_config_change.value,
            fresh_if_unreadable=f.fresh_if_unreadable.value)


def _flags() -> types.SimpleNamespace:
    """The command's flags (defined when it runs, so importing this module defines none)."""
    return types.SimpleNamespace(
        config=flags.DEFINE_string("config", None, "config file configs/X.py[:ARG]; set its keys with "
                                   "--config.KEY=VALUE (the data: --config.sft.train_path=FILE)"),
        workdir=flags.DEFINE_string("workdir", None, "directory or gs:// URL for checkpoints, metrics and "
                                    "TensorBoard"),
        allow_config_change=flags.DEFINE_bool("allow_config_change", False, "resume a run with a config that "
                                              "differs from its own (its config.json is kept as config.step<N>.json)"),
        fresh_if_unreadable=flags.DEFINE_bool("fresh_if_unreadable", False, "when no checkpoint of the workdir "
                                              "restores, start again from step 0 (they are moved to "
                                              "checkpoints.unreadable/) instead of stopping"))


if __name__ == "__main__":
    cli.command(main, _flags)
