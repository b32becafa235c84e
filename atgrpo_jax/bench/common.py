"""Helpers shared by the benchmarks: timing, a matmul peak, machine notes, output."""
from __future__ import annotations

import ctypes
import json
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def timed(fn: Callable, *args, repeats: int = 3, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeats` calls of fn(*args) after `warmup` calls; results are waited for."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return times


def matmul_peak(dtype: str = "float32", size: int = 1024, repeats: int = 10) -> float:
    """Best FLOP/s of a jitted [size, size] x [size, size] matmul in `dtype`.

    The best of several runs: on a shared machine the best one is the
    closest to what the hardware can do.
    """
    a = jax.random.normal(jax.random.key(0), (size, size)).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (size, size)).astype(dtype)
    mm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    return 2 * size ** 3 / min(timed(mm, a, b, repeats=repeats, warmup=2))


# Vector and matrix extensions that change which CPU kernels XLA and PyTorch pick.
CPU_EXTENSIONS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16",
                  "amx_int8", "asimd", "sve", "sve2")


def cpu_model(cpuinfo: str | None = None) -> dict:
    """The CPU's model name and which of CPU_EXTENSIONS it has (from /proc/cpuinfo where there is one):
    the same benchmark gives different ratios on CPUs with and without AVX-512 or AMX."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    import platform
    return {"cpu_model": fields.get("model name") or platform.processor() or platform.machine(),
            "cpu_extensions": [x for x in CPU_EXTENSIONS if x in flags]}


def machine_notes(heap_kept: bool = False) -> dict:
    """Cores, CPU model and extensions, and load: benchmarks on a shared machine are only comparable
    within one run. heap_kept: apply `keep_heap` first (the --keep-heap flag) and say so in the notes."""
    if heap_kept:
        keep_heap()
    notes = {"cpu_count": os.cpu_count(), **cpu_model(), "jax_backend": jax.default_backend(),
             "jax_devices": jax.device_count(), "keep_heap": heap_kept}
    if hasattr(os, "getloadavg"):
        notes["load_average_1min"] = round(os.getloadavg()[0], 2)
    return notes


KEEP_HEAP_HELP = ("glibc malloc keeps freed memory (no mmap'd blocks, no trimming), so big buffers are "
                  "not page-faulted in afresh on every step: this makes eager PyTorch's update ~20%% faster "
                  "on this VM; off by default, as a PyTorch user runs")


def keep_heap() -> None:
    """Make glibc malloc serve every block from a heap it never returns to the OS
    (as MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large> would at start-up)."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    if not (libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2 ** 31 - 1)):
        raise RuntimeError("mallopt refused the settings (not glibc?)")


def print_json_last(figures: dict, enabled: bool) -> None:
    """The machine-readable line, printed last when asked."""
    if enabled:
        print(json.dumps(figures, default=_plain, sort_keys=True))


def _plain(x):
    if isinstance(x, (np.generic,)):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x)}")
