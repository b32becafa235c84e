"""Test-wide setup: 8 simulated CPU devices, offline Hugging Face."""
import os

# Must happen before jax creates its backends (XLA reads XLA_FLAGS then, not at import).
from atgrpo_jax.distributed import CPU_COLLECTIVES_FLAG  # noqa: E402

DEFAULT_SCHEDULER_ENV = "ATGRPO_TEST_XLA_DEFAULT_SCHEDULER"

# (a test that measures XLA's own scheduling re-runs itself without it: xla_default_scheduler)
_flags = ["--xla_force_host_platform_device_count=8"]
# Compiling is most of the suite's time on two cores: LLVM at -O1 without its costliest passes cut the
# suite's wall time ~21% (the same tests timed side by side) and holds every tolerance; -O0 compiled
# faster still but changed sampled tokens and log-probs beyond them.
_flags += ["--xla_backend_optimization_level=1", "--xla_llvm_disable_expensive_passes=true"]
if os.environ.get(DEFAULT_SCHEDULER_ENV) != "1":
    _flags.append(CPU_COLLECTIVES_FLAG)
for _flag in _flags:
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (plan --compile's TPU topologies) locks the machine when it loads; the tests only describe TPUs
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The paper configs train and test on prepared data sets: tiny stand-ins in their format (fixtures/data)
os.environ["ATGRPO_DATA"] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "data")

import subprocess
import sys

import pytest

# Shared test helpers (hf_fixtures.py, ...) import by plain name under importlib mode.
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "train"))  # tiny_config.tiny: the tests' tiny run


def pytest_configure(config):
    """One JAX compilation cache for the session, its xdist workers and the commands tests start:
    many tests compile the same programs (same model shapes, same sampler buckets). A fresh
    directory per session, so a run never reads what another run compiled."""
    import tempfile

    import jax

    if not hasattr(config, "workerinput") and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        # (an xdist worker inherits the controller's directory; a user's own cache is kept)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = config._atgrpo_cache_dir = tempfile.mkdtemp(
            prefix="atgrpo-jax-compile-cache-")
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
    # jax was imported above (before this hook), so its config is set here too
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")))


def pytest_unconfigure(config):
    """The session's compilation cache goes with the session (hundreds of MB per run, in /tmp)."""
    import shutil
    if getattr(config, "_atgrpo_cache_dir", None):
        shutil.rmtree(config._atgrpo_cache_dir, ignore_errors=True)


@pytest.fixture
def xla_default_scheduler(request) -> bool:
    """True if this process runs XLA:CPU with its default scheduler, which the
    suite turns off (CPU_COLLECTIVES_FLAG) and which compiled memory analysis
    depends on. Otherwise the test is run in a child process that has it, this
    fails with the child's output unless it passed there, and False tells the
    test body it has nothing left to do here."""
    if os.environ.get(DEFAULT_SCHEDULER_ENV) == "1":
        return True
    env = dict(os.environ, **{DEFAULT_SCHEDULER_ENV: "1"})
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(CPU_COLLECTIVES_FLAG, "").strip()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", request.node.nodeid],
                          cwd=str(request.config.rootpath), env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and " passed" in proc.stdout, \
        f"child run failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    return False
