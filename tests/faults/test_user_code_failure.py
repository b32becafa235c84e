"""A reward function, an environment or a workflow that raises in the middle of a run: the last completed
step is saved first (as SIGTERM saves it), the error is one line naming the step to resume from, and the
same command resumes equal to an uninterrupted run. One that fails before any checkpoint leaves nothing to
resume: a rerun starts afresh, even with another config. In process (failing_workflow.py raises)."""
import json
import os
import re

import pytest

from atgrpo_jax import cli
from atgrpo_jax.train.checkpoint import Checkpointer
from atgrpo_jax.train.loop import run_training
from faults_util import metrics_rows
from tiny_config import tiny

WORKFLOW = "failing_workflow:make"


def config(**changes):
    return tiny(**{"env.workflow": WORKFLOW, "train.eval_every": 0, "train.keep_last": 0, **changes})


def fail_at(monkeypatch, step, kind="reward"):
    monkeypatch.setenv("FAIL_AT_STEP", str(step))
    monkeypatch.setenv("FAIL_KIND", kind)


def test_a_reward_that_raises_at_step_2_keeps_step_1_and_says_so(tmp_path, monkeypatch, capsys):
    fail_at(monkeypatch, 2)
    with pytest.raises(cli.RunStopped) as e:
        run_training(config(**{"train.steps": 2, "train.checkpoint_every": 50}), str(tmp_path))
    assert e.value.code == 2
    assert str(e.value) == ("error: at step 2: env.kwargs.reward_fn='mine:score' raised ZeroDivisionError: division "
                            "by zero; checkpoint 1 saved (the last completed step); fix the cause and run the same "
                            "command to resume from step 1")
    ckpt = Checkpointer(str(tmp_path / "checkpoints"), keep_last=0, read_only=True)
    assert ckpt.all_steps() == [1]
    ckpt.verify(1)
    assert ckpt.restore(1)[1]["step"] == 1
    assert [r["step"] for r in metrics_rows(tmp_path)] == [1]


@pytest.mark.full  # ~25 s of runs; the reward failure above keeps the user-code family in the default tier
def test_the_resumed_run_equals_an_uninterrupted_one(finished_run, tmp_path, monkeypatch):
    """As an operator runs it: checkpoint_every 50, a failure at step 3, the cause fixed, the same
    command: every row as the reference run's (a checkpoint each step; rows do not depend on it)."""
    from faults_util import FINISHED

    settings = {k.removeprefix("--config.").split("=")[0]: int(k.split("=")[1]) for k in FINISHED}
    c = config(**{**settings, "train.checkpoint_every": 50, "env.workflow": WORKFLOW})
    fail_at(monkeypatch, 3)
    with pytest.raises(cli.RunStopped, match="checkpoint 2 saved"):
        run_training(c, str(tmp_path))
    monkeypatch.delenv("FAIL_AT_STEP")
    run_training(c, str(tmp_path), print_result=False)
    assert metrics_rows(tmp_path) == metrics_rows(finished_run)


@pytest.mark.full  # the reward failure above keeps the user-code family in the default tier
def test_a_bug_in_an_environment_keeps_its_traceback_after_the_save(tmp_path, monkeypatch, capsys):
    fail_at(monkeypatch, 2, kind="bug")
    with pytest.raises(RuntimeError, match="the environment broke"):
        run_training(config(**{"train.steps": 2, "train.checkpoint_every": 50}), str(tmp_path))
    assert re.search(r"error: at step 2: RuntimeError \(below\); checkpoint 1 saved", capsys.readouterr().err)
    assert Checkpointer(str(tmp_path / "checkpoints"), keep_last=0, read_only=True).all_steps() == [1]


@pytest.mark.full  # the reward failure above keeps the user-code family in the default tier
def test_a_rerun_after_a_failure_before_any_checkpoint_starts_afresh(tmp_path, monkeypatch, capsys):
    fail_at(monkeypatch, 1)
    with pytest.raises(cli.RunStopped, match=r"^error: at step 1: .*; no checkpoint yet; fix the cause and run the "
                                             r"same command to start afresh$"):
        run_training(config(**{"train.steps": 1}), str(tmp_path))
    monkeypatch.delenv("FAIL_AT_STEP")
    run_training(config(**{"train.steps": 1, "train.seed": 1}), str(tmp_path), print_result=False)  # another config
    assert "resuming" not in capsys.readouterr().out
    assert json.loads((tmp_path / "config.json").read_text())["train"]["seed"] == 1
    assert [r["step"] for r in metrics_rows(tmp_path)] == [1]
    assert os.listdir(tmp_path / "checkpoints") == ["1"]
    [earlier] = [p for p in tmp_path.iterdir() if p.name.startswith("history-")]  # the failed run's, kept
    assert json.loads((earlier / "config.json").read_text())["train"]["seed"] == 0
