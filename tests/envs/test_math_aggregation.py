"""Math aggregation (envs/math_aggregation.py): three roles in one round, each rewarded for its own
answer, the team for the aggregator's; and the config trains three models on a tiny Qwen3."""
import json
import os

import numpy as np
import pytest

from atgrpo_jax.envs.workflow import take_branch
from atgrpo_jax.envs.workflow_registry import make_workflow, workflow_roles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def wf():
    return make_workflow("math_aggregation", train_set="gsm8k_train", test_sets=("gsm8k_test",), max_workers=1)


def test_two_solvers_then_an_aggregator_each_rewarded_for_its_own_answer(wf):
    assert [a.name for a in wf.agents] == list(workflow_roles("math_aggregation")) == ["reasoner", "tool", "aggregator"]
    s = wf.reset([0, 1], "train")
    truth = s["reference"].tolist()
    out = wf.step(s, 0, 0, [[f"so \\boxed{{{truth[0]}}}", "no answer"], ["\\boxed{-1}", "x"]])
    np.testing.assert_array_equal(out.local_reward, [[1, 0], [0, 0]])
    assert not out.team_reward.any() and not out.state["done"].any()  # the team's answer is the aggregator's
    s = take_branch(out.state, np.array([0, 0]))
    tool_prompt = wf.prompts(s, 1, 0)[0][-1]["content"]
    assert "boxed" not in tool_prompt and truth[0] not in tool_prompt.split("Problem:")[0]  # the tool works alone
    out = wf.step(s, 1, 0, [[f"```python\nprint({truth[0]})\n```", "```python\nprint(1/0)\n```"],
                            ["nothing", f"```python\nprint({truth[1]})\n```"]])
    np.testing.assert_array_equal(out.local_reward, [[1, -1], [-1, 1]])  # rewards.tool_error for no program
    assert not out.state["done"].any()  # the two agree on task 0: still the aggregator's turn
    s = take_branch(out.state, np.array([0, 1]))
    shown = wf.prompts(s, 2, 0)
    assert f"so \\boxed{{{truth[0]}}}" in shown[0][-1]["content"] and f"print({truth[1]})" in shown[1][-1]["content"]
    assert shown[0][0]["role"] == "system" and "judge" in shown[0][0]["content"]
    out = wf.step(s, 2, 0, [[f"\\boxed{{{truth[0]}}}", "\\boxed{0}"], ["I pick -1: \\boxed{-1}", ""]])
    np.testing.assert_array_equal(out.local_reward, [[1, 0], [0, 0]])
    np.testing.assert_array_equal(out.team_reward, out.local_reward)
    assert out.state["done"].all()
    assert wf.success(take_branch(out.state, np.array([0, 0]))).tolist() == [True, False]


def test_settings_that_would_break_the_round_are_refused():
    with pytest.raises(ValueError, match=r"one round of reasoner, tool agent, aggregator .* got max_turns=2"):
        make_workflow("math_aggregation", train_set="gsm8k_train", test_sets=("gsm8k_test",), max_turns=2)
    with pytest.raises(ValueError, match=r"no single-agent variant"):
        make_workflow("math_aggregation", single_agent=True)


def test_the_config_trains_one_model_per_role(tmp_path):
    from atgrpo_jax import cli
    from atgrpo_jax.models.tokenizer import qwen3_tokenizer
    from atgrpo_jax.train.loop import run_training
    from atgrpo_jax.train.metrics_files import read_metrics
    from hf_fixtures import make_hf_checkpoint

    ckpt = str(tmp_path / "Qwen3-tiny")
    make_hf_checkpoint(ckpt, vocab=151_669, hidden=32, inter=64, layers=1, heads=2, kv_heads=1, head_dim=16, scale=1.0)
    qwen3_tokenizer().save_pretrained(ckpt)
    small = {"model.hf_path": ckpt, "model.preset": "", "model.param_dtype": "float32",
             "model.compute_dtype": "float32", "model.remat": "False", "env.kwargs.train_set": "gsm8k_train",
             "env.kwargs.test_sets": "('gsm8k_test',)", "rollout.num_tasks": "2", "rollout.k": "2",
             "rollout.max_new_tokens": "12", "rollout.max_prompt_len": "1024", "rollout.prompt_buckets": "(1024,)",
             "train.steps": "2", "train.eval_every": "0", "train.checkpoint_every": "2",
             "train.log_episodes_every": "1", "train.log_episodes_tasks": "1", "optim.warmup_steps": "0"}
    config = cli.config_from_args(os.path.join(ROOT, "configs", "math_aggregation_qwen3_1p7b.py"), list(small.items()))
    work = str(tmp_path / "run")
    run_training(config, work)
    rows = read_metrics(work)
    assert [r["step"] for r in rows] == [1, 2]
    for role in ("reasoner", "tool", "aggregator"):
        assert np.isfinite(rows[-1][f"reward/{role}"]) and rows[-1][f"policy_{role}/skipped"] == 0
    with open(os.path.join(work, "episodes.jsonl")) as f:
        record = json.loads(f.readline())
    assert [t["agent"] for t in record["log"]] == ["reasoner", "tool", "aggregator"]
