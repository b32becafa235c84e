"""The console shows what the docs say, every step, for every regime: success, the mean reward, and each
policy's loss, gradient norm and skipped updates (several policies: each labelled by its role)."""
import io
import re

import pytest

from atgrpo_jax.train.metrics_files import read_metrics
from atgrpo_jax.train.progress import ProgressBar
from atgrpo_jax.train.start import console_keys
from tiny_config import tiny


def test_one_policy_s_row_shows_its_loss_grad_norm_and_skipped(finished_run):
    row = read_metrics(str(finished_run))[1]  # a training step's row of a real run
    line = ProgressBar(4, stream=io.StringIO(), keys=console_keys(["policy"])).line(row["step"], row)
    for label in ("success", "reward", "loss", "grad_norm", "skipped"):
        assert re.search(rf"  {label} [-\d.e+]+", line), (label, line)


@pytest.mark.full  # an in-process per_role run (~15 s); the one-policy row above keeps the family in the default tier
def test_per_role_console_shows_each_policy_s_loss_grad_norm_and_skipped(tmp_path, capsys):
    from atgrpo_jax.train.loop import run_training

    run_training(tiny(**{"policy.sharing": "per_role", "train.steps": 1, "train.eval_every": 0}), str(tmp_path),
                 print_result=False)
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step 1/1 [")]
    for role in ("planner", "executor"):
        for what in ("loss", "grad_norm", "skipped"):
            assert re.search(rf"  {role} {what} [-\d.e+]+", line), (role, what, line)
