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
from faults_util import ROOT, run, stderr_lines


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


@pytest.mark.parametrize("regimes,seeds,message", [
    (["shared"], ["x"], "--seeds"), (["shared"], ["-1"], "--seeds"), (["shared"], [], "--seeds"),
    (["shared"], ["0", "0"], "--seeds: 0 given more than once"), ([], ["0"], "--regimes: none given"),
    (["shared", "shared"], ["0"], "--regimes: shared given more than once"), (["bogus"], ["0"], "--regimes"),
])
def test_ablate_flags_are_checked_before_any_run(regimes, seeds, message, tmp_path):
    from atgrpo_jax.ablate import run_table

    out = tmp_path / "out"
    with pytest.raises(cli.UsageError, match=message):
        run_table(base_config(), regimes, seeds, str(out))
    assert not out.exists()


def test_ablate_checks_every_run_s_config_before_writing(tmp_path):
    from atgrpo_jax.ablate import run_table
    from atgrpo_jax.train.config import ConfigError

    with pytest.raises(ConfigError, match="model.hf_path"):  # the base config's 1.7B preset has no weights
        run_table(base_config(), ["shared"], ["0"], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--num-devices=0", "--num-devices=-2", "--policies=0"])
def test_plan_counts_must_be_positive(flag, capsys):
    from atgrpo_jax import plan

    assert plan.main(["plan", f"--config={ROOT}/configs/demo.py", flag]) == 2
    assert capsys.readouterr().err == f"error: {flag}: must be >= 1\n"


def test_every_command_s_flags_are_one_line_and_exit_2(tmp_path):
    """absl's own flag errors (an unknown flag, a value of the wrong type or not among the choices, an
    extra argument) as the config keys' errors are: one line, exit 2, nothing written."""
    import subprocess

    config = f"--config={ROOT}/tests/train/tiny_config.py"
    commands = {
        "train": [config, f"--workdir={tmp_path}/run", "--bogus=1"],
        "evaluate": ["--checkpoint=x", "--k=two", f"--out={tmp_path}/eval"],
        "export": ["--checkpoint=x", "--lora=bogus", f"--out={tmp_path}/hf"],
        "ablate": [config, f"--out={tmp_path}/ablate", "--seeds=0,0"],
        "plan": [config, "extra"],
    }
    procs = {name: subprocess.Popen([sys.executable, "-m", f"atgrpo_jax.{name}", *args], cwd=ROOT, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, args in commands.items()}  # at once: most of each is the interpreter's start
    expected = {"train": "error: Unknown command line flag 'bogus'",
                "evaluate": "error: flag --k=two: invalid literal for int() with base 10: 'two'",
                "export": "error: flag --lora=bogus: value should be one of <merge|adapter>",
                "ablate": "error: --seeds: 0 given more than once",
                "plan": "error: unexpected arguments: ['extra']"}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        lines = stderr_lines(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        assert (proc.returncode, lines) == (2, [expected[name]]), (name, err[-2000:])
    assert os.listdir(tmp_path) == []
