"""The devices `python -m atgrpo_jax.plan` plans for: TPU chips by generation or accelerator
type, and GPUs by their memory."""
from __future__ import annotations

import dataclasses
import re

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    hbm_bytes: int
    default_chips: int  # chips of the smallest common slice (one host)


TPUS = {
    "v4": Device("TPU v4", 32 * GiB, 4),
    "v5e": Device("TPU v5e", 16 * GiB, 8),
    "v5p": Device("TPU v5p", 95 * GiB, 4),
    "v6e": Device("TPU v6e", 32 * GiB, 8),
}
# Accelerator types: v4-N and v5p-N count TensorCores (2 per chip); v5litepod-N and v6e-N count chips.
_ACCEL = re.compile(r"^(v4|v5p|v5litepod|v5e|v6e)-(\d+)$")


def parse_device(name: str, gpu_memory_gb: float = 80.0) -> tuple[Device, int]:
    """`v5p`, an accelerator type (`v5p-32`, `v5litepod-8`) or `gpu` -> (device, chips)."""
    name = name.strip().lower()
    if name == "gpu":
        if gpu_memory_gb <= 0:
            raise ValueError(f"--gpu-memory-gb must be > 0, got {gpu_memory_gb}")
        return Device(f"GPU ({gpu_memory_gb:g} GiB)", int(gpu_memory_gb * GiB), 8), 8
    if name in TPUS:
        return TPUS[name], TPUS[name].default_chips
    m = _ACCEL.match(name)
    if not m:
        raise ValueError(f"unknown device {name!r}; use one of {sorted(TPUS)}, gpu, "
                         "or an accelerator type such as v5p-32, v5litepod-8, v6e-16")
    family, count = m.group(1), int(m.group(2))
    chips = count // 2 if family in ("v4", "v5p") else count
    if chips < 1:
        raise ValueError(f"{name}: no whole chip in {count} TensorCores")
    return TPUS["v5e" if family == "v5litepod" else family], chips


def device_platform(device: Device) -> str:
    """The JAX platform of a planned device: "gpu" or "tpu"."""
    return "gpu" if device.name.startswith("GPU") else "tpu"


CHIPS_PER_HOST = 4  # TPU VMs of a multi-host slice (v4, v5p; v5e and v6e beyond their 8-chip one-host machines)


def hosts_of(device: Device, num_devices: int) -> int:
    """Hosts of a slice: the mesh's data axis must be a multiple of this (see distributed.py). A slice
    up to one machine's chips is one host; a larger one is built of 4-chip hosts (a v6e-16 is 4 x 4)."""
    if not device.name.startswith("TPU") or num_devices <= device.default_chips:
        return 1
    return max(1, num_devices // CHIPS_PER_HOST)
