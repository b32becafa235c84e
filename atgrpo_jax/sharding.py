"""Meshes, logical-axis rules and device pools.

One mesh with named axes (data, fsdp, tensor). Arrays name their dimensions
with *logical* axes (batch, embed, heads, ...); `RULES` maps each logical axis
to mesh axes. A mapping is dropped for a dimension it does not divide, so tiny
test models run on any mesh (they are replicated where they cannot be split).

Axis types are `Auto` on purpose: parameters, optimizer state, activations
and the KV cache get shardings at jit boundaries and a few activation
constraints, and XLA's propagation handles the rest, so model code carries no
per-op sharding annotations.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import numpy as np

from atgrpo_jax.typed_config import Section, key
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axes it is split over (in order), or () for replicated.
RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "seq": (),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "head_dim": (),
    "mlp": ("tensor",),
    "vocab": ("tensor",),
    "layers": (),
    "norm": (),
    "cache_seq": (),
    "lora_rank": (),
}

# The trained state (weights, AdamW moments) of a policy whose mesh spans several data rows (hosts):
# split over every device of the mesh, the data axis too, since nothing samples from it directly;
# the sampler's copy follows RULES, a whole one per data row (train/policies.py).
TRAIN_RULES: dict[str, tuple[str, ...]] = {**RULES, "embed": ("fsdp", "data")}

# What a decode step reads, gathered once per sampling call (model.decode_gather): whole over fsdp, so a
# step needs no weight collectives; split over tensor as the weights are.
GATHERED_RULES: dict[str, tuple[str, ...]] = {**RULES, "embed": ()}


@dataclasses.dataclass(frozen=True)
class MeshSettings(Section):
    """Sizes of the mesh axes (the config's `mesh` section); one of them may be -1 (all remaining devices),
    and data may be 0: one row per host (the processes the devices belong to), so each host holds a whole
    copy of each policy to sample with (distributed.py).

    Without a -1 the mesh may use fewer devices than there are (the first ones):
    a tiny model on one device of eight, or a policy's pool.
    """

    PATH = "mesh"

    data: int = key(0, "data-parallel axis: spans hosts; each data row holds a whole copy of each policy (0: one "
                    "row per host, so each host samples with its own copy)")
    fsdp: int = key(-1, "parameters, optimizer state and batch split over this axis")
    tensor: int = key(1, "heads, MLP and vocabulary split over this axis")

    def check(self):
        for name in MESH_AXES:
            v = getattr(self, name)
            self.require(v > 0 or v == -1 or (name == "data" and v == 0), name,
                         f"must be > 0 or -1{' (or 0: one row per host)' if name == 'data' else ''}, got {v!r}")

    def resolve(self, num_devices: int, hosts: int = 1) -> dict[str, int]:
        sizes = {"data": self.data or hosts, "fsdp": self.fsdp, "tensor": self.tensor}  # each checked in `check`
        fill = [n for n, s in sizes.items() if s == -1]
        if len(fill) > 1:
            raise ValueError(f"only one mesh axis may be -1, got {fill}")
        fixed = math.prod(s for s in sizes.values() if s != -1)
        if fill:
            if num_devices % fixed:
                raise ValueError(f"mesh axes {sizes} cannot fill {num_devices} devices: "
                                 f"{num_devices} is not a multiple of {fixed}")
            sizes[fill[0]] = num_devices // fixed
        if math.prod(sizes.values()) > num_devices:
            raise ValueError(f"mesh data*fsdp*tensor = {math.prod(sizes.values())} "
                             f"({sizes}) but there are only {num_devices} devices")
        return sizes


def make_mesh(config: MeshSettings | dict | None = None, devices: Sequence[Any] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all devices)."""
    if config is None:
        config = MeshSettings()
    elif isinstance(config, dict):
        unknown = set(config) - set(MESH_AXES)
        if unknown:
            raise ValueError(f"unknown mesh axes {sorted(unknown)}; known: {list(MESH_AXES)}")
        config = MeshSettings(**config)
    devices = list(jax.devices() if devices is None else devices)
    sizes = config.resolve(len(devices), len({d.process_index for d in devices}))
    shape = tuple(sizes[a] for a in MESH_AXES)
    grid = np.asarray(devices[:math.prod(shape)], dtype=object).reshape(shape)
    return Mesh(grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def pool_sizes(sizes: dict[str, int], num_pools: int, hosts: int = 1) -> dict[str, int]:
    """Mesh sizes of one of `num_pools` equal pools cut from a mesh of `sizes` over `hosts` processes.

    Each data row (one process's devices on a pod) is cut into pools, so every
    pool keeps the data axis and each process holds a copy of every policy; a
    pool keeps as much of the tensor axis as fits. In one process, if rows cannot
    be cut, whole data rows go to each pool instead. Over several processes they
    cannot: each process samples its share of the tasks with every policy, so
    every pool needs devices on every process (distributed.local_mesh).
    """
    row = sizes["fsdp"] * sizes["tensor"]
    if num_pools > 0 and row % num_pools == 0:
        per = row // num_pools
        tensor = math.gcd(sizes["tensor"], per)
        return {"data": sizes["data"], "fsdp": per // tensor, "tensor": tensor}
    if hosts > 1:
        raise ValueError(f"cannot split a mesh of {sizes} over {hosts} hosts into {num_pools} pools with devices "
                         f"on every host (each host samples its share of the tasks with every policy): a host's "
                         f"fsdp*tensor ({row}) is not a multiple of {num_pools}")
    if num_pools > 0 and sizes["data"] % num_pools == 0:
        return dict(sizes, data=sizes["data"] // num_pools)
    raise ValueError(f"cannot split a mesh of {sizes} into {num_pools} equal pools: neither fsdp*tensor "
                     f"({row}) nor data ({sizes['data']}) is a multiple of {num_pools}")


def physical_order(devices) -> list:
    """A data row's devices (one host's chips) in the order that cuts into compact blocks: TPU chips sorted
    along the longest axis of their grid (the first on a tie), so equal runs of them are sub-grids; devices
    without coordinates as they are. On a v5p host (a 2x2 plane) the halves are chips {0, 2} and {1, 3};
    on a v6e-8 host (2x4), {0..3} and {4..7}. (libtpu 0.0.42 fails internal checks compiling collectives
    over other cuts of these hosts, e.g. v5p's {2, 3} of every host of a v5p-32, v6e's {0, 2, 4, 6}:
    docs/guides/tpu.md.)"""
    coords = [getattr(d, "coords", None) for d in devices]
    if any(c is None for c in coords):
        return list(devices)
    grid = np.asarray(coords)
    extent = grid.max(0) - grid.min(0)
    axis = int(np.argmax(extent))  # argmax takes the first of equal extents
    order = np.lexsort(tuple(grid[:, a] for a in reversed(range(grid.shape[1])) if a != axis) + (grid[:, axis],))
    return [devices[i] for i in order]


def sub_meshes(mesh: Mesh, num_pools: int) -> list[Mesh]:
    """Split a mesh's devices into `num_pools` disjoint pools of equal size (see pool_sizes): each data row
    in compact blocks of its chips (`physical_order`), or whole data rows per pool."""
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
    pool = pool_sizes(sizes, num_pools, hosts=len({getattr(d, "process_index", 0) for d in mesh.devices.flat}))
    rows = mesh.devices.reshape(sizes["data"], -1)  # [data, fsdp*tensor]
    if pool["data"] == sizes["data"]:
        rows = np.asarray([physical_order(list(row)) for row in rows], dtype=object)
        per = rows.shape[1] // num_pools
        blocks = [rows[:, i * per:(i + 1) * per] for i in range(num_pools)]
    else:
        blocks = [rows[i * pool["data"]:(i + 1) * pool["data"]] for i in range(num_pools)]
    shape = tuple(pool[a] for a in MESH_AXES)
    return [Mesh(b.reshape(shape), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))
            for b in blocks]


# libtpu 0.0.42's multi-colour all-reduce (its rotated-pincer emitter) aborts compiling an all-reduce over
# the chips of a 1x2x2 sub-grid that lies off the slice's origin along its flat axis (a failed CHECK
# "get_loop_bound(color) == loop_bound (0 vs. 4)"): the second pool of a v5p-16 (2x2x2), the chips
# with x = 1, and any 1x2x2 block with x or y = 1 of a larger v5p slice. Without the colours of that
# algorithm the same all-reduce compiles as a two-colour ring over the pool's links; the first pool and
# the pools of other shapes keep the compiler's default (docs/results/tpu.md).
NO_MULTI_COLOR_ALL_REDUCE = {"xla_jf_use_multi_colors_in_all_reduce_if_supported": False}


def pool_compiler_options(mesh) -> dict[str, Any]:
    """XLA options for the programs compiled on a policy pool's `mesh` (its update and log-probs, whose
    gradients and gathered embedding are all-reduced over every chip of the pool): the multi-colour
    all-reduce off for the TPU sub-grids libtpu aborts on (NO_MULTI_COLOR_ALL_REDUCE), else none."""
    devices = list(getattr(mesh, "devices", np.asarray([])).flat)
    coords = [getattr(d, "coords", None) for d in devices]
    if not devices or any(c is None for c in coords) or platform_of(mesh) != "tpu":
        return {}
    grid = np.asarray(coords)
    low, extent = grid.min(0), grid.max(0) - grid.min(0) + 1
    if len({tuple(c) for c in grid.tolist()}) != len(devices) or math.prod(extent) != len(devices):
        return {}  # not a sub-grid (or two cores per chip)
    flat_off_origin = any(e == 1 and lo > 0 for e, lo in zip(extent[:2], low[:2]))  # along x or y
    return dict(NO_MULTI_COLOR_ALL_REDUCE) if flat_off_origin and sorted(e for e in extent if e > 1) == [2, 2] else {}


def logical_spec(axes: Sequence[str | None], shape: Sequence[int] | None = None,
                 mesh: Mesh | None = None, rules: dict[str, tuple[str, ...]] = RULES) -> P:
    """PartitionSpec for logical `axes`; drops mesh axes that don't divide `shape`."""
    used: set[str] = set()
    spec = []
    for i, name in enumerate(axes):
        if name is None:
            spec.append(None)
            continue
        if name not in rules:
            raise ValueError(f"unknown logical axis {name!r}; known: {sorted(rules)}")
        mesh_axes = []
        for m in rules[name]:
            if m in used or (mesh is not None and m not in mesh.shape):
                continue
            if mesh is not None and shape is not None:
                size = mesh.shape[m] * math.prod(mesh.shape[a] for a in mesh_axes)
                if shape[i] % size:
                    continue
            mesh_axes.append(m)
        used.update(mesh_axes)
        spec.append(tuple(mesh_axes) if len(mesh_axes) > 1 else (mesh_axes[0] if mesh_axes else None))
    return P(*spec)


def batch_shards(mesh: Mesh) -> int:
    """How many pieces the logical "batch" axis is split into on `mesh`."""
    return math.prod(mesh.shape[a] for a in RULES["batch"] if a in mesh.shape)


def logical_sharding(mesh: Mesh, axes: Sequence[str | None], shape: Sequence[int],
                     rules: dict[str, tuple[str, ...]] = RULES) -> NamedSharding:
    return NamedSharding(mesh, logical_spec(axes, shape, mesh, rules))


PLATFORM_NAMES = {"cuda": "gpu", "rocm": "gpu"}  # a device's platform -> the name jax.default_backend() uses


def platform_of(mesh) -> str:
    """The platform ("cpu", "gpu", "tpu") of a mesh's devices (a Mesh or an AbstractMesh)."""
    device = getattr(mesh, "abstract_device", None) or getattr(mesh.abstract_mesh, "abstract_device", None)
    name = device.platform if device is not None else mesh.devices.flat[0].platform
    return PLATFORM_NAMES.get(name, name)


def target_platform() -> str:
    """The platform of the program being traced: that of the mesh in context (`jax.set_mesh`), else
    the default backend. Code paths (attention backend, layer unrolling, kernels) are chosen by this,
    so a CPU process that compiles for a TPU topology under its mesh builds what the TPU will run."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is not None and not mesh.empty and getattr(mesh, "abstract_device", None) is not None:
        return platform_of(mesh)
    return PLATFORM_NAMES.get(jax.default_backend(), jax.default_backend())


def constrain(x: jax.Array, axes: Sequence[str | None], rules: dict[str, tuple[str, ...]] = RULES) -> jax.Array:
    """Sharding constraint by logical axes under the current mesh (no-op without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(axes, x.shape, mesh, rules))
