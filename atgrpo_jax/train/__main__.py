"""`python -m atgrpo_jax.train --config=configs/X.py --workdir=DIR [--config.KEY=VALUE ...]`.

DIR is a local directory or an object-store URL (`gs://bucket/run`; needs
`pip install gcsfs google-cloud-storage`, checked before anything compiles).
The loop itself is `atgrpo_jax.train.loop.run_training`.
"""
from __future__ import annotations

import sys

from absl import app, flags, logging

from atgrpo_jax import cli

_CONFIG = flags.DEFINE_string("config", None, "config file configs/X.py[:ARG]; set its keys with --config.KEY=VALUE")
_WORKDIR = flags.DEFINE_string("workdir", None, "directory or gs:// URL for checkpoints, metrics and TensorBoard")
_ALLOW = flags.DEFINE_bool("allow_config_change", False, "resume a run with a config that differs from its own "
                           "(its config.json is kept as config.step<N>.json)")
_FRESH = flags.DEFINE_bool("fresh_if_unreadable", False, "when no checkpoint of the workdir restores, start again "
                           "from step 0 (they are moved to checkpoints.unreadable/) instead of stopping")


def main(argv, overrides=()):
    from atgrpo_jax.train.loop import run_training

    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    with cli.fail():
        if not _WORKDIR.value:
            raise cli.UsageError("--workdir is required")
        config = cli.config_from_args(_CONFIG.value, overrides)
        run_training(config, _WORKDIR.value, allow_config_change=_ALLOW.value,
                     fresh_if_unreadable=_FRESH.value)


if __name__ == "__main__":
    with cli.fail():
        _overrides, _argv = cli.pop_overrides(sys.argv)
    app.run(lambda argv: main(argv, _overrides), argv=_argv, flags_parser=cli.parse_flags)
