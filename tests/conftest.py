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
# XLA:CPU's older elemental emitters instead of its fusion emitters: the same programs compile in ~40% less
# time (a rollout-and-update test 19.5 s -> 13.6 s, its compiles 13.1 s -> 7.7 s), within every tolerance.
_flags += ["--xla_cpu_use_fusion_emitters=false"]
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

import collections
import json
import subprocess
import sys
import tempfile
import time

import pytest


# Shared test helpers (hf_fixtures.py, ...) import by plain name under importlib mode.
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "train"))  # tiny_config.tiny: the tests' tiny run

from shared_builds import SESSION_DIR_ENV, built_once  # noqa: E402
from tiers import BUDGET_S, FULL, SLOWEST_SHOWN  # noqa: E402

RESULTS_ENV = "ATGRPO_TEST_DEFAULT_SCHEDULER_RESULTS"  # where the default-scheduler child writes outcomes
TIMES_ENV = "ATGRPO_TEST_TIMES"  # a file for every test's seconds (tools/suite_budget.py)


def pytest_configure(config):
    """One JAX compilation cache for the session, its xdist workers and the commands tests start:
    many tests compile the same programs (same model shapes, same sampler buckets). A fresh
    directory per session, so a run never reads what another run compiled."""
    import jax

    config.addinivalue_line("markers", "full: a case of the full tier only (tests/tiers.py); deselected unless "
                                       "ATGRPO_FULL_SUITE=1")
    if not hasattr(config, "workerinput") and SESSION_DIR_ENV not in os.environ:
        os.environ[SESSION_DIR_ENV] = config._atgrpo_session_dir = tempfile.mkdtemp(prefix="atgrpo-jax-tests-")
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
    for name in ("_atgrpo_cache_dir", "_atgrpo_session_dir"):
        if getattr(config, name, None):
            shutil.rmtree(getattr(config, name), ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """The default tier leaves out the cases marked `full`, as deselected (counted, not skipped)."""
    if FULL:
        return
    full = [item for item in items if item.get_closest_marker("full")]
    if full:
        config.hook.pytest_deselected(items=full)
        items[:] = [item for item in items if not item.get_closest_marker("full")]


_seconds = collections.defaultdict(float)  # test id -> setup + call + teardown (the controller sees every worker's)
_started = time.monotonic()


def pytest_runtest_logreport(report):
    _seconds[report.nodeid] += report.duration
    results = os.environ.get(RESULTS_ENV)
    if results and os.environ.get(DEFAULT_SCHEDULER_ENV) == "1":  # the child run of `_default_scheduler_results`
        with open(results, "a") as f:
            f.write(json.dumps({"id": report.nodeid, "when": report.when, "outcome": report.outcome,
                                "text": report.longreprtext[-4000:]}) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Every run shows its cost: the tier's wall time against its budget and its slowest tests."""
    if hasattr(config, "workerinput") or not _seconds:
        return
    tier, wall = ("full" if FULL else "default"), time.monotonic() - _started
    budget = "" if FULL else f" (budget {BUDGET_S // 60} min on two cores)"
    terminalreporter.write_sep("=", f"the {tier} tier: {len(_seconds)} tests in {wall:.0f} s{budget}; "
                                    f"the {SLOWEST_SHOWN} slowest (setup + call + teardown)")
    for nodeid, seconds in sorted(_seconds.items(), key=lambda kv: -kv[1])[:SLOWEST_SHOWN]:
        terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")
    if os.environ.get(TIMES_ENV):  # every test's seconds, for tools/suite_budget.py
        with open(os.environ[TIMES_ENV], "w") as f:
            json.dump({"tier": tier, "wall_s": round(wall, 1), "seconds": _seconds}, f, indent=0)


@pytest.fixture(scope="session")
def _default_scheduler_results(request) -> dict:
    """Every selected test that asks for `xla_default_scheduler`, run once in one child process (not one
    child per test: each child is a pytest start and its compiles). The first xdist worker to get here runs
    it; the other reads its results. Test id -> (passed, what the child printed about it)."""
    wanted = sorted(item.nodeid for item in request.session.items if "xla_default_scheduler" in item.fixturenames)

    def run_child(folder):
        env = dict(os.environ, **{DEFAULT_SCHEDULER_ENV: "1", RESULTS_ENV: os.path.join(folder, "reports.jsonl")})
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(CPU_COLLECTIVES_FLAG, "").strip()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", *wanted],
                              cwd=str(request.config.rootpath), env=env, capture_output=True, text=True)
        with open(os.path.join(folder, "output.txt"), "w") as f:
            f.write(proc.stdout[-6000:] + proc.stderr[-3000:])
        open(os.path.join(folder, "reports.jsonl"), "a").close()

    folder = built_once("default-scheduler", run_child)
    with open(os.path.join(folder, "output.txt")) as f:
        output = f.read()
    reports = collections.defaultdict(list)
    with open(os.path.join(folder, "reports.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            reports[r["id"]].append(r)
    results = {}
    for nodeid, rs in reports.items():  # passed: its call passed and no phase failed (a skip is no pass)
        passed = any(r["when"] == "call" and r["outcome"] == "passed" for r in rs) and \
            all(r["outcome"] != "failed" for r in rs)
        results[nodeid] = (passed, "".join(r["text"] for r in rs) or output)
    return {nodeid: results.get(nodeid, (False, output)) for nodeid in wanted}


@pytest.fixture
def xla_default_scheduler(request) -> bool:
    """True if this process runs XLA:CPU with its default scheduler, which the suite turns off
    (CPU_COLLECTIVES_FLAG) and which compiled memory analysis depends on. Otherwise the test has run in
    the child process that has it (`_default_scheduler_results`), this fails with the child's report
    unless it passed there, and False tells the test body it has nothing left to do here."""
    if os.environ.get(DEFAULT_SCHEDULER_ENV) == "1":
        return True
    passed, text = request.getfixturevalue("_default_scheduler_results")[request.node.nodeid]
    assert passed, f"failed in the child run with XLA's default scheduler:\n{text[-6000:]}"
    return False


