"""Subprocess of test_checkpoint's kill -9 test: a stand-in training loop.

`python ckpt_kill_worker.py DIR TOTAL_STEPS [WAIT]` resumes from the latest
complete checkpoint in DIR (checking it equals what was saved), then saves a
~24 MB state at every step up to TOTAL_STEPS; with WAIT=1 it waits for each
save to finish before the rest of its step (so there is a gap between saves). Every state is a pure function of its
step, so the test can recompute what any checkpoint must hold.
"""
from __future__ import annotations

import functools
import sys
import time

import numpy as np

N_BIG = 6_000_000  # float32: 24 MB, so a save takes long enough to be killed inside


@functools.lru_cache(maxsize=1)
def _base() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(N_BIG, dtype=np.float32)


def make_state(step: int) -> dict:
    """The state of `step` as numpy arrays (params, optimizer moments, step, key data)."""
    import ml_dtypes

    rng = np.random.default_rng(1000 + step)
    return {
        "params": {"big": _base() + np.float32(step),
                   "small_bf16": rng.standard_normal(4096).astype(ml_dtypes.bfloat16)},
        "opt_state": {"mu": rng.standard_normal(2048, dtype=np.float32), "count": np.int32(step)},
        "step": np.int32(step),
        "key": np.array([step, 7 * step + 1], np.uint32),
    }


def make_meta(step: int) -> dict:
    return {"step": step, "data_position": 32 * step, "config": {"seed": 0, "buckets": [8, 16]}}


def make_metrics(step: int) -> dict:
    """eval_success only every 3rd step: 5/6 at step 3 is the best until step 12."""
    return {"loss": 1.0 / step, **({"eval_success": (4 * step % 7) / 6} if step % 3 == 0 else {})}


def main(directory: str, total_steps: int, wait_each_save: bool = False) -> int:
    import jax
    import jax.numpy as jnp

    from atgrpo_jax.train.checkpoint import Checkpointer

    ckpt = Checkpointer(directory, keep_last=2, best_metric="eval_success")
    start = ckpt.latest_step() or 0
    if start:
        state, meta = ckpt.restore(start)
        want = make_state(start)
        same = jax.tree.map(lambda a, b: np.asarray(a).tobytes() == np.asarray(b).tobytes(), state, want)
        if not all(jax.tree.leaves(same)) or meta != make_meta(start):
            print(f"resume from {start}: restored state differs", flush=True)
            return 3
    print(f"start {start}", flush=True)
    for step in range(start + 1, total_steps + 1):
        state = jax.tree.map(jnp.asarray, make_state(step))
        if not ckpt.save(step, state, meta=make_meta(step), metrics=make_metrics(step)):
            print(f"save {step} refused", flush=True)
            return 4
        if wait_each_save:
            ckpt.wait()
        print(f"saved {step}", flush=True)
        time.sleep(0.05)  # the rest of a training step
    ckpt.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "1"))
