"""`python -m atgrpo_jax.sft --config=configs/X.py --workdir=DIR --config.sft.train_path=FILE [--config.KEY=VALUE ...]`.

Supervised training on chat data (loss on the assistant tokens only) in a workdir laid out as a
`train` run of one shared policy: metrics.jsonl, TensorBoard, checkpoints, config.json. The same
command resumes it; `python -m atgrpo_jax.export --checkpoint=DIR` exports it and `train
--config.model.init_from=DIR` starts from it. The loop itself is `atgrpo_jax.sft.loop.run_sft`.
"""
from __future__ import annotations

from atgrpo_jax import cli
from atgrpo_jax.train.command import workdir_flags, workdir_main

main = workdir_main("sft", "atgrpo_jax.sft.loop:run_sft", not_read={
    "train.steps": "its length is sft.steps", "train.eval_every": "it evaluates every sft.eval_every steps",
    "train.eval_tasks": "it evaluates on all of sft.valid_path", "train.time_budget_s": "it runs sft.steps steps"})
_flags = workdir_flags(" (the data: --config.sft.train_path=FILE)")

if __name__ == "__main__":
    cli.command(main, _flags)
