"""JAX's persistent compilation cache for a run (`train.compile_cache`), on by default.

A restarted run (a preempted job, a resume, a second run of the same config) compiles the
same sampler and update programs again; on an accelerator that is minutes for a 1.7B model
with several prompt buckets, on a CPU most of the demo's first minute. With a cache directory,
XLA's executables are written there once and read back by later processes.

It must be switched on before the process compiles anything (JAX reads the setting once, at
its first compilation) and after `jax.distributed.initialize` (asking for the platform before
that would start the backend too early): `setup.build_run` calls `enable` between the two.
"""
from __future__ import annotations

import os

import jax

from atgrpo_jax import workdir as wd

SUBDIR = "compile_cache"


MIN_COMPILE_S = 0.1  # cache every program that took this long to compile (JAX's default, 1 s, skips a CPU's)
MAX_BYTES = 4 * 2**30  # the size of the project's own cache (`user_cache`); least recently used go first


def user_cache() -> str:
    """The user's cache directory for compiled programs ($XDG_CACHE_HOME, else ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "atgrpo-jax", "jax")


def cache_dir(setting: str, workdir: str | None, platform: str) -> str | None:
    """The directory a run's setting names: "auto" is $JAX_COMPILATION_CACHE_DIR when set, else the
    user's cache (`user_cache`: programs are keyed by what they compile for, so every run and platform
    shares it); "" is none; anything else is that directory. (workdir and platform: kept for callers
    that name a run's own directory.)"""
    if setting != "auto":
        return setting or None
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or user_cache()


def enable(setting: str, workdir: str | None) -> str | None:
    """Point JAX's compilation cache at the run's directory (see `cache_dir`); returns it."""
    path = cache_dir(setting, workdir, jax.default_backend())
    if path:
        if not wd.is_remote(path):
            os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
            jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
        # A size limit only on the project's own directory: JAX's eviction reads an access-time file
        # beside every entry, which a process writing without a limit (any other JAX program sharing
        # $JAX_COMPILATION_CACHE_DIR or a named directory) never writes, so every later write fails.
        if path == user_cache() and "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
            jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return path
