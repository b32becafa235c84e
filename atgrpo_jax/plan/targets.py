"""What `python -m atgrpo_jax.plan --compile=TARGET` compiles for: a TPU topology or a GPU.

A TPU target is a topology name as libtpu spells it (`v5p:2x2x4`: 16 v5p chips) or a Cloud TPU
accelerator type (`v5p-32`: 32 TensorCores = the same 16 chips). Hosts hold 4 chips, except the
one-host 8-chip v5e/v6e machines (`v6e-8`, `v6e:2x4`), as Cloud TPU VMs are built. libtpu makes
the topology's devices on this machine without the hardware (`jax.experimental.topologies`), so
jitted programs compile for them here. A GPU target (`h100`, `h200`) needs the CUDA plugin of
the installed jax (`pip install "jax[cuda13]"`), whose compile-only client builds GPU programs
on a machine without a GPU.

The chips' peaks are datasheet figures (bf16 dense FLOP/s, HBM bandwidth); memory is what a
program may use (HBM on a TPU; on a GPU what JAX was measured to get with its allocator set to
use it all, docs/device.md).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re

import numpy as np

from atgrpo_jax.plan import gpu_target
from atgrpo_jax.plan.devices import Device

GiB = 1024**3
GPU_MEM_FRACTION = 0.95


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    platform: str  # "tpu" or "gpu"
    hbm_bytes: int
    peak_flops: float  # bf16 dense, per second
    hbm_bytes_per_s: float


CHIPS = {
    "v4": Chip("TPU v4", "tpu", 32 * GiB, 275e12, 1.2e12),
    "v5e": Chip("TPU v5e", "tpu", 16 * GiB, 197e12, 0.819e12),
    "v5p": Chip("TPU v5p", "tpu", 95 * GiB, 459e12, 2.765e12),
    "v6e": Chip("TPU v6e", "tpu", 32 * GiB, 918e12, 1.64e12),
    # JAX's share of the GPU: XLA_PYTHON_CLIENT_MEM_FRACTION=.95 of what the driver reports
    "h100": Chip("NVIDIA H100 80GB", "gpu", int(GPU_MEM_FRACTION * gpu_target.MEMORY["h100"]), 989e12,
                 gpu_target.BANDWIDTH["h100"]),
    "h200": Chip("NVIDIA H200", "gpu", int(GPU_MEM_FRACTION * gpu_target.MEMORY["h200"]), 989e12,
                 gpu_target.BANDWIDTH["h200"]),
}

# Cloud TPU accelerator types -> chips -> topology (the shapes Cloud TPU builds slices in).
_ACCEL = re.compile(r"^(v4|v5p|v5e|v5litepod|v6e)-(\d+)$")
_TOPOLOGY = re.compile(r"^(v4|v5p|v5e|v6e):(\d+(?:x\d+){1,2})$")
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
              512: "8x8x8"}
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
GPUS_PER_HOST = 8
GPU_COUNTS = re.compile(r"^(h100|h200)(?:x(\d+))?$")
FORMS = ("a TPU topology such as v5p:2x2x1, v5p:2x2x4, v6e:2x4, v5e:4x4; an accelerator type such as "
         "v5p-8, v5p-32, v6e-8; or GPUs: h100, h200, h100x8 (hosts of 8: h100x16)")


@dataclasses.dataclass(frozen=True)
class Target:
    """A compile target: `chips` devices of `chip` over `hosts` processes."""

    name: str  # as the user gave it
    chip: Chip
    chips: int
    hosts: int
    topology: str = ""  # libtpu's name ("v5p:2x2x4"); "" for GPUs
    host_bounds: tuple[int, int, int] | None = None  # chips per host, when not libtpu's default

    @property
    def platform(self) -> str:
        return self.chip.platform

    @property
    def accelerator_type(self) -> str:
        """Cloud TPU's name of the slice (v5p-32: TensorCores for v4 and v5p, chips otherwise)."""
        family = self.topology.split(":")[0]
        count = self.chips * (2 if family in ("v4", "v5p") else 1)
        return f"{'v5litepod' if family == 'v5e' else family}-{count}"

    def on_one_host(self, devices: list) -> list:
        """One host's `devices` (a multi-host TPU slice's) as the same chips of a one-host topology, matched
        by their place in the host's grid. A program on one host's chips is the same on either; libtpu's
        compile-only client fails an internal check compiling for the chips of one host of a larger v6e
        or v5e slice whose ids are not consecutive (docs/guides/tpu.md)."""
        if self.platform != "tpu" or self.hosts == 1:
            return devices
        family = self.topology.split(":")[0]
        grid = np.asarray([d.coords for d in devices])
        low, shape = grid.min(0), grid.max(0) - grid.min(0) + 1
        dims = shape if family in ("v4", "v5p") else shape[:2]
        one = Target(self.name, self.chip, int(np.prod(shape)), 1, f"{family}:{'x'.join(map(str, dims))}",
                     tuple(int(x) for x in shape))
        by_place = {tuple(d.coords): d for d in one.devices()}
        return [by_place[tuple(int(x) for x in c - low)] for c in grid]

    def planner_device(self) -> Device:
        """The chip as the planner (plan/memory.py) knows devices: its memory and chips per host."""
        name = f"GPU ({self.chip.name})" if self.platform == "gpu" else self.chip.name
        return Device(name, self.chip.hbm_bytes, self.chips // self.hosts)

    def devices(self) -> list:
        """The target's devices, made by libtpu (or the CUDA plugin) on this machine: programs compile
        for them, none runs."""
        from jax.experimental import topologies

        if self.platform == "tpu":
            # libtpu takes a machine-wide lock when it loads, for a process that runs on the TPU; here it
            # only describes one, so compiles may run side by side (and beside a run on a TPU VM). Off a
            # TPU VM it would also ask the VM's metadata what it is, and warn at length when that fails.
            os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
            os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
            os.environ.setdefault("TPU_ACCELERATOR_TYPE", self.accelerator_type)
            kw = {"chips_per_host_bounds": self.host_bounds} if self.host_bounds else {}
            return list(topologies.get_topology_desc(platform="tpu", topology_name=self.topology, **kw).devices)
        return gpu_target.gpu_devices(self.chip, self.chips)


def _tpu(name: str, family: str, shape: str) -> Target:
    dims = tuple(int(d) for d in shape.split("x"))
    chips = math.prod(dims)
    if family in ("v5e", "v6e") and chips <= 8:  # one host holds up to 8 of these chips
        bounds = tuple(dims) + (1,) * (3 - len(dims))
        hosts = 1
    else:
        bounds, hosts = None, max(1, chips // 4)
        if family in ("v5e", "v6e", "v4") and len(dims) == 2 and chips % 4:
            raise ValueError(f"{name}: {chips} chips do not fill hosts of 4")
    return Target(name, CHIPS[family], chips, hosts, f"{family}:{shape}", bounds)


def parse_target(name: str) -> Target:
    """A target from its name (see `FORMS`); ValueError with the valid forms otherwise."""
    text = name.strip().lower()
    m = _TOPOLOGY.match(text)
    if m:
        family, shape = m.groups()
        three = family in ("v4", "v5p")
        if (shape.count("x") == 2) != three:
            raise ValueError(f"unknown target {name!r}: {family} topologies have {3 if three else 2} "
                             f"dimensions; use {FORMS}")
        return _tpu(name, family, shape)
    m = _ACCEL.match(text)
    if m:
        family, count = m.group(1), int(m.group(2))
        family = "v5e" if family == "v5litepod" else family
        chips = count // 2 if family in ("v4", "v5p") else count
        shape = (_SHAPES_3D if family in ("v4", "v5p") else _SHAPES_2D).get(chips)
        if shape is None:
            raise ValueError(f"unknown target {name!r}: no {family} slice of {chips} chips; use {FORMS}")
        return _tpu(name, family, shape)
    m = GPU_COUNTS.match(text)
    if m:
        count = int(m.group(2) or 1)
        if count > GPUS_PER_HOST and count % GPUS_PER_HOST:
            raise ValueError(f"unknown target {name!r}: more than {GPUS_PER_HOST} GPUs come in hosts of "
                             f"{GPUS_PER_HOST}; use {FORMS}")
        return Target(name, CHIPS[m.group(1)], count, max(1, count // GPUS_PER_HOST))
    raise ValueError(f"unknown target {name!r}; use {FORMS}")
