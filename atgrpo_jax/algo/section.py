"""The config's `algo` section (atgrpo_jax/typed_config.py): rewards, advantages and group filters."""
from __future__ import annotations

import dataclasses

from atgrpo_jax.algo.advantages import estimator_names
from atgrpo_jax.registry import closest
from atgrpo_jax.typed_config import Section, key, non_negative, within

FILTER_SCOPES = ("policy", "agent", "batch")


@dataclasses.dataclass(frozen=True)
class AlgoSettings(Section):
    PATH = "algo"

    alpha: float = key(1.0, "an agent's reward = its own + alpha * the team's")
    advantage: str = key("grpo", "advantage estimator (docs/guides/estimators.md): per group grpo, drgrpo, rloo, "
                         "magrpo; over each policy's batch of the step reinforce_pp, dr_mas",
                         choices=estimator_names)
    role_advantage: dict = key({}, "per agent, another estimator than algo.advantage (any of its names), e.g. "
                               "--config.algo.role_advantage.coder=drgrpo (rLLM's per-trajectory-group map); unset "
                               "agents: algo.advantage")
    drop_low_mean_frac: float = key(0.5, "drop this fraction of the groups with the lowest mean reward",
                                    check=within(0, 1, high_open=True))
    drop_zero_variance: bool = key(False, "drop groups whose K rewards are all equal")
    filter_plain: bool = key(False, "apply the two filters above without tree sampling too (rollout.tree=False); "
                             "the reference filters only tree-sampled groups")
    filter_scope: str = key("policy", 'the low-mean filter ranks groups within each "policy" (as each model\'s '
                            'batch is filtered on its own), each "agent", or the whole "batch"', choices=FILTER_SCOPES)
    overlong_buffer: int = key(0, "DAPO's soft overlong punishment: a response within this many tokens of its "
                               "max_new_tokens loses up to algo.overlong_penalty of reward, linearly, all of it at the "
                               "budget; 0: off", check=non_negative)
    overlong_penalty: float = key(1.0, "the most the soft overlong punishment takes (>= 0)", check=non_negative)
    drop_overlong: bool = key(False, "DAPO's overlong filtering: a response that used its whole budget (cut, most "
                              "likely) is not trained on; its group's advantages are computed with it")
    dynamic_sampling: int = key(0, "DAPO's dynamic sampling: while a policy has fewer groups with reward variance "
                                "than its first rollout had groups, roll out rollout.num_tasks more tasks, at most "
                                "this many times; 0: off", check=non_negative)

    def check(self):
        for name, estimator in self.role_advantage.items():
            self.require(estimator in estimator_names(), f"role_advantage.{name}",
                         f"unknown {estimator!r}{closest(str(estimator), estimator_names())}; known: "
                         f"{', '.join(estimator_names())}")
