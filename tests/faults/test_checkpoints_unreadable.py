"""Resuming from damaged checkpoints: the newest one that restores is used, each one that does not
is named in one line, and nothing in the workdir changes until a restore succeeded."""
import os
import re
import shutil

import pytest
from faults_util import (FINISHED, assert_no_traceback, copy_run, metrics_rows, run, snapshot, stderr_lines,
                         train_args)


def largest_data_file(step_dir):
    files = [os.path.join(root, f) for root, _, names in os.walk(step_dir / "state") for f in names]
    return max(files, key=os.path.getsize)


def flip_64_bytes_of_largest_data_file(step_dir):
    """64 bytes inverted in the middle of the state's largest file, its size unchanged (a bad disk, a bad copy)."""
    biggest = largest_data_file(step_dir)
    with open(biggest, "r+b") as f:
        f.seek(os.path.getsize(biggest) // 2)
        data = f.read(64)
        f.seek(os.path.getsize(biggest) // 2)
        f.write(bytes(b ^ 0xFF for b in data))
    return os.path.relpath(biggest, step_dir)


def test_damaged_newest_checkpoints_fall_back_and_resume_exactly(finished_run, tmp_path):
    work = copy_run(finished_run, tmp_path / "run")
    ckpts = work / "checkpoints"
    shutil.copytree(ckpts / "1", ckpts / "6")  # a folder named for another step than it holds
    flipped = flip_64_bytes_of_largest_data_file(ckpts / "4")  # restores without an error: only its hash tells
    (ckpts / "3" / "state" / "_METADATA").write_text("garbage")
    shutil.rmtree(ckpts / "2" / "state")  # the arrays are gone
    proc = run(train_args(work, *FINISHED))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_no_traceback(proc)
    lines = stderr_lines(proc)
    causes = {6: r"the folder 6 holds step 1 \(its manifest.json says so\)",
              4: re.escape(flipped) + r" differs from its manifest \(content hash\)", 3: "state/_METADATA .+", 2: ".+"}
    for step, then in ((6, 4), (4, 3), (3, 2), (2, 1)):
        assert any(re.fullmatch(rf"checkpoint {step} in .* does not restore \({causes[step]}\); trying checkpoint {then}",
                                x) for x in lines), lines
    assert "resuming at step 1" in proc.stdout
    assert sorted(os.listdir(ckpts)) == ["1", "2", "3", "4"]  # 2..4 written again
    assert len(os.listdir(work / "checkpoints.unreadable")) == 4  # the damaged ones, kept for a post-mortem
    assert metrics_rows(work) == metrics_rows(finished_run)  # steps 2..4 again, bitwise as the first time


@pytest.mark.full  # tiers.py: 18 s of runs; the damaged-newest fallback (below) keeps the family in the default tier
def test_no_readable_checkpoint_changes_nothing_unless_asked(finished_run, tmp_path):
    work = copy_run(finished_run, tmp_path / "run")
    for step in "1234":
        (work / "checkpoints" / step / "state" / "_METADATA").write_text("{")
    before = snapshot(work)
    proc = run(train_args(work, *FINISHED, "--config.train.steps=6"))  # changed: config.json must stay
    assert proc.returncode == 1
    assert_no_traceback(proc)
    assert re.match(r"error: no checkpoint in .* restores \(tried 4, 3, 2, 1\); nothing was changed\. "
                    r"Pass --fresh_if_unreadable", stderr_lines(proc)[-1])
    assert snapshot(work) == before
    proc = run(train_args(work, *FINISHED, "--fresh_if_unreadable", steps=1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "starting again from step 0" in proc.stderr
    assert sorted(os.listdir(work / "checkpoints")) == ["1"]
    assert [r["step"] for r in metrics_rows(work)] == [0, 1]  # a new history for the new run
    assert metrics_rows(work)[0] == metrics_rows(finished_run)[0]  # step 1 evaluates too: its last step
    [history] = [p for p in (work / "checkpoints.unreadable").iterdir() if p.name.startswith("history-")]
    assert {"metrics.jsonl", "tb", "config.json"} <= set(os.listdir(history))  # the earlier run's, kept whole
    assert metrics_rows(history) == metrics_rows(finished_run)
    assert "kept the earlier run's metrics.jsonl" in proc.stderr


def test_a_config_change_that_no_checkpoint_fits_is_named_and_changes_nothing(finished_run, tmp_path):
    """--allow_config_change with another model: the checkpoints are fine, the config is not theirs."""
    work = copy_run(finished_run, tmp_path / "run")
    before = snapshot(work)
    proc = run(train_args(work, *FINISHED, "--allow_config_change", "--config.model.vocab_size=200", steps=5))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert_no_traceback(proc)
    assert re.fullmatch(r"error: the run's checkpoints do not restore into this config \(model.vocab_size changed "
                        r"from \d+ to 200: they hold other shapes or dtypes\); nothing was changed\. Resume with the "
                        r"run's config, or train this one in a new --workdir", stderr_lines(proc)[-1]), proc.stderr[-2000:]
    assert "fresh_if_unreadable" not in proc.stderr
    assert snapshot(work) == before


def test_evaluate_and_export_of_a_checkpoint_that_does_not_restore_say_so_in_one_line(finished_run, tmp_path):
    """No fallback here (the user chose the checkpoint, the latest by default): one line naming it, its
    cause and the others, exit 2; orbax's leftovers of the failed read (tracebacks of its background
    reads, 'Exception ignored in <coroutine>') do not reach stderr."""
    import subprocess
    import sys

    from faults_util import ROOT

    work = copy_run(finished_run, tmp_path / "run")
    flip_64_bytes_of_largest_data_file(work / "checkpoints" / "4")  # found by its manifest, before any array is read
    commands = {"evaluate": ["--out=" + str(tmp_path / "eval")], "export": ["--out=" + str(tmp_path / "hf")]}
    procs = {name: subprocess.Popen([sys.executable, "-m", f"atgrpo_jax.{name}", f"--checkpoint={work}", *args],
                                    cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, args in commands.items()}
    how = {"evaluate": f"--checkpoint={work}/checkpoints/STEP", "export": "--step"}
    for name, p in procs.items():
        out, err = p.communicate(timeout=300)
        proc = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        assert proc.returncode == 2, (name, err[-3000:])
        assert_no_traceback(proc)
        lines = stderr_lines(proc)
        assert len(lines) == 1 and re.fullmatch(
            rf"error: checkpoint 4 in {work}/checkpoints does not restore \(.+\); choose another with "
            rf"{re.escape(how[name])} \(saved: 1, 2, 3\)", lines[0]), (name, lines)
    assert sorted(os.listdir(tmp_path)) == ["run"]  # nothing written
