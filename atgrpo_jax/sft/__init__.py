"""Supervised warm start on chat data: `python -m atgrpo_jax.sft` (docs/guides/sft.md).

data.py reads, checks, tokenizes and packs the conversations; update.py is the loss and its jitted
step; loop.py the run (checkpoints, resume, metrics) in a train run's workdir layout, which
`train --config.model.init_from=DIR` starts from.
"""
