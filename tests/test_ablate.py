"""The paper's ablations: a regime table at equal budget, roles trained alone, policies combined or swapped."""
import json
import os
import shutil

import jax
import numpy as np
import pytest
import tiny_config

from atgrpo_jax import cli

def tiny():
    return tiny_config.tiny(**{"train.steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2,
                               "train.log_episodes_every": 0})


def leaves(policy):
    return [np.asarray(x) for x in jax.tree.leaves(policy.state.params)]


def test_regime_table_over_seeds(tmp_path):
    from atgrpo_jax.ablate import run_table
    from atgrpo_jax.train.metrics_files import read_metrics

    one_step = tiny()
    one_step.train.update(steps=1, eval_every=1, checkpoint_every=1)  # 4 runs: one step each is enough for a table
    table = run_table(one_step, ["shared", "plain_grpo"], ["0", "1"], str(tmp_path))
    for regime in ("shared", "plain_grpo"):
        finals = [read_metrics(str(tmp_path / regime / f"seed{s}"))[-1]["eval_success"] for s in (0, 1)]
        assert table[regime]["final"] == finals
        assert table[regime]["mean"] == pytest.approx(np.mean(finals))
        assert table[regime]["std"] == pytest.approx(np.std(finals, ddof=1))
        starts = [read_metrics(str(tmp_path / regime / f"seed{s}"))[0] for s in (0, 1)]  # the step-0 evaluation
        assert [r["step"] for r in starts] == [0, 0] and table[regime]["start"] == [r["eval_success"] for r in starts]
    assert table["shared"]["samples_per_step"] > table["plain_grpo"]["samples_per_step"]  # the tree samples more
    text = (tmp_path / "table.md").read_text()
    assert "| shared |" in text and "| plain_grpo |" in text and (tmp_path / "curves.png").stat().st_size > 1000
    assert json.loads((tmp_path / "table.json").read_text()) == table
    before = os.path.getmtime(tmp_path / "shared" / "seed0" / "metrics.jsonl")
    run_table(one_step, ["shared"], ["0"], str(tmp_path))  # complete runs are not trained again
    assert os.path.getmtime(tmp_path / "shared" / "seed0" / "metrics.jsonl") == before
    one_step.train.eval_first = False  # arms that start alike: no step-0 evaluation of each
    table = run_table(one_step, ["shared"], ["0"], str(tmp_path / "no_start"))
    assert [r["step"] for r in read_metrics(str(tmp_path / "no_start" / "shared" / "seed0"))] == [1]
    assert table["shared"]["start"] == [None] and "| - |" in (tmp_path / "no_start" / "table.md").read_text()


def test_the_arms_may_be_the_values_of_any_key(tmp_path):
    from atgrpo_jax.ablate import markdown, run_configs

    runs = run_configs(tiny(), ["grpo", "rloo"], ["0", "1"], str(tmp_path), key="algo.advantage")
    assert {(arm, seed): (c.algo.advantage, c.train.seed, w) for (arm, seed), (c, w) in runs.items()} == {
        (a, s): (a, int(s), str(tmp_path / a / f"seed{s}")) for a in ("grpo", "rloo") for s in ("0", "1")}
    assert markdown({"rloo": {"final": [0.5], "mean": 0.5, "std": 0.0, "samples_per_step": 8}}, 3,
                    "algo.advantage").startswith("| algo.advantage | held-out success after 3 steps")
    from atgrpo_jax.errors import ConfigError

    with pytest.raises(ConfigError, match=r"config.algo.advantage: unknown 'no_such'; known: grpo, drgrpo"):
        run_configs(tiny(), ["no_such"], ["0"], str(tmp_path), key="algo.advantage")


def test_a_role_trained_alone_leaves_the_other_as_it_was_and_policies_can_be_swapped(tmp_path):
    from atgrpo_jax.evaluate import load_policies_from, parse_policies
    from atgrpo_jax.train.loop import run_training
    from atgrpo_jax.train.setup import build_run
    from atgrpo_jax.train.validate import resolve

    c = tiny()
    c.policy.sharing, c.policy.frozen_agents = "per_role", ("planner",)
    start = build_run(resolve(c.copy_and_resolve_references()))
    run_training(c, str(tmp_path / "executor_alone"))
    from atgrpo_jax.train.metrics_files import read_metrics
    trained_rows = [r for r in read_metrics(str(tmp_path / "executor_alone")) if "policy_executor/samples" in r]
    assert trained_rows and all(r["samples"] == r["policy_executor/samples"] > 0 for r in trained_rows)  # the table's
    trained = build_run(resolve(_per_role()))
    load_policies_from(trained, parse_policies([f"planner={tmp_path / 'executor_alone'}",
                                                f"executor={tmp_path / 'executor_alone'}"]))
    planner, executor = trained.policies
    assert all(np.array_equal(a, b) for a, b in zip(leaves(planner), leaves(start.policies[0])))  # frozen
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(executor), leaves(start.policies[1])))
    swapped = build_run(resolve(_per_role()))  # the paper's swap: each agent played by the other's policy
    load_policies_from(swapped, parse_policies([f"planner={tmp_path / 'executor_alone'}:policy_executor",
                                                f"executor={tmp_path / 'executor_alone'}:policy_planner"]))
    assert all(np.array_equal(a, b) for a, b in zip(leaves(swapped.policies[0]), leaves(executor)))
    assert all(np.array_equal(a, b) for a, b in zip(leaves(swapped.policies[1]), leaves(planner)))
    with pytest.raises(Exception, match="is not AGENT=WORKDIR"):
        parse_policies(["planner"])
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "executor_alone", damaged)
    steps = sorted(int(d) for d in os.listdir(damaged / "checkpoints") if d.isdigit())
    files = [os.path.join(root, f) for root, _, names in os.walk(damaged / "checkpoints" / str(steps[-1]) / "state")
             for f in names]
    biggest = max(files, key=os.path.getsize)
    with open(biggest, "r+b") as f:  # a data file cut short
        f.truncate(os.path.getsize(biggest) // 2)
    with pytest.raises(cli.UsageError, match=rf"^--policies: {damaged}: its latest checkpoint does not restore as "
                                             r"'planner''s policy \(.+\)$"):
        load_policies_from(swapped, parse_policies([f"planner={damaged}"]))


def _per_role():
    c = tiny()
    c.policy.sharing = "per_role"
    return c


@pytest.mark.full  # tiers.py: ~50 s of training; the default suite covers the single-agent kinds
# (tests/envs/test_grid_workflows.py) and loading policies by the names a run saved (above)
def test_a_role_trained_in_its_single_agent_environment_then_combined(tmp_path, role="planner"):
    """The paper's "trained alone": the planner trains in its own one-agent environment (its proposals
    step the game), then plays beside the other role in the two-agent workflow (evaluate --policies)."""
    from atgrpo_jax.evaluate import load_policies_from, parse_policies
    from atgrpo_jax import workdir as wd
    from atgrpo_jax.train.checkpoint import Checkpointer
    from atgrpo_jax.train.loop import run_training
    from atgrpo_jax.train.setup import build_run
    from atgrpo_jax.train.step import policy_states
    from atgrpo_jax.train.validate import resolve

    alone = tiny()
    alone.env.single_agent, alone.env.kwargs.alone = True, role
    run_training(alone, str(tmp_path / "planner_alone"))
    solo = build_run(resolve(alone.copy_and_resolve_references()))
    assert [a.name for a in solo.workflow.agents] == ["planner_alone"]
    saved, _ = Checkpointer(wd.checkpoint_dir(str(tmp_path / "planner_alone")), keep_last=0,
                            read_only=True).restore(None, target=policy_states(solo))
    start, combined = build_run(resolve(_per_role())), build_run(resolve(_per_role()))
    load_policies_from(combined, parse_policies([f"planner={tmp_path / 'planner_alone'}:policy"]))
    trained = [np.asarray(x) for x in jax.tree.leaves(saved["policy"].params)]
    assert all(np.array_equal(a, b) for a, b in zip(leaves(combined.policies[0]), trained))
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(combined.policies[0]), leaves(start.policies[0])))
    assert all(np.array_equal(a, b) for a, b in zip(leaves(combined.policies[1]), leaves(start.policies[1])))
    with pytest.raises(Exception, match="no policy 'policy_x'"):
        load_policies_from(combined, parse_policies([f"planner={tmp_path / 'planner_alone'}:policy_x"]))
