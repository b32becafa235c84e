"""A run killed inside its first checkpoint save: the next start begins again at step 0 and its
files hold each row once (the killed run's step-0 evaluation row is not kept twice)."""
import json
import os

from faults_util import assert_no_traceback, run, train_args


def test_a_kill_in_the_first_save_leaves_no_duplicated_rows(tmp_path):
    work = tmp_path / "run"
    (work / "checkpoints" / "1.orbax-checkpoint-tmp-1700000000").mkdir(parents=True)  # the save that died
    killed_rows = [{"step": 0, "eval_success": 0.125}, {"step": 1, "loss": 0.5}]
    (work / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in killed_rows))
    proc = run(train_args(work, "--config.train.eval_every=1", "--config.train.eval_tasks=2", steps=1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_no_traceback(proc)
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["eval_success"] != 0.125 and "loss" in rows[1] and rows[1]["loss"] != 0.5  # this run's rows
    assert sorted(os.listdir(work / "checkpoints")) == ["1"]  # the partial save is cleaned up
    assert "step 0 (before training): held-out success" in proc.stdout
    assert "step 1: held-out success" in proc.stdout  # every evaluation, not only the first and the last
