"""Teams of more than two roles: every part that counts agents counts the workflow's roles (the trainer's
policies, adapters, pools and schedules, the planner), checked on a relay of N roles (team_workflow.py)."""
import jax
import ml_collections
import numpy as np
import pytest

from atgrpo_jax.algo.section import team_weights
from atgrpo_jax.plan.planned_model import planned_roles
from atgrpo_jax.rollout.tree import RolloutInputs, TreeRollout
from atgrpo_jax.train.setup import build_run
from atgrpo_jax.train.step import sample_fn_for, train_step
from atgrpo_jax.train.validate import resolve
from tiny_config import tiny

K = 3


def team(roles=3, **changes):
    c = tiny(**{"env.workflow": "team_workflow:make", "rollout.num_tasks": 2, "rollout.k": K,
                "rollout.max_new_tokens": 4, "optim.lr": 1e-2, "optim.schedule": "constant", "optim.warmup_steps": 0,
                "optim.mini_batch_size": 64, "lora.rank": 2, "model.init_seed": 0, **changes})
    c.env.kwargs = ml_collections.ConfigDict({"roles": roles})  # the relay's only setting
    return c


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("weighting", ["none", "turn_weighted"])
def test_three_roles_group_by_task_agent_turn_with_the_best_branch_passed_on(weighting):
    run = build_run(resolve(team(regime="shared")))
    tasks = [5, 6]
    weights = team_weights(weighting, 2)  # the reference's turn_weighted: x (t + 1) / T
    samples, episodes = TreeRollout(K).begin(RolloutInputs(run.workflow, sample_fn_for(run, 1.0, 2 * K), run.encode,
                                                           tasks, "train", max_turns=2, alpha=1.0,
                                                           key=jax.random.key(0), team_weights=weights)).run()
    got = sorted(zip(samples.task.tolist(), samples.agent.tolist(), samples.turn.tolist()))
    want = sorted((t, a, turn) for t in range(len(tasks)) for a in range(3) for turn in range(2))  # each once
    assert got == want
    assert samples.reward.shape == (12, K) and samples.mask.all()
    # each group's reward is its own reward plus alpha x the team's, recomputed from the decoded answers
    for g in range(len(got)):
        for k in range(K):
            ids = samples.response[g, k, :samples.response_len[g, k]].tolist()
            text = run.tokenizer.decode([t for t in ids if t not in run.stop_ids])  # what the step was given
            turn_weight = weights[samples.turn[g]] if weights else 1.0
            want = text.count("U") + turn_weight * float(len(text) % 2 == 0)
            assert samples.reward[g, k] == pytest.approx(want), (g, k, text)


def test_per_role_is_one_model_per_role_each_learning_from_its_own_agent():
    config = resolve(team(regime="per_role", **{"policy.phases": ("r0+r2", "r1"), "policy.phase_steps": 1}))
    run = build_run(config)
    assert [p.name for p in run.policies] == ["policy_r0", "policy_r1", "policy_r2"]
    assert list(run.policy_of_agent) == [0, 1, 2]
    assert config.role_schedule.trains(["r0", "r1", "r2"], 1) == [True, False, True]
    before = [leaves(p.state.params) for p in run.policies]
    train_step(run, 1)  # phase r0+r2: r1's model must not move
    after = [leaves(p.state.params) for p in run.policies]
    moved = [any(not np.array_equal(a, b) for a, b in zip(x, y)) for x, y in zip(before, after)]
    assert moved == [True, False, True]


def test_four_roles_on_four_pools_and_three_pools_that_do_not_divide_say_so():
    config = team(4, regime="per_role", mesh=dict(data=1, fsdp=8, tensor=1), **{"policy.pools": True})
    run = build_run(resolve(config))
    devices = [{d.id for x in jax.tree.leaves(p.state) for d in x.sharding.device_set} for p in run.policies]
    assert devices == [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    train_step(run, 1)
    with pytest.raises(ValueError, match=r"cannot split a mesh of .* into 3 equal pools"):
        build_run(resolve(team(3, regime="per_role", mesh=dict(data=1, fsdp=8, tensor=1), **{"policy.pools": True})))


def test_one_lora_adapter_per_role_for_three_roles():
    run = build_run(resolve(team(regime="lora")))
    assert [p.name for p in run.policies] == ["lora_r0", "lora_r1", "lora_r2"]
    metrics = train_step(run, 1)
    assert all(np.isfinite(metrics[f"lora_r{i}/loss"]) and metrics[f"lora_r{i}/samples"] > 0 for i in range(3))


def test_the_planner_counts_the_workflow_s_roles():
    from atgrpo_jax import cli

    assert planned_roles(resolve(team(4))) == ("r0", "r1", "r2", "r3")
    paper = cli.config_from_args("configs/math_aggregation_qwen3_1p7b.py", [("model.init", "random")])
    assert planned_roles(resolve(paper)) == ("reasoner", "tool", "aggregator")  # no data needed to count


def test_three_roles_train_and_evaluate_from_the_command_s_loop(tmp_path):
    import json

    from atgrpo_jax.train.loop import run_training
    from atgrpo_jax.train.metrics_files import read_metrics

    work = str(tmp_path / "relay")
    run_training(team(regime="per_role", **{"train.steps": 2, "train.eval_every": 2, "train.eval_tasks": 4,
                                            "train.log_episodes_every": 1}), work)
    rows = read_metrics(work)
    assert {f"reward/r{i}" for i in range(3)} | {f"policy_r{i}/loss" for i in range(3)} <= set(rows[-1])
    assert 0 <= rows[-1]["eval_success"] <= 1
    with open(f"{work}/episodes.jsonl") as f:
        log = json.loads(f.readline())["log"]
    assert [t["agent"] for t in log] == ["r0", "r1", "r2", "r0", "r1", "r2"]  # two turns of three roles


def test_team_weightings_are_the_reference_s_formulas():
    assert team_weights("none", 4) == ()
    assert team_weights("turn_weighted", 4) == (0.25, 0.5, 0.75, 1.0)  # (t + 1) / T
    np.testing.assert_allclose(team_weights("discount", 3, 0.9), [0.9 ** 3, 0.9 ** 2, 0.9])  # gamma^(T - t)


def test_a_workflow_of_yours_is_built_once_per_config_to_count_its_roles(monkeypatch):
    """The planner, the programs and the step-time model all ask for the roles: a workflow that is not
    built in is built once per resolved config (Config.roles), not once per question."""
    import team_workflow
    from atgrpo_jax.plan.devices import TPUS
    from atgrpo_jax.plan.memory import plan

    built = []
    monkeypatch.setattr(team_workflow, "make", lambda *a, **k: built.append(1) or team_workflow.EpisodeWorkflow(
        team_workflow.Relay(3)))
    config = resolve(team(**{"policy.sharing": "per_role"}), weights=False)
    before = len(built)  # (resolve may build it to check the config)
    assert planned_roles(config) == ("r0", "r1", "r2") and planned_roles(config) == config.roles
    plan(config, TPUS["v5p"], 4)
    assert len(built) - before <= 1
