"""The shipped configs; installed as `atgrpo_jax.configs`, so `--config=configs/demo.py` also works
from a directory that has no configs/ of its own (a pip install, not a checkout)."""
