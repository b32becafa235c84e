"""env.workflow = "mixture": several workflows in one run, each task drawn for one of them by its id."""
import os

import numpy as np
import pytest

from atgrpo_jax.envs.code_workflow import CodeWorkflow
from atgrpo_jax.envs.math_workflow import MathWorkflow
from atgrpo_jax.envs.mixture import MixtureWorkflow
from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.envs.sandbox import Limits
from atgrpo_jax.envs.workflow import take_branch

FAST = Limits(wall_s=2.0, cpu_s=2.0, memory_mb=512)
DIGITS = os.path.join(os.path.dirname(__file__), "..", "..", "envs", "data", "sum_digits", "")


@pytest.fixture(scope="module")
def mixture():
    return MixtureWorkflow({"math": MathWorkflow(test_sets=("aime24",), limits=FAST, max_workers=2),
                            "code": CodeWorkflow(train_sets=("mbpp_train",), test_sets=("humaneval",), limits=FAST,
                                                 max_workers=2)}, {"math": 3.0, "code": 1.0})


def test_tasks_are_drawn_by_the_weights_and_stay_what_they_were(mixture):
    ids = np.arange(1000, 1400)
    kinds = mixture.kinds(ids, "train")
    assert 0.68 < (kinds == 0).mean() < 0.82  # math drawn 3 times in 4
    np.testing.assert_array_equal(mixture.kinds(ids[::-1], "train"), kinds[::-1])  # a function of the id
    assert [a.name for a in mixture.agents] == ["reasoner_coder", "tool_tester"]
    assert mixture.test_splits == ("math/aime24", "code/humaneval")
    assert mixture.splits["valid"] == sum(w.splits["valid"] for w in mixture.parts.values())


def test_each_task_is_prompted_stepped_and_judged_by_its_own_workflow(mixture):
    ids = np.arange(2000, 2012)
    kinds = mixture.kinds(ids, "train")
    assert 0 < kinds.sum() < len(ids)  # both kinds among the 12
    state = mixture.reset(ids, "train")
    prompts = mixture.prompts(state, 0, 0)
    for kind, p in zip(kinds, prompts):
        assert ("mathematician" if kind == 0 else "programmer") in p[0]["content"]
    replies = [["\\boxed{42}", "```python\nprint(1)\n```"]] * len(ids)
    out = mixture.step(state, 0, 0, replies)
    assert out.local_reward.shape == (len(ids), 2) and out.parsed_as.shape == (len(ids), 2)
    assert mixture.done(out.state).shape == (len(ids), 2)
    after = take_branch(out.state, kinds)  # math tasks keep branch 0 (the answer), code tasks 1 (the program)
    coded, solved = np.flatnonzero(kinds == 1), np.flatnonzero(kinds == 0)
    assert all(after["code"]["code"][b] == "print(1)" for b in coded)  # the coder's program, in its state
    assert all(after["math"]["reasoner_answer"][b] == "42" for b in solved)
    assert mixture.success(after).shape == (len(ids),)


def test_a_mixture_of_unequal_teams_or_without_weights_is_refused():
    with pytest.raises(ValueError, match="matched by position, so their numbers must agree"):
        make_workflow("mixture", weights={"math": 1, "prompt_reward": 1}, math={"test_sets": ("aime24",)},
                      prompt_reward={"train_path": DIGITS + "train.jsonl", "test_path": DIGITS + "test.jsonl",
                                     "reward_fn": "atgrpo_jax.configs.sum_digits:reward"})
    with pytest.raises(ValueError, match="env.kwargs.weights: a mixture names its workflows"):
        make_workflow("mixture")
    with pytest.raises(ValueError, match=r"\['cod'\] are not workflows of the mixture"):
        make_workflow("mixture", weights={"math": 1, "code": 1}, cod={})


@pytest.mark.full  # tiers.py: ~15 s of training; the protocol tests above cover how a mixture steps and judges
def test_a_mixture_trains_and_reports_each_workflow(tmp_path):
    """Two grid workflows in one tiny run: training success per workflow, evaluation per workflow's split."""
    import ml_collections
    from tiny_config import tiny

    from atgrpo_jax.train import loop
    from atgrpo_jax.train.metrics_files import read_metrics

    c = tiny(**{"train.steps": 1, "train.eval_every": 1, "train.eval_tasks": 2, "rollout.num_tasks": 6})
    grid = dict(c.env.kwargs)
    c.env.workflow = "mixture"
    c.env.kwargs = ml_collections.ConfigDict({"weights": {"plan_path_demo": 1.0, "plan_path_direct": 1.0},
                                              "plan_path_demo": grid, "plan_path_direct": grid})
    loop.run_training(c, str(tmp_path / "run"))
    last = read_metrics(str(tmp_path / "run" / "metrics.jsonl"))[-1]
    assert {"success/plan_path_demo", "success/plan_path_direct"} <= set(last)
    assert {"eval/plan_path_demo/test/avg@1", "eval/plan_path_direct/test/avg@1", "valid_success"} <= set(last)
