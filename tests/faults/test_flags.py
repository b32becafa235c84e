"""Flags that cannot work are one line and exit 2 before any work; no NaN reaches a JSON file."""
import json
import math
import os
import sys

import numpy as np
import pytest

from atgrpo_jax import cli
from atgrpo_jax.evaluate import check_flags
from atgrpo_jax import workdir as wd
from atgrpo_jax.train.config import base_config
from faults_util import run, stderr_lines


@pytest.mark.parametrize("tasks,k,temperature,message", [
    (None, 0, None, "--k=0: must be >= 1"),
    (None, -1, None, "--k=-1: must be >= 1"),
    (-3, None, None, "--tasks=-3: must be >= 1"),
    (0, None, None, "--tasks=0: must be >= 1"),
    (None, None, -0.5, "--temperature=-0.5: must be >= 0"),
    (None, 4, 0.0, "--k=4 at temperature 0: greedy decoding plays the same episode 4 times"),
    (None, 4, None, "--k=4 at temperature 0"),  # the config's eval_temperature is 0
])
def test_bad_evaluate_flags_are_errors(tasks, k, temperature, message):
    with pytest.raises(cli.UsageError, match=message.replace("(", r"\(").replace(".", r"\.")):
        check_flags(base_config(), tasks, k, temperature)


def test_good_evaluate_flags_pass():
    check_flags(base_config(), None, None, None)
    check_flags(base_config(), 3, 4, 0.6)
    check_flags(base_config(), None, 1, 0.0)


def test_evaluate_cli_says_why_before_any_work(finished_run, tmp_path):
    proc = run([sys.executable, "-m", "atgrpo_jax.evaluate", f"--checkpoint={finished_run}", "--k=4",
                f"--out={tmp_path / 'eval'}"], timeout=120)
    assert proc.returncode == 2
    assert stderr_lines(proc) == ["error: --k=4 at temperature 0: greedy decoding plays the same episode 4 times, "
                                  "so avg@4 = pass@4 = avg@1; give --temperature > 0 (e.g. 0.6) or --k=1"]
    assert not os.path.exists(tmp_path / "eval")


def test_json_never_holds_nan():
    record = {"a": float("nan"), "b": [np.float32("inf"), 1.5, np.float64(2.0)], "c": {"d": -math.inf}, "e": "x"}
    text = cli.dumps(record)
    assert json.loads(text) == {"a": None, "b": [None, 1.5, 2.0], "c": {"d": None}, "e": "x"}


def test_check_writable_probes_with_a_real_file(tmp_path):
    wd.check_writable(str(tmp_path / "new" / "deeper"), "--out")  # created later: its parent is probed
    assert os.listdir(tmp_path) == []  # the probe is gone
    (tmp_path / "f").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file"):
        wd.check_writable(str(tmp_path / "f" / "x"), "--out")


@pytest.mark.parametrize("seeds", [["x"], ["-1"], []])
def test_ablate_seeds_are_checked_before_any_run(seeds, tmp_path):
    from atgrpo_jax.ablate import run_table

    with pytest.raises(cli.UsageError, match="--seeds"):
        run_table(base_config(), ["shared"], seeds, str(tmp_path))
    assert os.listdir(tmp_path) == []
