"""JAX's persistent compilation cache for a run (`train.compile_cache`).

A restarted run (a preempted job, a resume, a second run of the same config) compiles the
same sampler and update programs again; on an accelerator that is minutes for a 1.7B model
with several prompt buckets. With a cache directory, XLA's executables are written there
once and read back by later processes.

It must be switched on before the process compiles anything (JAX reads the setting once, at
its first compilation) and after `jax.distributed.initialize` (asking for the platform before
that would start the backend too early): `setup.build_run` calls `enable` between the two.
"""
from __future__ import annotations

import os

import jax

from atgrpo_jax import workdir as wd

SUBDIR = "compile_cache"


def cache_dir(setting: str, workdir: str | None, platform: str) -> str | None:
    """The directory a run's setting names: "auto" is <workdir>/compile_cache on an accelerator
    with a local workdir (a CPU compiles these programs in seconds, and an object-store workdir
    is left to a directory the user names), "" is none, anything else is that directory."""
    if setting != "auto":
        return setting or None
    if platform == "cpu" or not workdir or wd.is_remote(workdir):
        return None
    return os.path.join(os.path.abspath(workdir), SUBDIR)


def enable(setting: str, workdir: str | None) -> str | None:
    """Point JAX's compilation cache at the run's directory (see `cache_dir`); returns it."""
    path = cache_dir(setting, workdir, jax.default_backend())
    if path:
        if not wd.is_remote(path):
            os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
    return path
