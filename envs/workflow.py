"""The contract between a workflow and the rollout.

A workflow is data plus pure functions over a batch of B tasks, each with K
branches at the acting agent's turn. The rollout (atgrpo_jax.rollout) drives it:

    state = wf.reset(task_ids, split)                    # B tasks
    for turn in range(wf.max_turns):
        for agent in range(len(wf.agents)):
            msgs = wf.prompts(state, agent, turn)        # B chat message lists
            texts = sample K responses per prompt        # [B][K] strings
            out = wf.step(state, agent, turn, texts)     # K branch copies stepped
            reward = out.local_reward + alpha * out.team_reward
            best = argmax over K of reward (masked by ~state_done)
            state = take_branch(out.state, best)         # the state all K slots continue from

Branched states are pytrees whose leaves have a leading [B, K] axis: JAX or
NumPy arrays for grid games, NumPy object arrays for text (history, code,
answers). `take_branch` gathers one branch per task with one indexing op, so the
next agent always observes and steps the selected branch, never a stale copy.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

import numpy as np

Messages = list[dict[str, str]]  # [{"role": "system"|"user", "content": ...}]

# config.recipe: "paper" keeps this project's behaviour where it differs from the reference system's,
# "reference" takes the reference's (docs/paper.md, "Recipes"). A workflow's own switches are keyword
# arguments that default to None: as its `recipe` says.
RECIPES = ("paper", "reference")
# Training task ids: step s's tasks are s * TRAIN_TASK_STRIDE + [0, B) (more with dynamic sampling), so a
# workflow can tell a step's tasks apart; evaluation splits' ids index their problems from 0.
TRAIN_TASK_STRIDE = 1_000_003


def episodes_per_problem(workflow, eval_k: int) -> int:
    """Held-out episodes per problem: train.eval_k, or 1 where the workflow evaluates one sample
    (the reference's code evaluation, `one_eval_sample`)."""
    return 1 if getattr(workflow, "one_eval_sample", False) else eval_k


def as_reference(switch: bool | None, recipe: str) -> bool:
    """Whether a workflow's switch takes the reference's behaviour: its own value, or with None its recipe's."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe: unknown {recipe!r}; known: {', '.join(RECIPES)}")
    return recipe == "reference" if switch is None else bool(switch)


@dataclasses.dataclass(frozen=True)
class StepOut:
    """What stepping K branches of B tasks at one agent's turn returns."""

    state: Any  # branched state: every leaf has leading axes [B, K]
    local_reward: np.ndarray  # [B, K] float32, the acting agent's own reward
    team_reward: np.ndarray  # [B, K] float32, the shared (environment) reward
    # [B, K] object str: what the environment read from each response (the action), or why nothing
    # parsed; shown in episode logs. None: the workflow does not say.
    parsed_as: np.ndarray | None = None
    # [B, K] object: each response's reward by part ({"exact": 1.0, "short": 0.4}), for metrics (reward_fn/NAME/
    # mean, /std); None: the workflow does not say.
    reward_parts: np.ndarray | None = None
    # Whether a branch ended or succeeded is read from its state (`done(out.state)`,
    # `success(out.state)`): one place for each fact.


@dataclasses.dataclass(frozen=True)
class Agent:
    """One role: its name and the parser of its answers (never raises)."""

    name: str
    parse: Callable[[str], Any]


class Workflow(Protocol):
    name: str
    agents: tuple[Agent, ...]  # in turn order
    max_turns: int
    # The splits `reset` takes besides "train", with their number of distinct tasks (None: any
    # number, e.g. generated levels); "valid" (if present) chooses the best checkpoint.
    splits: dict[str, int | None]
    test_splits: tuple[str, ...]  # the splits reported as held-out results

    def reset(self, task_ids: Sequence[int], split: str) -> Any:
        """State of B tasks (leading axis [B]) of a split ("train" or one of `splits`)."""

    def prompts(self, state: Any, agent: int, turn: int) -> list[Messages]:
        """The B chat prompts agent `agent` sees at `turn` (history is in state)."""

    def step(self, state: Any, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        """Parse and apply responses[b][k]; every leaf of out.state has [B, K]."""

    def done(self, state: Any) -> np.ndarray:
        """[B] bool: tasks that have ended (their later groups are masked)."""

    def success(self, state: Any) -> np.ndarray:
        """[B] bool: the task's success criterion on the current state."""


def branch(state: Any, k: int) -> Any:
    """Copy a [B]-state into K branches: every leaf becomes [B, K, ...]."""
    import jax

    return jax.tree.map(lambda x: x[:, None].repeat(k, axis=1), state)


def take_branch(branched: Any, best: np.ndarray) -> Any:
    """Gather branch best[b] of every task b: leaves [B, K, ...] -> [B, ...]."""
    import jax

    rows = np.arange(len(best))
    return jax.tree.map(lambda x: x[rows, np.asarray(best)], branched)
