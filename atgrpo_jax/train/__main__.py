"""`python -m atgrpo_jax.train --config=configs/X.py --workdir=DIR [--config.KEY=VALUE ...]`.

DIR is a local directory or an object-store URL (`gs://bucket/run`; needs
`pip install gcsfs google-cloud-storage`, checked before anything compiles).
The loop itself is `atgrpo_jax.train.loop.run_training`.
"""
from __future__ import annotations

from atgrpo_jax import cli
from atgrpo_jax.train.command import workdir_flags, workdir_main

main = workdir_main("train", "atgrpo_jax.train.loop:run_training", not_read={
    "sft.": "sft.* are the supervised command's keys (python -m atgrpo_jax.sft)"})
_flags = workdir_flags()

if __name__ == "__main__":
    cli.command(main, _flags)
