"""Every config file validates in every regime, and its workflow can be built."""
import glob
import importlib.util
import os

import pytest

from atgrpo_jax.envs.registry import make_workflow
from atgrpo_jax.train.config import REGIMES, validate

CONFIGS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "configs", "*.py")))


def load(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_the_configs_the_issue_asks_for_exist():
    names = {os.path.basename(p)[:-3] for p in CONFIGS}
    for task in ("plan_path", "sokoban", "sudoku", "math", "code"):
        for size in ("1p7b", "8b"):
            assert f"{task}_qwen3_{size}" in names
    assert "demo" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.basename(p))
def test_config_validates_in_every_regime_and_builds_its_workflow(path):
    c = load(path)
    for regime in REGIMES:
        c.regime = regime
        validate(c)
    for single in (False, True):
        wf = make_workflow(c.env.workflow, single_agent=single, **dict(c.env.kwargs))
        assert len(wf.agents) == (1 if single else 2)
