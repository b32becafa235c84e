"""What an operator runs into, each ending in one line with nothing lost or mixed: two runs on one
workdir, a killed run's lock, rewards that are not finite numbers, numbers that cannot train, data that
is not UTF-8, evaluating one run's workdir with another's config, and tools that write files."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from atgrpo_jax.errors import RewardError
from atgrpo_jax.rollout.cohort import checked_rewards
from faults_util import ROOT, assert_no_traceback, metrics_rows, run, stderr_lines, train_args
from tiny_config import tiny


def test_a_second_run_on_a_workdir_is_refused_and_a_killed_run_s_lock_is_taken_over(tmp_path):
    work = tmp_path / "run"
    first = subprocess.Popen(train_args(work, steps=40), cwd=ROOT, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not (work / "metrics.jsonl").exists() and time.time() < deadline:  # it holds the lock by then
            time.sleep(0.2)
        second = run(train_args(work, steps=40))
        lines = stderr_lines(second)
        assert second.returncode == 2 and len(lines) == 1, second.stderr[-3000:]
        assert re.fullmatch(rf"error: --workdir {work} is in use by another run: pid {first.pid} on \S+ \(since "
                            r"[\d-]+ [\d:]+\)\. Wait for it to end \(or stop it\), or give another --workdir", lines[0])
        first.send_signal(signal.SIGKILL)  # no cleanup at all: the OS frees its lock
        first.wait(timeout=30)
        rows_before = len(metrics_rows(work))
        third = run(train_args(work, "--config.train.checkpoint_every=1", steps=rows_before + 1))
        assert third.returncode == 0, third.stderr[-3000:]
        assert f"note: took over {work}/train.lock from pid {first.pid}" in third.stdout
        steps = [r["step"] for r in metrics_rows(work)]
        assert steps == sorted(set(steps))  # one writer: no step twice
    finally:
        if first.poll() is None:
            first.kill()


@pytest.mark.parametrize("values, message", [
    ([[1.0, 1e39]], r"1e\+39 is not a finite float32 number \(task 7 of the step, branch 1\)"),
    ([[float("inf"), 0.0]], r"inf is not a finite float32 number \(task 7 of the step, branch 0\)"),
    ([["1", 0.0]], r"'1' is not a number \(task 7 of the step, branch 0\)"),
    (np.array([[0.0, None]], dtype=object), r"None is not a number \(task 7 of the step, branch 1\)"),
    ([[0.0, 1.0, 2.0]], r"shape \(1, 3\), expected \(1, 2\)"),
])
def test_a_workflow_s_rewards_must_be_finite_numbers(values, message):
    with pytest.raises(RewardError, match=message) as e:
        checked_rewards(values, np.array([True]), 2, "plan's team reward at turn 1", np.array([7]))
    assert str(e.value).startswith("plan's team reward at turn 1: ")
    assert checked_rewards([[True, 0]], np.array([True]), 2, "r", np.array([7])).tolist() == [[1.0, 0.0]]
    done = np.array([[float("nan"), 0.0]])  # a finished task's values are not read
    assert checked_rewards(done, np.array([False]), 2, "r", np.array([7])).shape == (1, 2)


# (the score float32 cannot hold is also refused in this process, below: checked_rewards)
@pytest.mark.parametrize("fn, message", [
    ("exits", r"raised SystemExit: 3"),
    pytest.param("too_large", r"returned 1e\+39 for response 0", marks=pytest.mark.full),
])
def test_a_reward_function_that_exits_or_scores_too_high_is_one_line(tmp_path, fn, message):
    """Through the command: the reward function's SystemExit, and a score float32 cannot hold."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    base = [sys.executable, "-m", "atgrpo_jax.train", f"--config={ROOT}/configs/sum_digits.py",
            "--config.env.workflow=prompt_reward", f"--config.env.kwargs={{'train_path': '{data}', "
            f"'test_path': '{data}'}}", "--config.train.steps=1", "--config.train.eval_every=0"]
    proc = run([*base, f"--workdir={tmp_path / fn}", f"--config.env.kwargs.reward_fn=prompt_reward_fns:{fn}"],
               env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests")))
    assert_no_traceback(proc)
    lines = stderr_lines(proc)
    assert proc.returncode == 2 and re.search(message, lines[-1]), proc.stderr[-3000:]
    assert lines[-1].startswith("error: at step 1: env.kwargs.reward_fn='prompt_reward_fns:")
    assert lines[-1].endswith("; no checkpoint yet; fix the cause and run the same command to start afresh")


NOT_TRAINABLE = [
    ("optim.lr", float("inf"), "config.optim.lr: must be a finite number, got inf"),
    ("optim.lr", 1e39, "config.optim.lr: must be a finite float32 number (at most 3.403e+38 in size: the arrays "
                       "it meets are float32), got 1e+39"),
    ("optim.b1", 1.0, "config.optim.b1: must be in [0, 1), got 1.0"),
    ("optim.b2", 1.5, "config.optim.b2: must be in [0, 1), got 1.5"),
    ("algo.alpha", float("nan"), "config.algo.alpha: must be a finite number, got nan"),
    ("loss.kl_coef", float("-inf"), "config.loss.kl_coef: must be a finite number, got -inf"),
]


def test_numbers_that_cannot_train_are_refused_before_anything_runs(tmp_path):
    """Through the command once (one line, exit 2, no workdir); every number through `resolve`, the check the
    command runs before it writes anything."""
    from atgrpo_jax.train.config import ConfigError
    from atgrpo_jax.train.validate import resolve

    proc = run(train_args(tmp_path / "run", "--config.optim.lr=inf"))
    assert proc.returncode == 2 and stderr_lines(proc) == [f"error: {NOT_TRAINABLE[0][2]}"], proc.stderr[-3000:]
    assert not (tmp_path / "run").exists()
    for key, value, message in NOT_TRAINABLE:
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            resolve(tiny(**{key: value}))


def test_data_that_is_not_utf8_names_its_file_and_line(tmp_path):
    from atgrpo_jax.data import load_records
    from atgrpo_jax.errors import DataError

    bad = tmp_path / "train.jsonl"
    bad.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(DataError, match=rf"^{bad}:2: not UTF-8 text \(byte 0xe9 at column 16\); save the file as "
                                        "UTF-8$"):
        list(load_records(str(bad), ("prompt",), {}))


def test_evaluating_a_run_with_another_config_names_the_keys_that_differ(finished_run, tmp_path):
    proc = run([sys.executable, "-m", "atgrpo_jax.evaluate", f"--checkpoint={finished_run}",
                f"--config={ROOT}/tests/train/tiny_config.py", "--config.model.vocab_size=200",
                f"--out={tmp_path / 'eval'}"])
    assert_no_traceback(proc)
    lines = stderr_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert re.fullmatch(rf"error: the checkpoints in {finished_run}/checkpoints were trained with another config "
                        r"\(model.vocab_size: \d+ in the run, 200 here\), so they do not restore into this one: leave "
                        r"out --config \(the run's own config.json is used\) or give the run's config", lines[0])
    assert "strict=False" not in proc.stderr


def test_bench_device_writes_under_runs_not_the_current_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.bench", "device", "--tiny", "--parts=facts"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.listdir(tmp_path) == ["runs"]
    [out] = (tmp_path / "runs" / "bench_device").iterdir()
    assert (out / "device.json").exists() and f"figures in runs/bench_device/{out.name}/" in proc.stdout
