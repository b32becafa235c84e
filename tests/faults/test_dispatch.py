"""The asynchronous dispatcher cannot hang silently: a stage past system.stage_timeout_s is named
in the error, and the first error ends the rollout at once, not when a stuck stage returns."""
import re
import threading
import time

import jax
import numpy as np
import pytest

from atgrpo_jax.rollout.dispatch import StageTimeout
from atgrpo_jax.rollout.samples import SampleOut
from atgrpo_jax.rollout.tree import RolloutInputs, Schedule, TreeRollout

release = threading.Event()  # lets the hung stages of a test end once it is over


@pytest.fixture(autouse=True)
def _release_hung_stages():
    release.clear()
    yield
    release.set()


def sample_fn(hang_agent=None, hang_cohort_rows=None):
    """K answers per prompt at once, except that agent `hang_agent` hangs (a stuck device call)."""
    def sample(agent, prompts, k, keys):
        if agent == hang_agent and (hang_cohort_rows is None or len(prompts) == hang_cohort_rows):
            release.wait(120)
        n = len(prompts) * k
        return SampleOut.from_rows(np.full((n, 2), 7), np.full(n, 2), np.zeros((n, 2)), ["RD"] * n, 4)
    return sample


class Env:
    """The demo workflow; the step of cohort `fail_task`'s first task raises (a worker that fails)."""

    def __init__(self, fail_task=None):
        from atgrpo_jax.envs.workflow_registry import make_workflow

        self.wf = make_workflow("plan_path_demo", view="local", lenient=True, plan_len=2, exec_len=2)
        self.agents, self.max_turns, self.name, self.splits = (self.wf.agents, self.wf.max_turns, self.wf.name,
                                                               self.wf.splits)
        self.fail_task = fail_task

    def __getattr__(self, name):
        return getattr(self.wf, name)

    def reset(self, task_ids, split):
        self.first = int(np.asarray(task_ids)[0])
        return self.wf.reset(task_ids, split)

    def step(self, state, *args):
        if self.fail_task is not None and self.first == self.fail_task:
            raise RuntimeError("the environment broke")
        return self.wf.step(state, *args)


def rollout(env, fn, timeout_s, cohorts=2, asynchronous=True):
    schedule = Schedule(cohorts=cohorts, asynchronous=asynchronous, host_workers=2, pool_of_agent=(0, 1),
                        pool_names=("A", "B"), stage_timeout_s=timeout_s)
    return TreeRollout(2).begin(RolloutInputs(env, fn, lambda m, a: [1, 2, 3], np.arange(4), "train", max_turns=2,
                                              alpha=1.0, key=jax.random.key(0), schedule=schedule)).run()


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_hung_stage_is_named_after_the_timeout(asynchronous):
    """Either schedule: the synchronous one (system.schedule=sync, the default) runs its stages in a
    watched thread, so a hung device call or sandbox wait is reported, not waited for."""
    rollout(Env(), sample_fn(), timeout_s=0.0)  # compiles the environment's functions: no stage is slow later
    t0 = time.monotonic()
    cohort = r"\d" if asynchronous else "0"
    with pytest.raises(StageTimeout, match=rf"the stage 'sample agent 1 turn 0 of cohort {cohort} \(pool B\)' has "
                                           r"run \d+ s, longer than system.stage_timeout_s=3"):
        rollout(Env(), sample_fn(hang_agent=1), timeout_s=3.0, asynchronous=asynchronous)
    assert time.monotonic() - t0 < 30


def test_the_first_error_is_raised_at_once_while_another_stage_hangs():
    # cohort 0 (tasks 0, 1) hangs in agent 1's sampling; cohort 1 (tasks 2, 3) fails in its first step
    env = Env(fail_task=2)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="the environment broke"):
        rollout(env, sample_fn(hang_agent=1), timeout_s=0.0)  # no timeout: only the error ends it
    assert time.monotonic() - t0 < 20  # not the 120 s of the hung stage


def test_without_faults_the_timeout_changes_nothing():
    a = rollout(Env(), sample_fn(), timeout_s=30.0)
    b = rollout(Env(), sample_fn(), timeout_s=0.0)
    c = rollout(Env(), sample_fn(), timeout_s=30.0, asynchronous=False)  # the watched synchronous schedule
    for x in (b, c):
        assert np.array_equal(a[0].reward, x[0].reward) and np.array_equal(a[1].success, x[1].success)


def test_an_error_in_the_watched_synchronous_schedule_is_raised_as_is():
    with pytest.raises(RuntimeError, match="the environment broke"):
        rollout(Env(fail_task=0), sample_fn(), timeout_s=30.0, cohorts=1, asynchronous=False)


@pytest.mark.full  # tiers.py: ~30 s; the watched stages above and the evaluate case below cover the timeout
def test_a_hung_environment_step_stops_the_cli_run_with_one_line(tmp_path):
    """The default synchronous schedule as a user runs it (the asynchronous one: the tests above)."""
    import os

    from faults_util import assert_no_traceback, run, stderr_lines, train_args

    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    proc = run(train_args(tmp_path / "run", "--config.env.workflow=hanging_workflow:make",
                          "--config.system.stage_timeout_s=20", "--config.train.checkpoint_every=50"), env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert_no_traceback(proc)
    line = stderr_lines(proc)[-1]
    assert re.fullmatch(r"error: at step 2: the stage 'environment step of agent 0 turn 0 of cohort 0' has run "
                        r"2\d s, longer than system.stage_timeout_s=20; checkpoint 1 saved \(the last completed step\); fix "
                        r"the cause and run the same command to resume from step 1", line)
    assert os.listdir(tmp_path / "run" / "checkpoints") == ["1"]  # saved after the timeout, within its deadline
    assert len(stderr_lines(proc)) == 1, proc.stderr[-3000:]  # no abort of the stuck thread at exit
    assert time.monotonic() - t0 < 200  # not the 600 s of the hung step


def test_a_stage_timeout_outside_training_is_one_line_and_exits_at_once():
    """evaluate: cli.fail ends the process without waiting on the stuck thread (nor printing a traceback)."""
    import sys

    from faults_util import run, stderr_lines

    code = ("import threading, time\nfrom atgrpo_jax import cli\nfrom atgrpo_jax.rollout.dispatch import StageTimeout\n"
            "threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon: exit would wait on it\n"
            "with cli.fail():\n    raise StageTimeout('the stage s has run 4 s, longer than system.stage_timeout_s=3')\n")
    t0 = time.monotonic()
    proc = run([sys.executable, "-c", code], timeout=120)
    assert (proc.returncode, stderr_lines(proc)) == (
        1, ["error: the stage s has run 4 s, longer than system.stage_timeout_s=3"]), proc.stderr[-2000:]
    assert time.monotonic() - t0 < 100
