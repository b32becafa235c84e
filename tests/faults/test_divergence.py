"""Divergence stops the run: train.max_skipped_updates consecutive skipped (non-finite) updates end
it with one line and exit 1, and no checkpoint is written from the first skipped update on."""
import json
import os
import re

import pytest

from atgrpo_jax.train.guard import skip_streaks
from faults_util import assert_no_traceback, metrics_rows, run, stderr_lines, train_args


def test_a_diverging_run_stops_and_keeps_only_checkpoints_before_it(tmp_path):
    work = tmp_path / "run"
    # lr 1e10: step 1 runs at lr 0 (the warm-up starts there, as verl's); step 2's first update sends
    # the weights to ~1e10 and every later one has a NaN gradient
    proc = run(train_args(work, "--config.optim.lr=1e10", "--config.train.checkpoint_every=1", steps=20))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert_no_traceback(proc)
    rows = metrics_rows(work)
    assert rows[0]["skipped"] == 0 and all(r["skipped"] > 0 for r in rows[1:])
    streaks = [{}]
    for r in rows:
        streaks.append(skip_streaks(streaks[-1], r, ["policy"]))
    assert [s.get("policy", 0) >= 4 for s in streaks[1:]] == [False] * (len(rows) - 1) + [True]  # stopped at once
    assert re.fullmatch(rf"error: diverged at step {rows[-1]['step']}: the last \d+ updates were skipped "
                        r"\(non-finite loss or gradient; train.max_skipped_updates=4\); last good checkpoint: 1\. "
                        r"Usual causes: optim.lr too high, .*; resume from it with other settings", stderr_lines(proc)[-1])
    assert os.listdir(work / "checkpoints") == ["1"]
    assert re.search(r"grad_norm nan  skipped [1-9]", proc.stdout)  # the console says so, every step
    with open(work / "metrics.jsonl") as f:
        assert all(json.loads(line) for line in f)  # null, never NaN, in the JSON


@pytest.mark.full  # tiers.py: 20 s of a run; the diverging run (above) keeps the family in the default tier
def test_max_skipped_updates_zero_never_stops_but_says_what_it_skipped(tmp_path):
    """The run goes to its end; it says how many updates it skipped, and fails if it saved nothing."""
    args = ("--config.optim.lr=1e10", "--config.train.max_skipped_updates=0")
    proc = run(train_args(tmp_path / "run", *args, "--config.train.checkpoint_every=2", steps=3))
    assert [r["step"] for r in metrics_rows(tmp_path / "run")] == [1, 2, 3]
    assert proc.returncode == 1 and re.fullmatch(
        r"error: the run ended at step 3 without a checkpoint: \d+ updates of this run were skipped \(non-finite "
        r"loss or gradient; optim.lr too high, .*\)", stderr_lines(proc)[-1]), proc.stderr[-3000:]
    assert not os.listdir(tmp_path / "run" / "checkpoints")
    proc = run(train_args(tmp_path / "saved", *args, "--config.train.checkpoint_every=1", steps=3))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"warning: \d+ updates of this run were skipped .*; the last checkpoint is step 1", proc.stdout)


@pytest.mark.parametrize("steps,expected", [
    ([(0, 2, 0)], {"p": 0}),  # applied updates: no streak
    ([(2, 2, 2), (2, 2, 2)], {"p": 4}),  # all skipped twice: the streak grows across steps
    ([(2, 2, 2), (1, 3, 1)], {"p": 1}),  # one applied update restarts it at the skips after it
    ([(2, 2, 2), (1, 3, 0)], {"p": 0}),
    ([(2, 2, 2), None], {"p": 2}),  # no update this step (every group filtered out): unchanged
])
def test_skip_streaks_count_consecutive_skipped_updates(steps, expected):
    streaks = {}
    for s in steps:
        metrics = {} if s is None else dict(zip(("skipped", "updates", "skipped_tail"), s))
        streaks = skip_streaks(streaks, metrics, ["p"])
    assert streaks == expected


def test_skip_streaks_are_per_policy():
    metrics = {"a/skipped": 2.0, "a/updates": 2.0, "a/skipped_tail": 2.0,
               "b/skipped": 0.0, "b/updates": 2.0, "b/skipped_tail": 0.0}
    assert skip_streaks({"a": 1, "b": 5}, metrics, ["a", "b"]) == {"a": 3, "b": 0}
