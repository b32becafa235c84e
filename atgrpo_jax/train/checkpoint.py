"""orbax checkpoints of the train state: keep the last M plus the best, never a NaN.

A checkpoint of step s is the directory `directory/s` with two orbax items:
`state` (the pytree of arrays: params, optimizer state, step, PRNG key data
saved as `jax.random.key_data` uint32 arrays) and `meta` (a small JSON dict:
the caller's `meta` and `metrics`). orbax writes a step into a temporary
directory and renames it when complete, so a process killed at any moment
(even `kill -9` in the middle of a save) leaves only complete steps plus, at
worst, a temporary directory that the next writing `Checkpointer` deletes
(in the background, finished before its first save). A reader of a live
run's directory (an evaluator) must pass `read_only=True`, or it would delete
the trainer's in-progress save.

Each step folder also holds `manifest.json` (manifest.py): every file's size and
content hash, written last; `restore` verifies it before any array is read.

Saves are asynchronous by default: `save` returns once the arrays are copied
off the device (the caller may then donate or delete them) and a background
thread writes them. `wait()` / `close()` block until it is done; the queries
(`latest_step`, `all_steps`, `best_step`) wait too, so they report complete
checkpoints only.

Retention: the last `keep_last` steps plus the best step by `best_metric`
(among steps saved with that metric; ties go to the later step), even when it
is older than the last `keep_last`. `keep_last` of 0 or None keeps every step.

Multi-host: every process calls every method (orbax coordinates them); only
the primary process writes the JSON item. A state with a NaN or inf leaf is
refused on all processes alike (the check reduces over the global arrays).

`directory` may be an object-store URL (`gs://bucket/run/checkpoints`): it is
passed to orbax unchanged (a relative local path is made absolute). On
`gs://` orbax commits a step with a marker file instead of a rename, writes
arrays through tensorstore, and needs `gcsfs` and `google-cloud-storage`
installed (checked here, with an error that names them).
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import shutil
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from atgrpo_jax import workdir as wd
from atgrpo_jax.train import manifest
from atgrpo_jax.train.manifest import CheckpointDamaged
from atgrpo_jax.train.orbax_quiet import quiet_orbax, quiet_orbax_leftovers

log = logging.getLogger(__name__)


def _is_float(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)


@jax.jit
def _all_finite(leaves):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def _host_finite(x) -> bool:
    a = np.asarray(x)
    return bool(np.all(np.isfinite(a if a.dtype.kind == "c" else a.astype(np.float64))))


def is_finite_state(tree) -> bool:
    """True when no floating leaf of `tree` holds a NaN or an inf (integer leaves always pass).

    Device arrays are reduced on their own devices, one jitted reduction per
    device set (per-role policies may live on disjoint pools); in a multi-host
    run the processes then agree through an all-gather, so all refuse together.
    """
    ok = True
    groups: dict[frozenset, list] = {}
    for x in jax.tree.leaves(tree):
        if not _is_float(x):
            continue
        if isinstance(x, jax.Array):
            groups.setdefault(frozenset(x.sharding.device_set), []).append(x)
        elif not _host_finite(x):
            ok = False
    me = jax.process_index()
    for devices, arrays in groups.items():
        if any(d.process_index == me for d in devices):  # only processes holding shards take part
            flag = _all_finite(arrays)  # a replicated scalar: read the local copy
            ok = ok and bool(np.asarray(flag.addressable_data(0)))
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        ok = bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))
    return ok


def _jsonable(obj: Any, where: str = "meta") -> Any:
    """A JSON-safe copy: numpy/jax scalars to Python, tuples to lists, non-finite floats to None."""
    if isinstance(obj, np.generic) or (isinstance(obj, (np.ndarray, jax.Array)) and np.ndim(obj) == 0):
        obj = np.asarray(obj).item()  # NumPy / JAX scalars to Python
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"{where}: JSON keys must be strings, got {k!r}")
            out[k] = _jsonable(v, f"{where}.{k}")
        return out
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if hasattr(obj, "to_dict"):  # ml_collections.ConfigDict
        return _jsonable(obj.to_dict(), where)
    raise TypeError(f"{where}: cannot store {type(obj).__name__} in checkpoint JSON")


def _check_no_typed_keys(tree):
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise TypeError(f"state{jax.tree_util.keystr(path)} is a typed PRNG key: "
                            "save jax.random.key_data(key) and rebuild it with jax.random.wrap_key_data")


def local_bytes(tree) -> int:
    """Bytes this process writes for `tree`: one copy of each of its array shards."""
    total = 0
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array):
            total += sum(s.data.nbytes for s in x.addressable_shards if s.replica_id == 0)
        else:
            total += np.asarray(x).nbytes
    return total


def check_free_space(directory: str, needed: int, margin: int = 1 << 20) -> None:
    """OSError(ENOSPC) when a local `directory` lacks room for `needed` bytes: found before orbax
    starts writing, since a save that runs out of space midway fails noisily in many threads."""
    if wd.is_remote(directory):
        return
    free = shutil.disk_usage(wd.nearest_existing(directory)).free
    if needed + margin > free:
        raise OSError(errno.ENOSPC, f"No space left on device (the checkpoint needs {needed / 2**20:.1f} MiB, "
                                    f"{free / 2**20:.1f} MiB free)")


def _abstract(target):
    """ShapeDtypeStructs (with shardings) for the jax.Array leaves of `target`; other leaves as given."""
    def leaf(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x
    return jax.tree.map(leaf, target)


class SaveError(Exception):
    """A checkpoint that could not be written (disk full, permissions); names the step and the cause."""

    def __init__(self, step: int | None, directory: str, cause: BaseException):
        what = f"checkpoint {step}" if step is not None else "a checkpoint"
        super().__init__(f"cannot save {what} to {directory}: {short_cause(cause)}")
        self.step = step


class Checkpointer:
    """A thin wrapper around `orbax.checkpoint.CheckpointManager`; see the module docstring.

    `save_every`: `save` writes only at steps that are multiples of it unless
    `force=True` (1, the default, saves whenever asked). `read_only`: restore
    and query only (saves are refused), touches nothing on disk.
    """

    def __init__(self, directory: str, *, keep_last: int | None, best_metric: str | None = "eval_success",
                 best_mode: str = "max", save_every: int = 1, async_save: bool = True,
                 read_only: bool = False):
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        if keep_last is not None and keep_last < 0:
            raise ValueError(f"keep_last must be >= 0 (0 keeps all), got {keep_last}")
        if save_every < 1:
            raise ValueError(f"save_every must be >= 1, got {save_every}")
        wd.require_support(directory, checkpoints=True)
        quiet_orbax()
        quiet_orbax_leftovers()
        self.directory = wd.absolute(directory)
        self.best_metric = best_metric
        self.best_mode = best_mode
        self.read_only = read_only
        self.save_every = save_every
        self._async = async_save
        policies = [ocp.checkpoint_managers.LatestN(n=keep_last or None)]
        best_fn = None
        if best_metric is not None:
            best_fn = lambda m: float(m[best_metric])  # noqa: E731 - orbax wants a callable
            policies.append(ocp.checkpoint_managers.BestN(get_metric_fn=best_fn, reverse=best_mode == "min",
                                                          n=1, keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=save_every,
            best_fn=best_fn,
            best_mode=best_mode,
            preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies),
            cleanup_tmp_directories=not read_only,  # leftovers of a killed save
            enable_async_checkpointing=async_save,
            # the manifest, written in the step's temporary folder before orbax renames it into place
            async_options=ocp.AsyncOptions(post_finalization_callback=self._write_manifest) if async_save else None,
            create=not read_only,
            read_only=read_only,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=("state", "meta", "extra"))
        self._in_flight: int | None = None  # the step of an asynchronous save not known to be done
        self._writing: int | None = None  # the step whose save is writing files (its manifest comes last)
        self._verified: set[int] = set()  # steps this object verified against their manifests

    # -- saving -----------------------------------------------------------------------------

    def save(self, step: int, state, *, meta: Mapping[str, Any], metrics: Mapping[str, Any] | None = None,
             force: bool = False, extra=None) -> bool:
        """Save `state` at `step`; returns whether a save started.

        Refused (False, logged) when the state holds a NaN or inf, when `step` is
        not after the latest checkpoint, or when it is off `save_every` and not
        `force`d. `meta` and `metrics` must be JSON-like (numpy scalars, tuples
        and ConfigDicts are converted; non-finite floats become null).
        """
        step = int(step)
        if self.read_only:
            log.warning("checkpoint step %d refused: %s was opened read-only", step, self.directory)
            return False
        _check_no_typed_keys(state)
        record = {"meta": _jsonable(meta, "meta"), "metrics": _jsonable(metrics or {}, "metrics")}
        json.dumps(record, allow_nan=False)  # fail here, not in the background thread
        self.wait()  # the previous save's error is reported with its own step (orbax's queries re-raise it raw)
        latest = self._manager.latest_step()
        if latest is not None and step <= latest:
            log.warning("checkpoint step %d refused: not after the latest checkpoint (step %d)", step, latest)
            return False
        if not force and step % self.save_every:
            return False
        if not is_finite_state(state):
            log.warning("checkpoint step %d refused: the state holds a NaN or inf", step)
            return False
        best = record["metrics"].get(self.best_metric) if self.best_metric else None
        tracked = {self.best_metric: best} if isinstance(best, (int, float)) else None
        try:
            check_free_space(self.directory, local_bytes(state) + local_bytes(extra or {}))
            items = dict(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(record))
            if extra is not None:  # arrays a resume needs besides the state (system.staleness: the sampler's)
                items["extra"] = ocp.args.StandardSave(extra)
            self._writing = step
            saved = self._manager.save(step, force=force, metrics=tracked, args=ocp.args.Composite(**items))
            if saved and not self._async:
                self._write_manifest(wd.join(self.directory, str(step)))
        except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
            raise SaveError(step, self.directory, e) from e
        self._in_flight = step if saved else None
        return bool(saved)

    def _write_manifest(self, step_dir: str | None = None):
        """The manifest of the step being saved, by the primary process (every process's files are written
        by now). Asynchronous saves: in the step's temporary folder, just before orbax renames it."""
        step = self._writing
        if step is None or jax.process_index() != 0:
            return
        if step_dir is None:
            pending = sorted(wd.as_epath(self.directory).glob(f"{step}.orbax-checkpoint-tmp*"))
            step_dir = str(pending[-1]) if pending else wd.join(self.directory, str(step))  # a store: in place
        manifest.write(step_dir, step)

    def wait(self):
        """Block until an in-flight asynchronous save is complete; SaveError if it failed."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            step, self._in_flight = self._in_flight, None
            raise SaveError(step, self.directory, e) from e
        self._in_flight = None

    def close(self):
        """Wait for in-flight saves (SaveError if one failed), then release orbax's resources."""
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- queries (complete checkpoints only) --------------------------------------------------

    def all_steps(self) -> list[int]:
        self.wait()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        self.wait()
        return self._manager.latest_step()

    def best_step(self) -> int | None:
        """The best kept step by `best_metric` (None if untracked or no step has it)."""
        if self.best_metric is None:
            return None
        self.wait()
        return self._manager.best_step()

    # -- restoring ----------------------------------------------------------------------------

    def _read_record(self, step: int) -> dict:
        restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return restored.meta

    def metrics(self, step: int) -> dict:
        """The metrics saved with `step`."""
        return self._read_record(step)["metrics"]

    def verify(self, step: int) -> None:
        """CheckpointDamaged, naming the file, unless the folder of `step` holds what its manifest lists
        (manifest.verify; checked once per step by this object)."""
        if step not in self._verified:
            manifest.verify(wd.join(self.directory, str(step)), step)
            self._verified.add(step)

    def newest_verified(self) -> int | None:
        """The newest step whose files verify (a "last good checkpoint"), None if none does."""
        for step in reversed(self.all_steps()):
            try:
                self.verify(step)
            except (CheckpointDamaged, OSError):
                continue
            return step
        return None

    def restore_extra(self, step: int, target):
        """The `extra` arrays saved with `step` in `target`'s structure (verified first), or None if it has none."""
        self.wait()
        self.verify(step)
        if not wd.exists(wd.join(self.directory, str(step), "extra")):
            return None
        restored = self._manager.restore(
            step, args=ocp.args.Composite(extra=ocp.args.StandardRestore(_abstract(target))))
        return restored.extra

    def saved_names(self, step: int | None = None) -> list[str]:
        """The top-level names of the state saved with `step` (default: the latest): a run's policies."""
        step = self.latest_step() if step is None else step
        reader = ocp.CheckpointManager(self.directory, item_handlers={"state": ocp.StandardCheckpointHandler()},
                                       options=ocp.CheckpointManagerOptions(read_only=True))
        return sorted(reader.item_metadata(step)["state"].keys())

    def restore(self, step: int | None = None, *, target=None) -> tuple[Any, dict]:
        """(state, meta) of `step` (default: the latest complete one).

        With `target` (a pytree of arrays or `jax.ShapeDtypeStruct`s with
        shardings, e.g. `jax.eval_shape` of the state init plus its shardings)
        the state comes back in the target's structure, dtypes and shardings, so
        a sharded state restores sharded. Without it, containers come back as
        orbax stores them (dicts and lists) on the saved devices. The step's files
        are verified against its manifest first (CheckpointDamaged names the file).
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        else:
            self.wait()
            if step not in self._manager.all_steps():
                raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}; "
                                        f"have {sorted(self._manager.all_steps())}")
        self.verify(step)  # before any array is read
        state_args = ocp.args.StandardRestore(None if target is None else _abstract(target))
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=state_args, meta=ocp.args.JsonRestore()))
        return restored.state, restored.meta["meta"]


def short_cause(e: BaseException) -> str:
    """One line for an error: the deepest OSError's message if there is one (disk full, permissions),
    else the error's first line."""
    seen, x = [], e
    while x is not None and x not in seen:
        seen.append(x)
        if isinstance(x, OSError) and x.strerror:
            return f"{x.strerror}" + (f": {x.filename}" if x.filename else "")
        code = re.search(r"os_error_code='(\d+)'", str(x))  # tensorstore's way of saying ENOSPC, EACCES...
        if code:
            return os.strerror(int(code.group(1)))
        x = x.__cause__ or x.__context__
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    text = text.split(" See full TensorStore details")[0]  # the rest is a repr of the whole spec
    return text if len(text) <= 200 else text[:200] + "..."
