"""The config's `algo` section (atgrpo_jax/typed_config.py): rewards, advantages and group filters."""
from __future__ import annotations

import dataclasses

from atgrpo_jax.algo.advantages import estimator_names
from atgrpo_jax.registry import closest
from atgrpo_jax.typed_config import Section, key, non_negative, within

FILTER_SCOPES = ("policy", "agent", "batch")


def team_weights(weighting: str, max_turns: int, discount: float = 0.99) -> tuple[float, ...]:
    """Per turn, what the team reward is multiplied by (algo.team_weighting); () = 1 at every turn."""
    if weighting == "turn_weighted":
        return tuple((t + 1) / max_turns for t in range(max_turns))
    if weighting == "discount":
        return tuple(discount ** (max_turns - t) for t in range(max_turns))
    return ()


@dataclasses.dataclass(frozen=True)
class AlgoSettings(Section):
    PATH = "algo"

    alpha: float = key(1.0, "an agent's reward = its own + alpha * the team's")
    team_weighting: str = key("none", 'the team reward of turn t (0-based) of max_turns T, weighted as the '
                              'reference\'s reward options: "turn_weighted" x (t + 1) / T (later turns, closer to '
                              'the outcome, count more), "discount" x team_discount^(T - t), "none" x 1',
                              choices=("none", "turn_weighted", "discount"))
    team_discount: float = key(0.99, 'the discount factor of team_weighting="discount"', check=within(0, 1))
    advantage: str = key("grpo", "advantage estimator (docs/guides/estimators.md): per group grpo, drgrpo, rloo, "
                         "magrpo, counterfactual (CCPO's credit; needs rollout.tree); over each policy's batch of "
                         "the step reinforce_pp, dr_mas",
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

    def estimator_of(self, role: str) -> str:
        """The estimator of agent `role`: algo.role_advantage's, else algo.advantage."""
        return self.role_advantage.get(role, self.advantage)

    def counterfactual_for(self, roles) -> bool:
        """Whether any of `roles` uses the counterfactual estimator (its rollout then replays each turn)."""
        return any(self.estimator_of(r) == "counterfactual" for r in roles)

    def check(self):
        for name, estimator in self.role_advantage.items():
            self.require(estimator in estimator_names(), f"role_advantage.{name}",
                         f"unknown {estimator!r}{closest(str(estimator), estimator_names())}; known: "
                         f"{', '.join(estimator_names())}")
