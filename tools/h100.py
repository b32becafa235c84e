"""An H100 SXM 80GB, for the tools that compile for one without having it (gpu_aot.py,
triton_preflight.py): one place for the device's limits. Imported without jax."""
SMS = 132
SMEM_PER_SM = 233472  # bytes (228 KiB)
SMEM_PER_BLOCK_OPTIN = 232448
REGS_PER_SM = 65536
MAX_WARPS_PER_SM = 64  # 2,048 threads

# XLA's GpuTargetConfig (text proto): the limits above, memory, clocks, CUDA 13 and cuDNN 9 as in
# the device image.
TARGET_CONFIG = f"""
gpu_device_info {{
  threads_per_block_limit: 1024  threads_per_warp: 32  threads_per_core_limit: {MAX_WARPS_PER_SM * 32}
  shared_memory_per_block: 49152  shared_memory_per_block_optin: {SMEM_PER_BLOCK_OPTIN}
  shared_memory_per_core: {SMEM_PER_SM}
  core_count: {SMS}  fpus_per_core: 128  registers_per_core_limit: {REGS_PER_SM}
  registers_per_block_limit: {REGS_PER_SM}
  block_dim_limit_x: 2147483647  block_dim_limit_y: 65535  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000  l2_cache_size: 52428800  clock_rate_ghz: 1.98
  device_memory_size: 84929347584
  cuda_compute_capability {{ major: 9 minor: 0 }}
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
runtime_version {{ major: 13 minor: 0 }}
device_description_str: "NVIDIA H100 80GB HBM3"
"""
