"""train.loggers: console / tensorboard / jsonl / wandb, and the sum-of-digits recipe that uses them.

wandb is not installed here (and not in the test extra: it is heavy), so W&B is a fake module put in
sys.modules that records every call; the logger uses only wandb.init / log / Table / finish.
"""
import json
import math
import os
import sys
import types

import pytest

from atgrpo_jax import cli
from atgrpo_jax.train.config import ConfigError, base_config
from atgrpo_jax.train.metrics import MetricsWriter
from atgrpo_jax.train.metrics_files import read_metrics
from atgrpo_jax.train.validate import resolve
from atgrpo_jax.train.wandb_log import RUN_ID_FILE, WandbLogger

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture
def fake_wandb(monkeypatch):
    calls = []
    mod = types.ModuleType("wandb")

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    mod.Table = Table
    mod.init = lambda **kw: calls.append(("init", kw)) or types.SimpleNamespace(id=kw["id"])
    mod.log = lambda values, step=None: calls.append(("log", step, values))
    mod.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return calls


@pytest.mark.parametrize("loggers, message", [
    (("console", "mlflow"), r"config.train.loggers: unknown 'mlflow'; known: console, tensorboard, jsonl, wandb"),
    (("console", "wandbb"), r"did you mean 'wandb'"),
    (("console", 3), r"config.train.loggers: must be a tuple of names"),
])
def test_unknown_loggers_are_one_line(loggers, message):
    c = base_config()
    c.model.preset = "demo-tiny"
    c.train.loggers = loggers
    with pytest.raises(ConfigError, match=message) as e:
        resolve(c)
    assert "\n" not in str(e.value)


def test_wandb_gets_the_scalars_the_episodes_and_the_config_and_resume_keeps_the_run(tmp_path, fake_wandb):
    config = {"env.workflow": "prompt_reward", "rollout.prompt_buckets": (32,)}
    logger = WandbLogger(str(tmp_path), config, project="p", entity="", resumed=False)
    with MetricsWriter(str(tmp_path), tensorboard=False, extra=[logger]) as w:
        w.write(1, {"loss": 0.5, "grad_norm": float("nan"), "updates": 2})
        w.write_rows("episodes.jsonl", [{"step": 1, "task": 0, "success": 1.0, "turns": 1.0, "log": [
            {"turn": 0, "agent": "assistant", "prompt": "1+2=", "selected": 0, "branches": [
                {"response": "3", "parsed_as": "score 1", "local": 1.0, "team": 1.0, "reward": 1.0, "advantage": 0.7},
                {"response": "4", "parsed_as": "score 0", "local": 0.0, "team": 0.0, "reward": 0.0, "advantage": -0.7}]}]}])
    (init, kw), log, table, finish = fake_wandb
    assert kw["project"] == "p" and kw["resume"] == "allow" and kw["config"]["rollout.prompt_buckets"] == [32]
    assert log == ("log", 1, {"loss": 0.5, "updates": 2})  # the same scalars as metrics.jsonl, NaN left out
    assert read_metrics(str(tmp_path))[0]["grad_norm"] is None and not (tmp_path / "tb").exists()
    assert table[1] == 1 and table[2]["episodes"].data[1][4:] == ["1+2=", "4", "score 0", 0.0, -0.7]
    assert finish == ("finish",)
    run_id = (tmp_path / RUN_ID_FILE).read_text().strip()
    assert kw["id"] == run_id
    WandbLogger(str(tmp_path), config, project="p", entity="", resumed=True)  # a resume: the same W&B run
    assert fake_wandb[-1][1]["id"] == run_id
    WandbLogger(str(tmp_path), config, project="p", entity="", resumed=False)  # a fresh start: a new one
    assert fake_wandb[-1][1]["id"] != run_id != (tmp_path / RUN_ID_FILE).read_text().strip()


def test_wandb_without_the_package_is_a_config_error(tmp_path, monkeypatch):
    from atgrpo_jax.train.loop import run_training

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    c = cli.config_from_args(os.path.join(ROOT, "configs", "sum_digits.py"), [("train.loggers", "('wandb',)")])
    with pytest.raises(ConfigError, match=r"'wandb' needs the wandb package, which is not installed: pip install"):
        run_training(c, str(tmp_path))
    assert not os.listdir(tmp_path)  # nothing written


def test_sum_digits_runs_two_steps_into_wandb_only(tmp_path, fake_wandb, capsys):
    """configs/sum_digits.py (prompt_reward + the config's reward function): 2 steps, metrics to W&B and jsonl."""
    from atgrpo_jax.train.loop import run_training

    c = cli.config_from_args(os.path.join(ROOT, "configs", "sum_digits.py"), [
        ("train.steps", "2"), ("train.eval_every", "0"), ("train.log_episodes_every", "1"), ("rollout.num_tasks", "8"),
        ("train.loggers", "('jsonl', 'wandb')")])
    run_training(c, str(tmp_path))
    assert "step 1/2" not in capsys.readouterr().out and not (tmp_path / "tb").exists()  # no console, no tb
    rows = read_metrics(str(tmp_path))
    logged = {step: values for kind, step, values in [x for x in fake_wandb if x[0] == "log"]
              if not any(hasattr(v, "data") for v in values.values())}
    assert [r["step"] for r in rows] == sorted(logged) == [1, 2]  # (no evaluation: one compilation less)
    for r in rows:  # the same scalars at the same steps (non-finite ones left out)
        assert logged[r["step"]] == {k: v for k, v in r.items() if k != "step" and v is not None}
    assert 0 <= rows[-1]["success"] <= 1 and math.isfinite(rows[-1]["loss"]) and rows[-1]["updates"] >= 1
    tables = [(step, values["episodes"]) for kind, step, values in [x for x in fake_wandb if x[0] == "log"]
              if "episodes" in values]
    assert [s for s, _ in tables] == [1, 2] and all(len(t.data) == 2 * 8 for _, t in tables)  # 2 tasks x K=8
    assert tables[0][1].data[0][4].endswith("=<|im_end|>\n<|im_start|>assistant\n")
    init = fake_wandb[0][1]
    assert init["config"]["env.workflow"] == "prompt_reward" and init["id"] == (tmp_path / RUN_ID_FILE).read_text().strip()
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert all(b["parsed_as"].startswith("score ") for e in episodes for t in e["log"] for b in t["branches"])
