"""GPUs to compile for without one: XLA's description of an H100 or H200 (SXM), for the CUDA
plugin's compile-only client (`jax.experimental.topologies`, platform "cuda").

The plugin must be installed (`pip install "jax[cuda13]"` of the installed jax's version); it is
not needed for TPU targets. Without a device XLA skips autotuning (its GEMMs default to Triton,
not cuBLAS), so kernel choices can differ from a real compile; buffer sizes matched a measured
H100 update within 0.3% (docs/device.md).
"""
from __future__ import annotations

SMS = 132  # both are Hopper parts with 132 SMs
SMEM_PER_SM = 233472  # bytes (228 KiB)
SMEM_PER_BLOCK_OPTIN = 232448
REGS_PER_SM = 65536
MAX_WARPS_PER_SM = 64  # 2,048 threads

MEMORY = {"h100": 84_929_347_584, "h200": 150_754_820_096}  # what the driver reports
BANDWIDTH = {"h100": 3_352_320_000_000, "h200": 4_800_000_000_000}
DESCRIPTION = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}


def target_config(gpu: str) -> str:
    """XLA's GpuTargetConfig (text proto) of `gpu`, with CUDA 13 and cuDNN 9."""
    return f"""
gpu_device_info {{
  threads_per_block_limit: 1024  threads_per_warp: 32  threads_per_core_limit: {MAX_WARPS_PER_SM * 32}
  shared_memory_per_block: 49152  shared_memory_per_block_optin: {SMEM_PER_BLOCK_OPTIN}
  shared_memory_per_core: {SMEM_PER_SM}
  core_count: {SMS}  fpus_per_core: 128  registers_per_core_limit: {REGS_PER_SM}
  registers_per_block_limit: {REGS_PER_SM}
  block_dim_limit_x: 2147483647  block_dim_limit_y: 65535  block_dim_limit_z: 65535
  memory_bandwidth: {BANDWIDTH[gpu]}  l2_cache_size: 52428800  clock_rate_ghz: 1.98
  device_memory_size: {MEMORY[gpu]}
  cuda_compute_capability {{ major: 9 minor: 0 }}
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
runtime_version {{ major: 13 minor: 0 }}
device_description_str: "{DESCRIPTION[gpu]}"
"""


class GpuCompileUnavailable(RuntimeError):
    """No CUDA plugin to compile with."""


def gpu_devices(chip, count: int) -> list:
    """`count` compile-only devices of `chip` (one host)."""
    from jax.experimental import topologies

    gpu = "h200" if "H200" in chip.name else "h100"
    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=target_config(gpu),
                                                topology=f"1x1x{count}")
    except Exception as e:  # noqa: BLE001  (no plugin: jax says so in its own words)
        raise GpuCompileUnavailable(
            f"compiling for {gpu} needs the CUDA plugin of the installed jax (pip install \"jax[cuda13]\"; "
            f"nothing runs on a GPU): {str(e).splitlines()[0][:160]}") from None
    return list(topology.devices)
