"""Many JAX processes (hosts) as one run.

The layout (the usual one for RL on pods): the mesh's `data` axis spans the
processes and `fsdp`/`tensor` stay inside each process, so every process holds
a whole copy of each policy on its own devices.
- Rollout: each process samples its slice of the step's tasks with that local
  copy (`local_model`: no communication), then the samples of all processes are
  gathered (`gather_objects`; token ids, small) so every process builds the same
  mini-batches.
- Update: mini-batches become global arrays split over the mesh's batch axes
  (`global_array`); gradients are reduced by XLA's collectives.
In a single process every function here is the identity or a plain copy.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from atgrpo_jax.typed_config import Section, at_least, key, non_negative
from atgrpo_jax.sharding import logical_sharding

# XLA:CPU runs independent collectives of one program in any order per device;
# with several CPU devices in a process two devices can then block each other
# (seen here: an all-reduce and an all-gather of the FSDP update, about one run
# in three). Its sequential scheduler gives every device the same order. Set in
# XLA_FLAGS before the backend starts (the launcher and the tests do).
CPU_COLLECTIVES_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"

# Set by `atgrpo_jax.launch` (or by hand) when there is no config entry.
ENV_COORDINATOR = "ATGRPO_COORDINATOR"
ENV_NUM_PROCESSES = "ATGRPO_NUM_PROCESSES"
ENV_PROCESS_ID = "ATGRPO_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class DistributedSettings(Section):
    """The config's `distributed` section (atgrpo_jax/typed_config.py): several processes (hosts)."""

    PATH = "distributed"

    coordinator_address: str = key("", "host:port of process 0 (or ATGRPO_COORDINATOR)")
    num_processes: int = key(0, "processes in the run (0: from ATGRPO_NUM_PROCESSES, else 1)", check=non_negative)
    process_id: int = key(-1, "this process (-1: from ATGRPO_PROCESS_ID)", check=at_least(-1))
    auto: bool = key(False, "let jax.distributed find the hosts itself (TPU pods, SLURM; tpu_scripts/launch.sh, "
                     "slurm.sh and gke.sh set it: docs/clusters.md)")


def init_distributed(dist) -> None:
    """jax.distributed from the config, else from ATGRPO_* variables, else
    automatic where JAX can tell (TPU pods: num_processes > 1 without an address)."""
    address = dist.coordinator_address or os.environ.get(ENV_COORDINATOR, "")
    num = dist.num_processes or int(os.environ.get(ENV_NUM_PROCESSES, "0"))
    pid = dist.process_id if dist.process_id >= 0 else int(os.environ.get(ENV_PROCESS_ID, "-1"))
    if jax.distributed.is_initialized() or (not address and num <= 1 and not dist.auto):
        return
    if address:
        if num < 1 or not 0 <= pid < num:
            raise ValueError(f"distributed: coordinator {address!r} needs num_processes >= 1 and "
                             f"0 <= process_id < num_processes, got {num} and {pid}")
        # CPU devices of different processes talk through gloo (no effect on TPU/GPU).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(address, num, pid)
    else:
        jax.distributed.initialize()


def is_multiprocess() -> bool:
    return jax.process_count() > 1


def task_slice(num_tasks: int) -> slice:
    """This process's contiguous share of a step's tasks."""
    n, p = jax.process_count(), jax.process_index()
    if num_tasks % n:
        raise ValueError(f"{num_tasks} tasks cannot be split evenly over {n} processes")
    per = num_tasks // n
    return slice(p * per, (p + 1) * per)


def local_mesh(mesh: Mesh, process: int | None = None) -> Mesh:
    """The part of `mesh` on this process's devices (or `process`'s): its rows of the data axis.

    Raises if the process does not own whole data rows (fsdp or tensor crossing
    processes), since then no process holds a whole copy of the weights.
    """
    me = jax.process_index() if process is None else process
    data = mesh.axis_names.index("data")
    rows = np.moveaxis(mesh.devices, data, 0)
    mine = [i for i in range(rows.shape[0]) if any(d.process_index == me for d in rows[i].flat)]
    if not mine:
        raise ValueError(f"mesh {dict(mesh.shape)} has no device of process {me}: every process samples its share "
                         "of the tasks with every policy, so each policy's devices must include some of every "
                         "process's")
    if any(d.process_index != me for i in mine for d in rows[i].flat):
        raise ValueError(
            f"mesh {dict(mesh.shape)} over {len({d.process_index for d in mesh.devices.flat})} processes: "
            f"fsdp x tensor ({mesh.shape['fsdp']} x {mesh.shape['tensor']} devices) must stay inside one process "
            f"({sum(d.process_index == me for d in mesh.devices.flat)} devices) and data must be a multiple of "
            "the process count, "
            "so each process holds a whole copy of the policy for sampling")
    return Mesh(np.moveaxis(rows[mine], 0, data), mesh.axis_names, axis_types=mesh.axis_types)


def _local_leaf(x, mesh: Mesh):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return x
    spec = x.sharding.spec
    if any("data" in (s if isinstance(s, tuple) else (s,)) for s in spec if s is not None):
        raise ValueError(f"a weight of shape {x.shape} is split over the data axis ({spec})")
    return jax.make_array_from_single_device_arrays(
        x.shape, NamedSharding(mesh, spec), [s.data for s in x.addressable_shards])


def local_model(model: nnx.Module, mesh: Mesh | None) -> nnx.Module:
    """The same model viewed on this process's devices only (no copy, no
    communication); `mesh` from `local_mesh`, or None in a single process."""
    if mesh is None:
        return model
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: _local_leaf(x, mesh), state))


def gather_objects(obj: Any) -> list[Any]:
    """[obj of process 0, obj of process 1, ...] on every process (pickled bytes)."""
    if not is_multiprocess():
        return [obj]
    blob = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = multihost_utils.process_allgather(np.array([blob.size], np.int64))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:blob.size] = blob
    blobs = multihost_utils.process_allgather(padded)
    return [pickle.loads(blobs[i, :int(sizes[i, 0])].tobytes()) for i in range(len(blobs))]


def global_array(x: np.ndarray, mesh: Mesh, axes=("batch",)) -> jax.Array:
    """A host array every process holds in full, placed on `mesh` by logical
    `axes` (missing trailing axes are replicated)."""
    axes = tuple(axes) + (None,) * (x.ndim - len(axes))
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, logical_sharding(mesh, axes, x.shape), lambda idx: x[idx])


def to_host(x: jax.Array) -> np.ndarray:
    """The whole value of a (possibly multi-process) array as NumPy, on every process."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
