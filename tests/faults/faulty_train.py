"""The trainer as `python -m atgrpo_jax.train` runs it, with one fault at a chosen point (for the
kill -9 and signal tests). FAULT (an environment variable) says which:

    stage:N       kill -9 at the N-th environment step of the run (training or evaluation)
    save:N        kill -9 inside the save of checkpoint N (its temporary directory on disk, not renamed)
    row:N         kill -9 once step N's metrics row is on disk, before its checkpoint is saved
    eval:N:SIG    send SIG (SIGTERM, SIGINT) to itself when the N-th held-out evaluation begins
"""
import glob
import os
import runpy
import signal
import sys
import time

from atgrpo_jax.rollout import cohort
from atgrpo_jax.train import checkpoint, loop, metrics

kind, n, *rest = os.environ["FAULT"].split(":")
n = int(n)


def die():
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


if kind == "stage":
    finish, calls = cohort.Stages.finish, [0]

    def counted_finish(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            die()
        return finish(self, *args, **kwargs)
    cohort.Stages.finish = counted_finish
elif kind == "save":
    save = checkpoint.Checkpointer.save

    def save_then_die(self, step, *args, **kwargs):
        started = save(self, step, *args, **kwargs)
        if step == n:
            while not glob.glob(os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp*")):
                time.sleep(0.001)
            die()
        return started
    checkpoint.Checkpointer.save = save_then_die
elif kind == "row":
    write = metrics.MetricsWriter.write

    def write_then_die(self, step, *args, **kwargs):
        write(self, step, *args, **kwargs)
        if step == n:
            die()
    metrics.MetricsWriter.write = write_then_die
elif kind == "eval":
    evaluation, calls = loop.evaluation, [0]

    def signalled_evaluation(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), getattr(signal, rest[0]))
        return evaluation(*args, **kwargs)
    loop.evaluation = signalled_evaluation
else:
    raise SystemExit(f"FAULT={os.environ['FAULT']}: unknown")
sys.argv = ["atgrpo_jax.train"] + sys.argv[1:]
runpy.run_module("atgrpo_jax.train", run_name="__main__", alter_sys=True)
