"""The fault tests' fixtures: one small finished run (4 steps, a checkpoint after each, held-out
evaluations at steps 0, 2 and 4) that tests copy and then damage, or repeat with faults."""
import os
import pathlib
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # faults_util, by plain name under importlib mode
from faults_util import FINISHED, run, train_args  # noqa: E402
from shared_builds import built_once  # noqa: E402


@pytest.fixture(scope="session")
def finished_run():
    """A 4-step run with checkpoints 1..4 and its metrics (the uninterrupted reference), built once for every
    worker of the session (tests read or copy it, never change it)."""
    def build(folder):
        workdir = os.path.join(folder, "run")
        proc = run(train_args(workdir, *FINISHED))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1", "2", "3", "4"]

    return pathlib.Path(built_once("finished_run", build)) / "run"
