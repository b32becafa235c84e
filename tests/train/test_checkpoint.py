"""Checkpoints: bitwise round trips (also onto a sharded target), retention, the NaN guard, kill -9."""
import glob
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
import optax
from flax import nnx
import pytest

from atgrpo_jax.sharding import MeshSettings, logical_sharding, make_mesh, sub_meshes
from atgrpo_jax.train.checkpoint import Checkpointer, is_finite_state

WORKER = os.path.join(os.path.dirname(__file__), "ckpt_kill_worker.py")
_spec = importlib.util.spec_from_file_location("ckpt_kill_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


class TrainState(NamedTuple):
    params: Any
    opt_state: Any
    step: Any


class TinyModule(nnx.Module):
    def __init__(self, rng):
        self.kernel = nnx.Param(jnp.asarray(rng.standard_normal((4, 3)), jnp.float32))
        self.lora_a = nnx.Param(jnp.zeros((4, 2), jnp.bfloat16))


def assert_bitwise(got, want):
    """Same tree structure, dtypes, shapes and bytes (so -0.0 != 0.0 and NaN payloads count)."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, jax.tree_util.keystr(path)
        assert g.tobytes() == w.tobytes(), jax.tree_util.keystr(path)


def example_state(seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    w[0, :4] = [-0.0, 1e-45, -3.4e38, 1.17e-38]  # signed zero, subnormal, extremes
    params = {"w": jnp.asarray(w), "emb": jnp.asarray(rng.standard_normal((5, 4)).astype(ml_dtypes.bfloat16)),
              "layers": {"norm": {"scale": jnp.ones((4,), jnp.float32)}}}
    # A real AdamW state's structure, with non-trivial moments (set from NumPy: no compiles).
    opt_state = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)).init(params)
    opt_state = jax.tree.map(
        lambda x: jnp.asarray(rng.standard_normal(x.shape).astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                              else np.asarray(x) + 3), opt_state)
    return {"train": TrainState(params, opt_state, jnp.int32(7)),
            "key": jax.random.key_data(jax.random.key(seed)),
            "misc": {"counts": jnp.arange(5, dtype=jnp.int32), "flag": jnp.array([True, False])},
            "nnx_params": nnx.split(TinyModule(rng), nnx.Param)[1]}  # an nnx.State, as the trainer holds


def test_round_trip_is_bitwise_with_and_without_target(tmp_path):
    state = example_state()
    meta = {"data_position": np.int64(96), "buckets": (8, 16), "config": ml_collections.ConfigDict({"lr": 1e-6, "name": "demo"}),
            "done": np.bool_(True), "elapsed": jnp.float32(2.5)}
    with Checkpointer(str(tmp_path), keep_last=3) as ckpt:
        assert ckpt.save(7, state, meta=meta, metrics={"loss": 0.5, "bad": float("nan")})
    ckpt = Checkpointer(str(tmp_path), keep_last=3)  # a fresh process's view
    assert ckpt.latest_step() == 7 and ckpt.all_steps() == [7]
    restored, got_meta = ckpt.restore(target=state)
    assert_bitwise(restored, state)
    assert isinstance(restored["train"], TrainState) and isinstance(restored["nnx_params"], nnx.State)
    assert got_meta == {"data_position": 96, "buckets": [8, 16], "config": {"lr": 1e-6, "name": "demo"},
                        "done": True, "elapsed": 2.5}
    assert ckpt.metrics(7) == {"loss": 0.5, "bad": None}
    # Without a target: plain containers, same leaves.
    raw, _ = ckpt.restore(7)
    assert_bitwise(raw["train"]["params"], state["train"].params)
    assert_bitwise(raw["key"], state["key"])
    assert np.asarray(raw["train"]["step"]).item() == 7
    # An abstract target works as well as a concrete one.
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    assert_bitwise(ckpt.restore(7, target=abstract)[0], state)
    ckpt.close()


def _sharded_target(mesh, values, axes):
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=logical_sharding(mesh, axes[k], v.shape))
            for k, v in values.items()}


def test_restore_onto_sharded_target_on_a_2x2x2_mesh(tmp_path):
    mesh = make_mesh(MeshSettings(data=2, fsdp=2, tensor=2))
    rng = np.random.default_rng(1)
    values = {"wq": rng.standard_normal((16, 8)).astype(np.float32),
              "emb": rng.standard_normal((12, 16)).astype(ml_dtypes.bfloat16),
              "acts": rng.standard_normal((8, 5)).astype(np.float32),
              "step": np.int32(3)}
    axes = {"wq": ("embed", "mlp"), "emb": ("vocab", "embed"), "acts": ("batch", None), "step": ()}
    target = _sharded_target(mesh, values, axes)
    with Checkpointer(str(tmp_path), keep_last=2) as ckpt:  # saved from one device
        ckpt.save(1, {k: jnp.asarray(v) for k, v in values.items()}, meta={})
        restored, _ = ckpt.restore(1, target=target)
    for k, v in values.items():
        r = restored[k]
        assert r.sharding.is_equivalent_to(target[k].sharding, r.ndim), k
        assert r.dtype == v.dtype and np.asarray(r).tobytes() == v.tobytes(), k
        for shard in r.addressable_shards:  # each device holds exactly its slice
            assert np.asarray(shard.data).tobytes() == np.asarray(v[shard.index]).tobytes()
    assert restored["wq"].sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert restored["acts"].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)
    assert len(restored["wq"].addressable_shards[0].data.flatten()) == 16 * 8 // 4

    # Saved sharded, restored onto a different layout.
    other = _sharded_target(mesh, values, {"wq": ("mlp", "embed"), "emb": ("embed", "vocab"),
                                           "acts": (None, None), "step": ()})
    with Checkpointer(str(tmp_path / "resharded"), keep_last=2) as ckpt:
        ckpt.save(2, restored, meta={})
        again, _ = ckpt.restore(2, target=other)
    for k, v in values.items():
        assert again[k].sharding.is_equivalent_to(other[k].sharding, again[k].ndim), k
        assert np.asarray(again[k]).tobytes() == v.tobytes(), k


def kept_reference(values, keep_last, mode):
    """Steps a keep-last-M-plus-best policy must hold after saving `values` (None = no metric)."""
    steps = list(range(1, len(values) + 1))
    kept = set(steps[-keep_last:])
    scored = [(v if mode == "max" else -v, s) for s, v in zip(steps, values) if v is not None]
    best = max(scored)[1] if scored else None  # ties: the later step
    return kept | ({best} if best else set()), best


@pytest.mark.parametrize("mode", ["max", "min"])
def test_keeps_last_m_plus_best_across_a_reopen(tmp_path, mode):
    rng = np.random.default_rng({"max": 0, "min": 1}[mode])
    for trial in range(2):
        n = 9
        values = [None if rng.random() < 0.3 else float(rng.integers(0, 4)) / 4 for _ in range(n)]
        directory = str(tmp_path / f"t{trial}")
        ckpt = Checkpointer(directory, keep_last=2, best_metric="eval_success", best_mode=mode)
        for step, v in enumerate(values, 1):
            if step == 5:  # a resumed run must still honour the best from before
                ckpt.close()
                ckpt = Checkpointer(directory, keep_last=2, best_metric="eval_success", best_mode=mode)
            metrics = {"loss": 1.0} if v is None else {"eval_success": v}
            assert ckpt.save(step, {"x": jnp.full((3,), step, jnp.float32)}, meta={"s": step}, metrics=metrics)
        want_kept, want_best = kept_reference(values, 2, mode)
        assert set(ckpt.all_steps()) == want_kept, values
        assert ckpt.best_step() == want_best, values
        assert sorted(os.listdir(directory)) == sorted(str(s) for s in want_kept)  # really deleted
        ckpt.close()


def test_keep_last_zero_keeps_all_and_no_best_metric(tmp_path):
    with Checkpointer(str(tmp_path), keep_last=0, best_metric=None) as ckpt:
        for step in range(1, 6):
            ckpt.save(step, {"x": jnp.zeros(2)}, meta={}, metrics={"eval_success": 0.1})
        assert ckpt.all_steps() == [1, 2, 3, 4, 5]
        assert ckpt.best_step() is None


def test_non_finite_state_is_refused(tmp_path, caplog):
    good = example_state()
    assert is_finite_state(good)
    bad_f32 = jax.tree.map(lambda x: x, good)
    bad_f32["train"].params["w"] = good["train"].params["w"].at[3, 2].set(jnp.nan)
    bad_bf16 = jax.tree.map(lambda x: x, good)
    bad_bf16["train"].params["emb"] = good["train"].params["emb"].at[0, 0].set(-jnp.inf)
    bad_opt = {"mu": np.array([1.0, np.inf], np.float32), "count": np.int32(1)}  # host numpy leaf
    mesh = make_mesh(MeshSettings(data=2, fsdp=2, tensor=2))
    sharded = jax.device_put(jnp.arange(64, dtype=jnp.float32).at[63].set(jnp.nan).reshape(8, 8),
                             logical_sharding(mesh, ("batch", "embed"), (8, 8)))
    assert len(sharded.sharding.device_set) == 8
    for bad in (bad_f32, bad_bf16, bad_opt, {"p": sharded}):
        assert not is_finite_state(bad)
    # Per-role policies on disjoint device pools: one reduction per pool.
    pool_a, pool_b = sub_meshes(mesh, 2)
    on_a = jax.device_put(jnp.ones((4, 4)), logical_sharding(pool_a, ("embed", None), (4, 4)))
    on_b = jax.device_put(jnp.ones((4, 4)), logical_sharding(pool_b, ("embed", None), (4, 4)))
    assert not (on_a.sharding.device_set & on_b.sharding.device_set)
    assert is_finite_state({"a": on_a, "b": on_b})
    assert not is_finite_state({"a": on_a, "b": on_b.at[1, 1].set(jnp.inf)})
    ckpt = Checkpointer(str(tmp_path), keep_last=2)
    assert ckpt.save(1, good, meta={})
    with caplog.at_level(logging.WARNING, logger="atgrpo_jax.train.checkpoint"):
        for step, bad in enumerate((bad_f32, bad_bf16, bad_opt, {"p": sharded}), 2):
            assert ckpt.save(step, bad, meta={}) is False
    assert sum("NaN or inf" in r.getMessage() for r in caplog.records) == 4
    assert ckpt.all_steps() == [1] and sorted(os.listdir(tmp_path)) == ["1"]
    ckpt.close()


def test_save_refusals_interval_and_force(tmp_path):
    ckpt = Checkpointer(str(tmp_path), keep_last=5, save_every=5, async_save=False)
    x = {"x": jnp.ones(2)}
    assert ckpt.save(5, x, meta={})
    assert not ckpt.save(5, x, meta={})  # already saved
    assert not ckpt.save(3, x, meta={})  # before the latest
    assert not ckpt.save(7, x, meta={})  # off the interval
    assert ckpt.save(7, x, meta={}, force=True)  # e.g. the final step
    assert ckpt.save(10, x, meta={})
    assert ckpt.all_steps() == [5, 7, 10]
    with pytest.raises(TypeError, match=r"meta\.cfg\.fn"):
        ckpt.save(15, x, meta={"cfg": {"fn": object()}})
    with pytest.raises(TypeError, match="key_data"):
        ckpt.save(15, {"rng": jax.random.key(0)}, meta={})
    with pytest.raises(FileNotFoundError, match="step 4"):
        ckpt.restore(4)
    ckpt.close()
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        Checkpointer(str(tmp_path / "empty"), keep_last=1).restore()
    with pytest.raises(ValueError, match="best_mode"):
        Checkpointer(str(tmp_path / "x"), keep_last=1, best_mode="best")


def test_relative_directory_is_made_absolute_and_urls_are_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with Checkpointer("run/checkpoints", keep_last=1, async_save=False) as ckpt:
        assert ckpt.directory == str(tmp_path / "run" / "checkpoints")
        assert ckpt.save(1, {"x": jnp.arange(3.0)}, meta={"step": 1})
    monkeypatch.chdir(tmp_path / "run")  # the saved path does not depend on the working directory
    state, meta = Checkpointer(str(tmp_path / "run" / "checkpoints"), keep_last=1, read_only=True).restore()
    assert meta == {"step": 1} and np.array_equal(np.asarray(state["x"]), np.arange(3.0))
    with pytest.raises(ValueError, match="unsupported URL scheme ftp://"):
        Checkpointer("ftp://host/run/checkpoints", keep_last=1)


def test_async_save_survives_deleting_the_arrays(tmp_path):
    """save() returns once arrays are off the device: the trainer may donate them right away."""
    state = {"w": jnp.asarray(np.random.default_rng(3).standard_normal((256, 256)), jnp.float32)}
    want = np.asarray(state["w"]).copy()
    with Checkpointer(str(tmp_path), keep_last=1) as ckpt:
        assert ckpt.save(1, state, meta={})
        state["w"].delete()  # what buffer donation does
        ckpt.wait()
        restored, _ = ckpt.restore(1)
    assert np.asarray(restored["w"]).tobytes() == want.tobytes()


# ---- kill -9 ---------------------------------------------------------------------------------

def _tmp_dirs(directory):
    return [p for p in glob.glob(os.path.join(directory, "*")) if "tmp" in os.path.basename(p)]


def _saving(directory, step):
    return bool(glob.glob(os.path.join(directory, f"{step}.orbax-checkpoint-tmp*")))


def _complete_steps(directory):
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []


def _wait_for(cond, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"worker exited early: {proc.returncode} {proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the worker")
        time.sleep(0.002)


def _start_worker(directory, total, wait_each_save=False):
    return subprocess.Popen([sys.executable, WORKER, directory, str(total), str(int(wait_each_save))],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _check_resumable(directory, killed_in_save):
    """A fresh Checkpointer's latest step is complete and holds exactly what was saved then."""
    leftovers = [int(os.path.basename(p).split(".")[0]) for p in _tmp_dirs(directory)]
    assert bool(leftovers) == killed_in_save, leftovers
    ckpt = Checkpointer(directory, keep_last=2, best_metric="eval_success", read_only=True)
    latest = ckpt.latest_step()
    assert latest is not None
    if leftovers:
        assert leftovers == [latest + 1]  # the in-flight save was the next one
    state, meta = ckpt.restore()
    assert_bitwise(state, worker.make_state(latest))
    assert meta == worker.make_meta(latest)
    assert {latest, latest - 1} - {0} <= set(ckpt.all_steps())  # the last two are kept
    ckpt.close()
    return latest


def test_kill_9_during_saves_and_steps_resumes_from_the_last_complete_checkpoint(tmp_path):
    directory, total = str(tmp_path / "ckpt"), 8

    # 1. Killed the moment a save's temporary directory appears (early in the save).
    proc = _start_worker(directory, total)
    _wait_for(lambda: _complete_steps(directory) and _tmp_dirs(directory), proc)
    _kill(proc)
    first = _check_resumable(directory, killed_in_save=True)

    # 2. Killed a third of the way through a save, timed on the save before it
    #    (by step: the killed save's leftover is only removed at this run's first save).
    proc = _start_worker(directory, total)
    _wait_for(lambda: _saving(directory, first + 2), proc)
    began = time.monotonic()
    _wait_for(lambda: not _saving(directory, first + 2), proc)
    duration = time.monotonic() - began
    _wait_for(lambda: _saving(directory, first + 3), proc)
    time.sleep(duration / 3)
    _kill(proc)
    second = _check_resumable(directory, killed_in_save=bool(_tmp_dirs(directory)))
    assert second > first

    # 3. Killed between saves (in the middle of a training step): this run waits
    #    for each save, so after a step's directory appears no save is running.
    proc = _start_worker(directory, total, wait_each_save=True)
    _wait_for(lambda: max(_complete_steps(directory)) > second and not _tmp_dirs(directory), proc)
    _kill(proc)
    third = _check_resumable(directory, killed_in_save=False)
    assert third > second

    # 4. The resumed run finishes; retention is exactly the last 2 plus the best (step 3).
    proc = _start_worker(directory, total)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert f"start {third}" in out and "done" in out
    ckpt = Checkpointer(directory, keep_last=2, best_metric="eval_success")
    assert ckpt.all_steps() == [3, 7, 8] and ckpt.best_step() == 3
    assert sorted(os.listdir(directory)) == ["3", "7", "8"]  # killed saves' leftovers were removed
    assert_bitwise(ckpt.restore(3)[0], worker.make_state(3))
    ckpt.close()
