"""`python -m atgrpo_jax.train --config=configs/X.py --workdir=DIR [--config.key=value ...]`.

DIR is a local directory or an object-store URL (`gs://bucket/run`; needs
`pip install gcsfs google-cloud-storage`, checked before anything compiles).
The loop itself is `atgrpo_jax.train.loop.run_training`.
"""
from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml-collections config file", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory or gs:// URL for checkpoints, metrics and TensorBoard")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    from atgrpo_jax.train.loop import run_training

    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    run_training(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
