"""Role schedules (policy.phases) and per-role optimizer settings (policy.role_optim)."""
import ml_collections
import pytest
from tiny_config import tiny

from atgrpo_jax.train.config import ConfigError, base_config
from atgrpo_jax.train.metrics_files import read_metrics
from atgrpo_jax.train.validate import resolve


def untimed(row: dict) -> dict:
    """A metrics row without its timings (seconds, rates, busy fractions)."""
    return {k: v for k, v in row.items() if not (k.endswith("_s") or "busy" in k)}


def test_phases_take_turns_and_frozen_agents_stay_frozen():
    schedule = resolve(base_config(), weights=False).role_schedule
    assert schedule.phase(1) is None and schedule.trains(["a", "b"], 7) == [True, True]
    c = base_config()
    c.policy.update(phases=("a", "a+b", "b"), phase_steps=2, frozen_agents=("b",))
    schedule = resolve(c, weights=False).role_schedule
    assert [schedule.phase(s) for s in (1, 2, 3, 4, 5, 6, 7)] == \
        [("a",), ("a",), ("a", "b"), ("a", "b"), ("b",), ("b",), ("a",)]
    assert [schedule.trains(["a", "b"], s) for s in (1, 3, 5)] == [[True, False], [True, False], [False, False]]


def with_roles(**changes):
    c = tiny(**{"policy.sharing": "per_role", "policy.phases": ("planner", "executor"), "policy.phase_steps": 1,
                "optim.schedule": "constant", "optim.warmup_steps": 0, "train.eval_every": 0, **changes})
    with c.unlocked():
        c.policy.role_optim = ml_collections.ConfigDict({"planner": {"lr": 3e-6}})
    return c


@pytest.mark.parametrize("key,value,pattern", [
    ("policy.phases", ("planner", "critic"), r"policy.phases\[1\]: \['critic'\] are not agents"),
    ("policy.sharing", "shared", "policy.role_optim: policy.sharing='shared' trains one policy"),
    ("policy.phase_steps", 0, "policy.phase_steps: must be > 0, got 0"),
])
def test_role_settings_errors_name_the_key(tmp_path, key, value, pattern):
    from atgrpo_jax.train import loop

    with pytest.raises(ConfigError, match=pattern):
        loop.run_training(with_roles(**{key: value}), str(tmp_path / "run"))


def test_role_optim_keys_are_checked_like_optims():
    c = with_roles()
    with c.unlocked():
        c.policy.role_optim.planner.b2 = 1.0
    with pytest.raises(ConfigError, match=r"policy.role_optim.planner.b2: must be in \[0, 1\)"):
        resolve(c)
    with c.unlocked():
        c.policy.role_optim.planner = ml_collections.ConfigDict({"epochs": 2})
    with pytest.raises(ConfigError, match=r"policy.role_optim.planner: \['epochs'\] cannot differ per role"):
        resolve(c)


@pytest.mark.full  # tiers.py: ~12 s; the role schedule above and the role-model run below cover the
# schedule and resume
def test_roles_take_turns_at_their_own_rates_and_resume_exactly_across_a_phase(tmp_path):
    """Per-role policies trained in alternating phases of one step, the planner at its own lr; a run stopped
    after step 1 and resumed equals the uninterrupted one across the phase boundary."""
    from atgrpo_jax.train import loop

    loop.run_training(with_roles(**{"train.steps": 3}), str(tmp_path / "full"))
    rows = read_metrics(str(tmp_path / "full" / "metrics.jsonl"))
    trained = [sorted(k.split("/")[0] for k in row if k.endswith("/updates")) for row in rows]
    assert trained == [["policy_planner"], ["policy_executor"], ["policy_planner"]]
    lr = with_roles().optim.lr
    assert all(row["policy_planner/lr"] == pytest.approx(3e-6) and row["policy_executor/lr"] == pytest.approx(lr)
               for row in rows)

    loop.run_training(with_roles(**{"train.steps": 1}), str(tmp_path / "resumed"))
    loop.run_training(with_roles(**{"train.steps": 3}), str(tmp_path / "resumed"))
    resumed = read_metrics(str(tmp_path / "resumed" / "metrics.jsonl"))
    assert [untimed(r) for r in resumed] == [untimed(r) for r in rows]


def unequal(**changes):
    """Per-role policies of two widths: the planner demo-tiny (128 wide), the executor test-tiny (64)."""
    c = tiny(**{"policy.sharing": "per_role", "train.eval_every": 0, "optim.schedule": "constant",
                "optim.warmup_steps": 0, **changes})
    with c.unlocked():
        c.policy.role_models = ml_collections.ConfigDict({"executor": {"preset": "test-tiny",
                                                                       "vocab_size": c.model.vocab_size}})
    return c


def test_a_model_per_role_trains_resumes_and_exports_each_at_its_size(tmp_path):
    import json

    from atgrpo_jax import export
    from atgrpo_jax.train import loop

    loop.run_training(unequal(**{"train.steps": 2}), str(tmp_path / "full"))
    loop.run_training(unequal(**{"train.steps": 1}), str(tmp_path / "resumed"))
    loop.run_training(unequal(**{"train.steps": 2}), str(tmp_path / "resumed"))
    rows = read_metrics(str(tmp_path / "full" / "metrics.jsonl"))
    assert all(row["policy_planner/updates"] > 0 and row["policy_executor/updates"] > 0 for row in rows)
    resumed = read_metrics(str(tmp_path / "resumed" / "metrics.jsonl"))
    assert [untimed(r) for r in resumed] == [untimed(r) for r in rows]
    widths = {}
    for policy in ("policy_planner", "policy_executor"):
        out = tmp_path / policy
        export.export_policy(str(tmp_path / "full"), str(out), policy=policy)
        widths[policy] = json.loads((out / "config.json").read_text())["hidden_size"]
    assert widths == {"policy_planner": 128, "policy_executor": 64}


def test_role_models_are_checked_and_planned_as_the_largest():
    from atgrpo_jax.plan.devices import TPUS
    from atgrpo_jax.plan.planned_model import model_config
    from atgrpo_jax.plan.memory import plan

    c = unequal()
    with c.unlocked():
        c.policy.role_models.executor.preset = "bench-small"  # 7.3M parameters: the larger
    r = resolve(c)
    size = max(model_config(r.role(role)).num_params() for role in (None, "executor"))
    assert size == model_config(r.role("executor")).num_params() > model_config(r).num_params()
    assert f"largest ({size:,} parameters)" in " ".join(plan(r, TPUS["v5p"], 1).notes)
    with c.unlocked():
        c.policy.role_models.executor = ml_collections.ConfigDict({"attention": "xla"})
    with pytest.raises(ConfigError, match=r"policy.role_models.executor: \['attention'\] cannot differ per role"):
        resolve(c)
    c = unequal(**{"policy.sharing": "lora"})
    with pytest.raises(ConfigError, match="policy.role_models: gives a role a model of its own"):
        resolve(c)


def test_the_modelled_step_costs_each_role_at_its_own_size():
    import copy

    from atgrpo_jax.plan import costing
    from atgrpo_jax.plan.compile_cli import model_step
    from atgrpo_jax.plan.targets import parse_target
    from atgrpo_jax.train.paper import paper_config

    mixed = paper_config("plan_path", "qwen3-1.7b")
    mixed.policy.sharing = "per_role"
    mixed.policy.role_models = ml_collections.ConfigDict({"tool": {"preset": "qwen3-0.6b", "init": "random"}})
    mixed.model.init = "random"
    both_large = copy.deepcopy(mixed)
    both_large.policy.role_models = ml_collections.ConfigDict()
    times = [model_step(c, parse_target("v5p-8"), costing.Assumptions.of(c))["total"]
             for c in (resolve(mixed, weights=False), resolve(both_large, weights=False))]
    assert 0.5 * times[1] < times[0] < times[1]  # the 0.6B tool agent costs less than a 1.7B one
