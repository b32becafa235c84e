"""A resumed run's history is whole or says why not: a missing or damaged metrics.jsonl stops the resume
in one line, with the workdir (config.json and its config.stepN.json records included) as it was;
--new_history starts a new file beside a note. A change of system.staleness on resume works both ways.
In process, on copies of the faults' finished run."""
import json
import os
import re
import signal

import pytest

from atgrpo_jax import cli
from atgrpo_jax.errors import UsageError
from atgrpo_jax.train.history import NOTE_FILE
from atgrpo_jax.train.loop import run_training
from faults_util import FINISHED, copy_run, metrics_rows, snapshot
from tiny_config import tiny


def finished_config(**changes):
    """The finished run's own config (faults_util.FINISHED over train_args' settings)."""
    settings = {k.removeprefix("--config.").split("=")[0]: int(k.split("=")[1]) for k in FINISHED}
    return tiny(**{"train.eval_every": 0, "train.keep_last": 0, **settings, **changes})


def test_a_missing_metrics_file_stops_the_resume_and_changes_nothing(finished_run, tmp_path):
    work = copy_run(finished_run, tmp_path / "run")
    os.remove(work / "metrics.jsonl")
    before = snapshot(work)
    message = (f"--workdir {work}: metrics.jsonl is missing, though the run resumes at step 4: its rows up to there "
               "would be lost. Put the file back, or pass --new_history to start a new metrics.jsonl from step 5 "
               "(a note beside it says so)")
    with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):  # a config change too: refused as a whole
        run_training(finished_config(**{"train.seed": 1}), str(work), allow_config_change=True)
    assert snapshot(work) == before  # config.json as it was, no config.step4.json
    run_training(finished_config(), str(work), print_result=False, new_history=True)  # all 4 steps done already
    assert (work / NOTE_FILE).read_text() == ("metrics.jsonl begins at step 5: when the run resumed at step 4, "
                                              "metrics.jsonl is missing.\n")


@pytest.mark.full  # the missing file above keeps the history family in the default tier
def test_a_damaged_metrics_file_is_named_by_its_line_and_kept_beside_the_new_one(finished_run, tmp_path):
    work = copy_run(finished_run, tmp_path / "run")
    lines = (work / "metrics.jsonl").read_text().splitlines()
    (work / "metrics.jsonl").write_text("\n".join(lines[:1] + ["{torn"] + lines[1:]) + "\n")
    with pytest.raises(UsageError, match=r": metrics.jsonl:2 is not a metrics row, though the run resumes at step 4"):
        run_training(finished_config(), str(work))
    run_training(finished_config(), str(work), print_result=False, new_history=True)
    [kept] = [n for n in os.listdir(work) if n.startswith("metrics.jsonl.damaged-")]
    assert (work / kept).read_text().splitlines()[1] == "{torn"
    assert f"(kept as {kept})" in (work / NOTE_FILE).read_text()


class StopAfter:
    """SIGTERM once step `step` is done (and checkpointed): the run stops there with rollouts in flight."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, step, metrics):
        if step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.full  # ~30 s of in-process runs; the missing file above keeps the history family in the default tier
def test_staleness_changes_on_resume_work_both_ways_and_keep_each_config(tmp_path):
    """Stopped with rollouts in flight under staleness 2, resumed under 1 (those parts do not fit its
    parts: the next step samples with its own weights), stopped again, resumed under 2."""
    work = str(tmp_path / "run")
    c = tiny(**{"train.eval_every": 0, "train.keep_last": 0, "train.checkpoint_every": 1, "train.steps": 4})
    for stop_after, staleness in ((2, 2), (3, 1), (None, 2)):
        c.system.staleness = staleness
        callbacks = [StopAfter(stop_after)] if stop_after else []
        if stop_after:
            with pytest.raises(cli.RunStopped, match=f"stopped by SIGTERM at step {stop_after}"):
                run_training(c, work, allow_config_change=True, callbacks=callbacks)
        else:
            run_training(c, work, allow_config_change=True, print_result=False)
        assert json.load(open(os.path.join(work, "config.json")))["system"]["staleness"] == staleness
    kept = {n: json.load(open(os.path.join(work, n)))["system"]["staleness"] for n in os.listdir(work)
            if n.startswith("config.step")}
    assert kept == {"config.step2.json": 2, "config.step3.json": 1}
    assert [r["step"] for r in metrics_rows(work)] == [1, 2, 3, 4]
