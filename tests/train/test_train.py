"""The trainer end to end on a tiny config: config errors, the NaN guard, resume (kill -9: tests/faults)."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.train.config import ConfigError, base_config
from atgrpo_jax.train.validate import resolve
from atgrpo_jax.train.metrics_files import read_metrics
from atgrpo_jax.bench.rows import rows_packed
from atgrpo_jax.train.update import init_state, make_optimizer, make_update_fns
from tiny_config import tiny

CONFIG = os.path.join(os.path.dirname(__file__), "tiny_config.py")


@pytest.mark.parametrize("key,value,pattern", [
    ("regime", "mixture", "config.regime"),
    ("policy.sharing", "per_agent", "config.policy.sharing"),
    ("algo.advantage", "gpro", "config.algo.advantage"),
    ("model.preset", "qwen3-8b", "config.model.hf_path"),
    ("rollout.k", 1, "config.rollout.k"),
    ("rollout.top_p", 0.0, "config.rollout.top_p"),
    ("rollout.decode_slots", -1, "config.rollout.decode_slots"),
    ("model.decode_unroll", -2, "config.model.decode_unroll"),
    ("model.sequence_unroll", -1, "config.model.sequence_unroll"),
    ("loss.aggregation", "sum", "config.loss.aggregation"),
    ("optim.lr", -1.0, "config.optim.lr"),
    ("optim.schedule", "linear", "config.optim.schedule"),
    ("mesh.tensor", 0, "config.mesh.tensor"),
    ("model.preset", "qwen9", "config.model.preset"),
    ("rollout.prompt_buckets", (256, 128), "config.rollout.prompt_buckets"),
])
def test_config_errors_name_the_key(key, value, pattern):
    c = base_config()
    c.model.preset = "test-tiny"  # random weights allowed: the one bad key is the only error
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    with pytest.raises(ConfigError, match=pattern.replace(".", r"\.")):
        resolve(c)


def test_cli_rejects_a_bad_override_before_compiling(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "atgrpo_jax.train", f"--config={CONFIG}",
                           f"--workdir={tmp_path}", "--config.optim.lr=-0.5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "config.optim.lr" in proc.stderr


def test_nan_loss_skips_the_update():
    cfg = get_preset("test-tiny", num_layers=1)
    graphdef, params = nnx.split(Qwen3(cfg, rngs=nnx.Rngs(0)))
    c = base_config()
    tx, _ = make_optimizer(c.optim, 10)
    _, update = make_update_fns(graphdef, nnx.State({}), tx, LossSettings(), 64)
    state = init_state(params, tx)
    before = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    opt_before = [np.asarray(x) for x in jax.tree.leaves(state.opt_state)]
    tokens = jnp.ones((2, 8), jnp.int32)
    mask = jnp.ones((2, 8), bool)
    batch = lambda adv: rows_packed(tokens, mask, mask.at[:, 0].set(False), jnp.zeros((2, 8)), adv)  # noqa: E731
    state, m = update(state, batch(jnp.array([jnp.nan, 1.0])))
    assert float(m["skipped"]) == 1.0 and int(state.step) == 0
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(before, jax.tree.leaves(state.params)))
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(opt_before, jax.tree.leaves(state.opt_state)))
    state, m = update(state, batch(jnp.array([-1.0, 1.0])))
    assert float(m["skipped"]) == 0.0 and int(state.step) == 1
    assert any(not np.array_equal(a, np.asarray(b)) for a, b in zip(before, jax.tree.leaves(state.params)))


def test_resume_checks_the_config_logs_every_n_and_knows_its_start(tmp_path, monkeypatch):
    from atgrpo_jax.train import loop, start
    from atgrpo_jax.train.checkpoint import Checkpointer

    starts = []
    real_bar = start.ProgressBar
    monkeypatch.setattr(start, "ProgressBar", lambda *a, **kw: starts.append(kw["start_step"]) or real_bar(*a, **kw))
    workdir = str(tmp_path / "run")
    loop.run_training(tiny(**{"train.steps": 3, "train.eval_every": 0, "train.log_every": 2}), workdir)
    assert [r["step"] for r in read_metrics(workdir)] == [2, 3]  # every 2nd step, and the last
    with pytest.raises(ConfigError, match=r"config\.rollout\.k: 2 in the run, 3 now"):
        loop.run_training(tiny(**{"train.steps": 4, "rollout.k": 3}), workdir)
    assert Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=0, read_only=True).all_steps()[-1] == 3
    # more steps, and fewer rows decoding at once (the same samples): allowed
    loop.run_training(tiny(**{"train.steps": 4, "train.eval_every": 0, "rollout.decode_slots": 3}), workdir)
    assert starts == [0, 3]
    loop.run_training(tiny(**{"train.steps": 5, "train.eval_every": 0, "optim.lr": 1e-3}), workdir,
                      allow_config_change=True)
    assert json.load(open(os.path.join(workdir, "config.step4.json")))["optim"]["lr"] != 1e-3
    assert json.load(open(os.path.join(workdir, "config.json")))["optim"]["lr"] == 1e-3


@pytest.mark.parametrize("sharing,names", [("shared", ["policy"]), ("per_role", ["policy_planner", "policy_executor"]),
                                           ("lora", ["lora_planner", "lora_executor"])])
def test_policy_names_are_those_of_checkpoints_written_before(sharing, names):
    """Checkpoints name each policy's state; these names must not change between versions."""
    from atgrpo_jax.train.setup import build_run
    from atgrpo_jax.train.step import policy_states

    c = tiny()
    c.policy.sharing = sharing
    assert list(policy_states(build_run(resolve(c)))) == names


def test_episode_logs_show_what_each_agent_said_and_earned(tmp_path):
    from atgrpo_jax.train import loop

    workdir = tmp_path / "run"
    loop.run_training(tiny(**{"train.steps": 2, "train.eval_every": 0, "train.log_episodes_every": 2,
                              "train.log_episodes_tasks": 2}), str(workdir))
    records = [json.loads(line) for line in (workdir / "episodes.jsonl").read_text().splitlines()]
    assert [(r["step"], r["task"]) for r in records] == [(2, 0), (2, 1)]
    for record in records:
        assert [t["agent"] for t in record["log"]][:2] == ["planner", "executor"]
        for turn in record["log"]:
            branches = turn["branches"]
            reward = np.array([b["reward"] for b in branches])
            assert len(branches) == 2 and turn["selected"] == int(np.argmax(reward))  # the branch that continued
            np.testing.assert_allclose(reward, [b["local"] + b["team"] for b in branches], rtol=1e-6)  # alpha 1
            centered = reward - reward.mean()  # GRPO with 2 samples: +-1/sqrt(2) or 0
            want = centered / (reward.std(ddof=1) + 1e-6) if reward.std() > 0 else centered
            np.testing.assert_allclose([b["advantage"] for b in branches], want, rtol=1e-4, atol=1e-5)
            assert turn["prompt"].startswith("<|im_start|>user\n") and all(b["parsed_as"] for b in branches)
    from tensorboard.backend.event_processing import event_accumulator as ea  # the Text tab: the first record
    acc = ea.EventAccumulator(str(workdir / "tb"), size_guidance={ea.TENSORS: 0})
    acc.Reload()
    (event,) = acc.Tensors("episodes")
    assert event.step == 2 and b"**task 0**" in event.tensor_proto.string_val[0]


def test_dynamic_sampling_refills_groups_without_variance(tmp_path):
    """algo.dynamic_sampling: a step rolls out more tasks until each policy has as many groups with reward
    variance as its first rollout had groups (or the extra rollouts run out), and trains on those alone."""
    from atgrpo_jax.train import loop

    workdir = tmp_path / "run"
    loop.run_training(tiny(**{"train.steps": 2, "train.eval_every": 0, "algo.dynamic_sampling": 3,
                              "algo.drop_low_mean_frac": 0.0, "train.checkpoint_every": 0}), str(workdir))
    rows = read_metrics(str(workdir / "metrics.jsonl"))
    for m in rows:
        rounds, want, found = m["sampling_rounds"], m["groups_wanted"], m["groups_informative"]
        assert 1 <= rounds <= 4 and want > 0
        assert found >= want or rounds == 4  # stopped when enough were found, or out of rollouts
        assert found < want or rounds == 1 or m["groups"] > want  # a refill only when the first fell short
        assert m["groups_kept"] == min(found, want)  # exactly the wanted number, all with variance
    assert any(m["sampling_rounds"] > 1 for m in rows), "the tiny model never left a group without variance"
