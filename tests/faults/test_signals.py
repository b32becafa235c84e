"""SIGTERM (preemption, tpu_scripts/stop.sh) and SIGINT (Ctrl-C): the run saves its last completed
step, says so in one line and exits 143 / 130; the same command resumes it exactly."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from faults_util import ROOT, assert_no_traceback, metrics_rows, run, stderr_lines, train_args
from tiers import full_case


def start_and_signal(workdir, sig, after_step: int, *extra):
    """Start a long run and send `sig` once metrics.jsonl has step `after_step`; returns the finished process."""
    proc = subprocess.Popen(train_args(workdir, "--config.train.checkpoint_every=100", *extra, steps=60),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail("the run ended before the signal: " + proc.stderr.read()[-3000:])
        if os.path.exists(workdir / "metrics.jsonl") and any(r["step"] >= after_step for r in metrics_rows(workdir)):
            break
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# (tiers.py) staleness 2 is the hardest case (rollouts in flight, made in parts with older weights); 0 adds
# little to test_kill's Ctrl-C at staleness 0
@pytest.mark.parametrize("staleness", [full_case(0), full_case(1), 2])
def test_sigterm_saves_the_last_step_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path, staleness):
    """staleness N: the next N steps' rollouts were made (in parts) during this and earlier updates,
    with the weights from before each; the checkpoint keeps those weights so that a resume makes the
    same rollouts again."""
    work = tmp_path / "stopped"
    mode = f"--config.system.staleness={staleness}"
    proc = start_and_signal(work, signal.SIGTERM, 2, mode)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert_no_traceback(proc)
    last = stderr_lines(proc)[-1]
    m = re.fullmatch(r"stopped by SIGTERM at step (\d+); checkpoint \1 saved; run the same command to resume", last)
    assert m, last
    n = int(m.group(1))
    assert n >= 2 and os.listdir(work / "checkpoints") == [str(n)]  # only the stop saved (checkpoint_every=100)
    assert [r["step"] for r in metrics_rows(work)][-1] >= n  # a row of an abandoned step is cut on resume
    resumed = run(train_args(work, mode, steps=n + 2))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming at step {n}" in resumed.stdout
    whole = run(train_args(tmp_path / "whole", mode, steps=n + 2))
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert metrics_rows(work) == metrics_rows(tmp_path / "whole")  # bitwise, step by step
    from atgrpo_jax.train.checkpoint import Checkpointer

    a = Checkpointer(str(work / "checkpoints"), keep_last=0, read_only=True).restore(n + 2)[0]
    b = Checkpointer(str(tmp_path / "whole" / "checkpoints"), keep_last=0, read_only=True).restore(n + 2)[0]
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


SECOND_SIGNAL = textwrap.dedent("""
    import os, signal, time
    from atgrpo_jax.train.guard import StopSignals
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.{sig})
        assert stop.requested() and stop.exit_code == {code}
        print("asked to stop", flush=True)
        os.kill(os.getpid(), signal.{sig})
        time.sleep(30)
    print("not reached")
""")


@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_second_signal_exits_at_once(sig, code):
    t0 = time.time()
    proc = run([sys.executable, "-c", SECOND_SIGNAL.format(sig=sig, code=code)], timeout=60)
    assert proc.returncode == code and time.time() - t0 < 25, proc.stderr
    assert proc.stdout == "asked to stop\n"
    assert stderr_lines(proc) == [f"second {sig}: exiting now without saving"]


def _pid_of_process(workdir, process_id: int) -> int | None:
    """The trainer process of a launched run with ATGRPO_PROCESS_ID=process_id."""
    from atgrpo_jax.distributed import ENV_PROCESS_ID

    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if b"atgrpo_jax.train" in cmd and str(workdir).encode() in cmd and \
                f"{ENV_PROCESS_ID}={process_id}".encode() in env:
            return int(pid)
    return None


@pytest.mark.full  # tiers.py: 73 s of two trainer processes; test_multihost covers two hosts in the default tier
def test_sigterm_to_one_host_stops_every_host_at_the_same_step(tmp_path):
    """2 processes x 4 devices: only process 1 is signalled (its VM was preempted); both stop at
    the same step, save it together and exit 143."""
    work = tmp_path / "run"
    flags = ["--config.mesh.data=2", "--config.mesh.fsdp=4", "--config.rollout.num_tasks=2"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the launcher sets the devices
    proc = subprocess.Popen([sys.executable, "-m", "atgrpo_jax.launch", "--processes=2", "--devices=4", "--",
                             *train_args(work, "--config.train.checkpoint_every=100", *flags, steps=60)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 400
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail("the run ended before the signal: " + proc.stdout.read()[-3000:])
        if os.path.exists(work / "metrics.jsonl") and any(r["step"] >= 2 for r in metrics_rows(work)):
            break
        time.sleep(0.1)
    os.kill(_pid_of_process(work, 1), signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    stops = [re.search(r"^\[p(\d)\] stopped by SIGTERM at step (\d+); checkpoint \2 saved", line)
             for line in out.splitlines()]
    stops = sorted((int(m.group(1)), int(m.group(2))) for m in stops if m)
    assert [p for p, _ in stops] == [0, 1] and stops[0][1] == stops[1][1], out[-3000:]  # one step for both
    assert os.listdir(work / "checkpoints") == [str(stops[0][1])]

