"""Preemption within the notice: SIGTERM while a 60 s reward call runs saves the last completed step and
exits within train.preempt_deadline_s (10 s here); the step under way is abandoned, not awaited. In
process (the save), and through the command (the exit)."""
import os
import signal
import subprocess
import threading
import time

import pytest

from atgrpo_jax import cli
from atgrpo_jax.train.checkpoint import Checkpointer
from faults_util import ROOT, assert_no_traceback, stderr_lines, train_args
from tiny_config import tiny


def test_sigterm_during_a_60_s_reward_call_abandons_the_step_and_saves_the_last(tmp_path, monkeypatch):
    from atgrpo_jax.train.loop import run_training

    marker = tmp_path / "slow-call-started"
    for k, v in (("FAIL_AT_STEP", "2"), ("FAIL_KIND", "slow"), ("FAIL_MARKER", str(marker))):
        monkeypatch.setenv(k, v)
    signalled = []

    def signal_once_the_slow_call_runs():
        while not marker.exists():
            time.sleep(0.05)
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=signal_once_the_slow_call_runs, daemon=True).start()
    c = tiny(**{"env.workflow": "failing_workflow:make", "train.steps": 3, "train.eval_every": 0,
                "train.checkpoint_every": 50, "train.preempt_deadline_s": 10.0})
    with pytest.raises(cli.RunStopped) as e:
        run_training(c, str(tmp_path / "run"))
    assert time.monotonic() - signalled[0] < 10  # not the 60 s of the reward call
    assert (str(e.value), e.value.code, e.value.hard) == (
        "stopped by SIGTERM at step 1; checkpoint 1 saved; run the same command to resume", 143, True)
    Checkpointer(str(tmp_path / "run" / "checkpoints"), keep_last=0, read_only=True).verify(1)


@pytest.mark.full  # ~10 s, a process; the same stop in process (above) keeps the family in the default tier
def test_sigterm_during_a_60_s_reward_call_saves_within_a_10_s_deadline(tmp_path):
    work, marker = tmp_path / "run", tmp_path / "slow-call-started"
    env = dict(os.environ, FAIL_AT_STEP="2", FAIL_KIND="slow", FAIL_MARKER=str(marker),
               PYTHONPATH=os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(train_args(work, "--config.env.workflow=failing_workflow:make",
                                       "--config.train.checkpoint_every=50", "--config.train.preempt_deadline_s=10",
                                       steps=3), cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # (waiting on the file the slow call writes as it starts)
        assert marker.exists(), proc.communicate(timeout=60)[1][-3000:]
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert proc.returncode == 143, err[-3000:]
    assert took < 10, took  # not the 60 s of the reward call
    assert_no_traceback(result)
    assert stderr_lines(result)[-1] == "stopped by SIGTERM at step 1; checkpoint 1 saved; run the same command to resume"
    ckpt = Checkpointer(str(work / "checkpoints"), keep_last=0, read_only=True)
    assert ckpt.all_steps() == [1]
    ckpt.verify(1)
