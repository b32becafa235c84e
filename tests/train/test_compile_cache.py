"""`train.compile_cache`: where JAX's persistent compilation cache goes, and a run that fills it
and a second run that compiles nothing new."""
import os
import subprocess
import sys

from atgrpo_jax.train.compile_cache import cache_dir
from tiers import FULL

CONFIG = os.path.join(os.path.dirname(__file__), "tiny_config.py")


def test_auto_is_the_user_cache_unless_jax_is_given_one(tmp_path, monkeypatch):
    run = str(tmp_path / "run")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for platform in ("cpu", "gpu", "tpu"):
        assert cache_dir("auto", run, platform) == str(tmp_path / "xdg" / "atgrpo-jax" / "jax")
    assert cache_dir("auto", "gs://bucket/run", "tpu") == str(tmp_path / "xdg" / "atgrpo-jax" / "jax")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir("auto", run, "cpu") == str(tmp_path / "mine")
    assert cache_dir("", run, "gpu") is None
    assert cache_dir("/elsewhere/cache", run, "cpu") == "/elsewhere/cache"


def entries(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith("-cache")) if os.path.isdir(folder) else []


def train(workdir, cache, steps=1):
    env = dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")  # cache even quick CPU compiles
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.train", f"--config={CONFIG}", f"--workdir={workdir}",
                           f"--config.train.steps={steps}", "--config.train.eval_every=0",
                           f"--config.train.compile_cache={cache}"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_run_fills_its_cache_and_the_next_one_compiles_nothing_new(tmp_path):
    cache = str(tmp_path / "cache")
    train(tmp_path / "a", cache)
    first = entries(cache)
    assert any(f.startswith("jit_update_fn") for f in first), first  # the trainer's update, among others
    assert not os.path.exists(tmp_path / "a" / "compile_cache")  # an explicit directory, not auto's
    if FULL:  # a second process with the same programs: every one read back from the cache
        train(tmp_path / "b", cache)
        assert entries(cache) == first


def test_a_directory_shared_with_a_program_that_sets_no_size_limit_takes_our_entries(tmp_path):
    """JAX's size limit reads an access-time file beside each entry; a program with no limit writes
    none. A named directory (or $JAX_COMPILATION_CACHE_DIR) gets no limit from us, so both write."""
    cache = tmp_path / "shared"
    cache.mkdir()
    (cache / "jit_other_program-0123-cache").write_bytes(b"written by a program without a size limit")
    code = ("import jax, jax.numpy as jnp; from atgrpo_jax.train.compile_cache import enable; "
            f"enable({str(cache)!r}, None); jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((64, 64))).block_until_ready()")
    env = dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    env.pop("JAX_COMPILATION_CACHE_MAX_SIZE", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Error writing persistent compilation cache" not in proc.stderr, proc.stderr[-2000:]
    assert any(f.startswith("jit__lambda") for f in entries(cache)), entries(cache)  # ours beside the other's
