"""The trainer as `python -m atgrpo_jax.train` runs it, without the free-space check before each save:
a disk that another writer fills after the check, so orbax itself runs out of space mid-save."""
import runpy
import sys

from atgrpo_jax.train import checkpoint

checkpoint.check_free_space = lambda *args, **kwargs: None
sys.argv = ["atgrpo_jax.train"] + sys.argv[1:]
runpy.run_module("atgrpo_jax.train", run_name="__main__", alter_sys=True)
