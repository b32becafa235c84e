"""Math aggregation: three roles in one turn. A reasoner solves the problem step by step, a tool agent
writes a Python program that computes the answer (run in the sandbox), each without seeing the other; an
aggregator then reads both solutions and gives the team's answer (as the reference's `math_aggretion` task,
docs/guides/teams.md).

Rewards per role, each its own correctness (as the reference's): the reasoner `rewards.reasoner_correct`
for a right \\boxed{} answer, the tool agent `rewards.tool_correct` for a program that prints it, the
aggregator `rewards.aggregator_correct` for a right final answer; the team reward is
`rewards.team_correct` when the aggregator is right, and success is the aggregator's answer. The episode
ends after the aggregator. With tree sampling the aggregator reads the best branch of each solver (the
reference shows it every sampled solution). Everything else (data sets, grading, the recipe's switches,
the sandbox) is the math workflow's (envs/math_workflow.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from atgrpo_jax.envs.math_grading import answer_anywhere
from atgrpo_jax.envs.math_workflow import MathWorkflow, typed_settings
from atgrpo_jax.envs.parsers import extract_boxed, extract_code_block
from atgrpo_jax.envs.text_state import clip_head, clip_tail, obj_array, step_frame
from atgrpo_jax.envs.workflow import Agent, Messages, StepOut

ROLES = ("reasoner", "tool", "aggregator")
# The math workflow's settings that shape rounds; the tool agent never sees the reasoner in one round.
ONE_ROUND = dict(max_turns=1, tool_first=False, simultaneous=False, full_history=False)


@dataclasses.dataclass(frozen=True)
class MathAggregation(MathWorkflow):
    max_turns: int = 1  # one round: two solutions, then their aggregation

    def __post_init__(self):
        if self.single_agent:
            raise ValueError("env.workflow=math_aggregation has no single-agent variant (the single-agent "
                             "baseline is env.workflow=math with env.single_agent=True)")
        super().__post_init__()  # (the recipe's switches resolved first)
        wrong = {k: getattr(self, k) for k, want in ONE_ROUND.items() if getattr(self, k) != want}
        if wrong:
            raise ValueError("env.kwargs: math_aggregation is one round of reasoner, tool agent, aggregator "
                             f"({', '.join(f'{k}={v}' for k, v in ONE_ROUND.items())}); got "
                             f"{', '.join(f'{k}={v}' for k, v in wrong.items())}")

    @property
    def name(self) -> str:
        return "math_aggregation"

    @property
    def agents(self) -> tuple[Agent, ...]:
        parsers = {"reasoner": extract_boxed, "tool": extract_code_block, "aggregator": extract_boxed}
        return tuple(Agent(role, parsers[role]) for role in ROLES)

    def reset(self, task_ids: Sequence[int], split: str) -> dict[str, np.ndarray]:
        state = super().reset(task_ids, split)
        n = len(state["done"])
        state["aggregator_answer"] = obj_array([""] * n)
        state["aggregator_correct"] = np.zeros(n, bool)
        return state

    def success(self, state) -> np.ndarray:
        return np.asarray(state["aggregator_correct"], bool)

    def _prompt(self, role: str, turn: int, s: dict[str, Any]) -> Messages:
        if role != "aggregator":
            return super()._prompt(role, turn, s)
        user = self.templates.render(
            "aggregate.j2", problem=s["problem"], reasoner_response=clip_tail(s["reasoner_response"],
                                                                                self.max_shown_chars),
            reasoner_answer=s["reasoner_answer"], tool_code=clip_head(s["tool_code"], self.max_shown_chars),
            tool_output=clip_head(s["tool_output"], 1000), tool_answer=s["tool_answer"])
        return self.templates.chat("aggregator", user)

    def step(self, state, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        role = self.agents[agent].name
        if role != "aggregator":
            out = super().step(state, agent, turn, responses)
            out.state["done"][...] = False  # the two solvers' agreement ends nothing: the aggregator answers
            return dataclasses.replace(out, team_reward=np.zeros_like(out.team_reward))
        grid, out, local, team, parsed_as, active = step_frame(state, responses)
        r = self.rewards
        for b, j in active:
            text = grid[b][j]
            answer = answer_anywhere(text) if self.answer_anywhere else extract_boxed(text) or ""
            correct = self._correct(text, answer, out["reference"][b, j])
            out["aggregator_answer"][b, j], out["aggregator_correct"][b, j] = answer, correct
            out["done"][b, j] = True
            local[b, j] = r.aggregator_correct * correct
            team[b, j] = r.team_correct * correct
            parsed_as[b, j] = f"answer {answer}" if answer else "unparsed: no answer found"
        return StepOut(state=out, local_reward=local, team_reward=team, parsed_as=parsed_as)


def aggregation_roles(**_) -> tuple[str, ...]:
    """The roles in turn order, known without the data (the planner counts them)."""
    return ROLES


def make_math_aggregation(single_agent: bool = False, **kwargs) -> MathAggregation:
    """Factory for configs (envs/workflow_registry.py); the math workflow's keyword arguments."""
    return MathAggregation(single_agent=single_agent, **typed_settings(kwargs))
