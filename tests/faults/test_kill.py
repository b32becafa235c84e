"""kill -9 at any point (a random environment step, inside a checkpoint save, between a step's
metrics row and its checkpoint) and a signal during a held-out evaluation, one after the other on
one run: each start resumes from the last complete checkpoint, and the finished run equals an
uninterrupted one, each metrics and evaluation row once."""
import os
import random
import signal

import jax
import numpy as np
import pytest

from faults_util import FINISHED, assert_no_traceback, metrics_rows, run, stderr_lines, train_args

HERE = os.path.dirname(__file__)


def faulty(workdir, fault: str):
    args = train_args(workdir, *FINISHED)
    return run([args[0], os.path.join(HERE, "faulty_train.py"), *args[3:]], env=dict(os.environ, FAULT=fault))


def kills_and_a_signal_in_an_evaluation_then_the_run_equals_an_uninterrupted_one(finished_run, tmp_path):
    work = tmp_path / "run"
    ckpts = work / "checkpoints"
    seed = random.randrange(1 << 30)
    at = random.Random(seed).randint(1, 8)  # within step 0's evaluation .. step 2's evaluation
    why = f"(kill -9 at environment step {at}: seed {seed})"

    proc = faulty(work, f"stage:{at}")
    assert proc.returncode == -signal.SIGKILL, (why, proc.stderr[-3000:])
    assert_no_traceback(proc)

    proc = faulty(work, "save:2")  # killed with checkpoint 2 half written
    assert proc.returncode == -signal.SIGKILL, (why, proc.stderr[-3000:])
    assert "2" not in os.listdir(ckpts) and any(n.startswith("2.orbax-checkpoint-tmp") for n in os.listdir(ckpts))

    proc = faulty(work, "eval:1:SIGINT")  # Ctrl-C while step 2 is evaluated: the evaluation is finished first
    assert proc.returncode == 130, (why, proc.stderr[-3000:])
    assert_no_traceback(proc)
    assert "resuming at step 1" in proc.stdout and "step 2: held-out success" in proc.stdout, proc.stdout
    assert stderr_lines(proc)[-1] == "stopped by SIGINT at step 2; checkpoint 2 saved; run the same command to resume"
    assert sorted(os.listdir(ckpts)) == ["1", "2"]  # the half-written save is gone

    proc = faulty(work, "row:3")  # step 3's row is on disk, its checkpoint is not
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert [r["step"] for r in metrics_rows(work)][-1] == 3

    proc = run(train_args(work, *FINISHED))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_no_traceback(proc)
    assert "resuming at step 2" in proc.stdout
    assert metrics_rows(work) == metrics_rows(finished_run), why  # bitwise, each row once (evaluations too)
    from atgrpo_jax.train.metrics_files import read_tb_scalars

    tb, reference = read_tb_scalars(str(work)), read_tb_scalars(str(finished_run))  # a real run's events
    for tag in ("loss", "eval_success"):
        assert [s for s, _ in tb[tag]] == [s for s, _ in reference[tag]] == ([1, 2, 3, 4] if tag == "loss"
                                                                             else [0, 2, 4]), (tag, why)
        assert tb[tag] == reference[tag], (tag, why)
    from atgrpo_jax.train.checkpoint import Checkpointer

    a = Checkpointer(str(ckpts), keep_last=0, read_only=True).restore(4)[0]
    b = Checkpointer(str(finished_run / "checkpoints"), keep_last=0, read_only=True).restore(4)[0]
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# tiers.py: a minute of runs; test_signals (SIGTERM, resume equality) and test_checkpoint (kill -9 in a save) cover
# the family in the default tier
test_kills_and_a_signal_in_an_evaluation_then_the_run_equals_an_uninterrupted_one = pytest.mark.full(
    kills_and_a_signal_in_an_evaluation_then_the_run_equals_an_uninterrupted_one)
