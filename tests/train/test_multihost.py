"""Several JAX processes as one run (issue: multi-host), proven with CPU processes:
2 processes x 4 devices train like 1 process x 8 devices, and their checkpoint
restores in one process (and, in the full tier, trains on there)."""
import io
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from atgrpo_jax import launch
from atgrpo_jax.distributed import CPU_COLLECTIVES_FLAG, ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID
from atgrpo_jax.train.metrics_files import read_metrics
from tiers import FULL, full_case

DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "demo.py")
# The demo config, smaller; the mesh's data axis spans the processes, fsdp stays inside each.
OVERRIDES = {"rollout.num_tasks": 4, "rollout.k": 4, "rollout.max_turns": 2, "optim.mini_batch_size": 16,
             "train.steps": 2, "train.eval_every": 0, "train.checkpoint_every": 2, "train.time_budget_s": 0.0,
             "mesh.data": 2, "mesh.fsdp": 4}
COMPARED = ("loss", "pg_loss", "grad_norm", "clip_frac", "success", "reward_mean", "adv_abs_mean")


def demo_config(**changes):
    sys.path.insert(0, os.path.dirname(DEMO))
    from demo import get_config
    c = get_config()
    for key, value in {**OVERRIDES, **changes}.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def test_process_env_sets_the_coordinator_and_the_device_count():
    env = launch.process_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo=1", "A": "b"},
                             1, 2, 4, 1234)
    assert env["XLA_FLAGS"].split() == ["--foo=1", CPU_COLLECTIVES_FLAG, "--xla_force_host_platform_device_count=4"]
    assert (env[ENV_COORDINATOR], env[ENV_NUM_PROCESSES], env[ENV_PROCESS_ID]) == ("localhost:1234", "2", "1")
    assert env["JAX_PLATFORMS"] == "cpu" and env["A"] == "b"


def test_launcher_prefixes_output_and_returns_the_failure():
    out = io.StringIO()
    code = launch.launch([sys.executable, "-c", "import os, sys; print('hi', os.environ['ATGRPO_PROCESS_ID']);"
                          "sys.exit(3 if os.environ['ATGRPO_PROCESS_ID'] == '1' else 0)"], 2, 1, out=out)
    assert code == 3
    assert sorted(out.getvalue().splitlines()) == ["[p0] hi 0", "[p1] hi 1"]
    # a process that never ends is stopped when its peer fails
    code = launch.launch([sys.executable, "-c", "import os, sys, time; pid = os.environ['ATGRPO_PROCESS_ID'];"
                          "sys.exit(5) if pid == '0' else time.sleep(600)"], 2, 1, out=io.StringIO())
    assert code == 5


def _params(workdir, config):
    from atgrpo_jax.train.checkpoint import Checkpointer
    from atgrpo_jax.train.step import policy_states
    from atgrpo_jax.train.setup import build_run
    from atgrpo_jax.train.validate import resolve
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=None)
    states, _ = ckpt.restore(ckpt.latest_step(), target=policy_states(build_run(resolve(config))))
    ckpt.close()
    return [np.asarray(x) for x in jax.tree.leaves(states)]


# staleness 2 (full tier): the rollouts in flight sample with gathered copies of older weights on each
# process, one after another, and the updates are dispatched in one order on both
@pytest.mark.parametrize("staleness", [0, full_case(2)])
def test_two_processes_train_like_one_and_their_checkpoint_resumes_in_one(tmp_path, staleness):
    from atgrpo_jax.train.loop import run_training
    assert jax.device_count() == 8
    two, one = str(tmp_path / "two"), str(tmp_path / "one")
    flags = [f"--config.{k}={v}" for k, v in {**OVERRIDES, "system.staleness": staleness}.items()]
    cmd = [sys.executable, "-m", "atgrpo_jax.train", f"--config={DEMO}", f"--workdir={two}", *flags]
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.launch", "--processes=2", "--devices=4", "--", *cmd],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [l for l in proc.stdout.splitlines() if "step 2/2" in l or '"steps": 2' in l]
    assert lines and all(l.startswith("[p0]") for l in lines), "only process 0 writes the console"

    run_training(demo_config(**{"system.staleness": staleness}), one)  # this process: 8 devices, one process
    m1, m2 = read_metrics(os.path.join(one, "metrics.jsonl")), read_metrics(os.path.join(two, "metrics.jsonl"))
    assert [r["step"] for r in m2] == [1, 2]
    for a, b in zip(m1, m2):
        for key in COMPARED:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=f"step {a['step']} {key}")
    assert len({r["loss"] for r in m1}) == 2  # it trained
    for a, b in zip(_params(one, demo_config()), _params(two, demo_config())):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)

    # The two-process checkpoint restored in this one process (above) equals the one-process one; training
    # on from it (another compilation of every program) is in the full tier (tiers.py).
    if not FULL:
        return
    resumed = str(tmp_path / "resumed")
    shutil.copytree(two, resumed)
    last = run_training(demo_config(**{"train.steps": 3, "train.checkpoint_every": 0, "system.staleness": staleness}),
                        resumed)
    assert [r["step"] for r in read_metrics(os.path.join(resumed, "metrics.jsonl"))] == [1, 2, 3]
    assert np.isfinite(last["loss"]) and last["skipped"] == 0


@pytest.mark.full  # tiers.py: two launches of ~1 minute each on two cores
def test_per_role_pools_over_two_processes_train_like_one_and_three_pools_of_whole_hosts_are_refused(tmp_path):
    """Each role's pool spans both processes (one pair of each process's 4 devices), each process samples
    its tasks with both models: the metrics equal one process's with the same pools. Three roles' pools
    cannot take a host each: every process refuses in the same line, naming why."""
    from atgrpo_jax.train.loop import run_training
    pools = {"policy.sharing": "per_role", "policy.pools": True}
    two, one = str(tmp_path / "two"), str(tmp_path / "one")
    flags = [f"--config.{k}={v}" for k, v in {**OVERRIDES, **pools}.items()]
    cmd = [sys.executable, "-m", "atgrpo_jax.train", f"--config={DEMO}", f"--workdir={two}", *flags]
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.launch", "--processes=2", "--devices=4", "--", *cmd],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_training(demo_config(**pools), one)
    m1, m2 = read_metrics(os.path.join(one, "metrics.jsonl")), read_metrics(os.path.join(two, "metrics.jsonl"))
    assert [r["step"] for r in m2] == [1, 2]
    for a, b in zip(m1, m2):
        for key in ("success", "reward_mean", "policy_planner/loss", "policy_executor/loss",
                    "policy_planner/grad_norm", "policy_executor/grad_norm"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=f"step {a['step']} {key}")

    three = [sys.executable, "-m", "atgrpo_jax.train", f"--config={DEMO}", f"--workdir={tmp_path / 'three'}",
             *flags, "--config.env.workflow=team_workflow:make", "--config.env.kwargs.roles=3",
             "--config.rollout.num_tasks=6", "--config.train.eval_tasks=6", "--config.mesh.data=0"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.launch", "--processes=3", "--devices=4", "--", *three],
                          capture_output=True, text=True, timeout=600, env=env)
    errors = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode != 0 and errors, proc.stdout[-3000:] + proc.stderr[-3000:]  # (the first stops the rest)
    assert all(line.split("] ", 1)[1] == "error: config.mesh: cannot split a mesh of {'data': 3, 'fsdp': 4, "
               "'tensor': 1} over 3 hosts into 3 pools with devices on every host (each host samples its share "
               "of the tasks with every policy): a host's fsdp*tensor (4) is not a multiple of 3" for line in errors)
