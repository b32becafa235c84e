"""A multi-agent task written for one episode on one branch; the package runs it over B tasks x K branches.

Write a class with these members (duck typed; `Episode` below spells them out):

    roles = ("proposer", "critic")      # turn order
    max_turns = 2
    splits = {"test": 20}              # held-out splits and their number of tasks (None: any number)
    def reset(self, task: int, split: str) -> state
    def prompt(self, role: str, turn: int, state) -> [{"role": "user", "content": "..."}, ...]
    def step(self, role: str, turn: int, state, text: str) -> (state, local_reward, team_reward, done)
    def success(self, state) -> bool     # optional: default, the episode ended with a team reward > 0

`step` gets a copy of the state (each branch its own), so it may change it and return it. The rollout
asks every role in turn, K answers per prompt, steps each answer on its own branch, keeps the best
branch for the next role (tree sampling: train/rollout) and groups the K samples by (task, role, turn).
The batched `Workflow` protocol (workflow.py) stays the fast path for array-based games.
"""
from __future__ import annotations

import copy
from typing import Any, Protocol, Sequence

import numpy as np

from atgrpo_jax.envs.text_state import obj_array, response_grid
from atgrpo_jax.envs.workflow import Agent, Messages, StepOut


class Episode(Protocol):
    roles: tuple[str, ...]
    max_turns: int
    splits: dict[str, int | None]

    def reset(self, task: int, split: str) -> Any: ...

    def prompt(self, role: str, turn: int, state: Any) -> Messages: ...

    def step(self, role: str, turn: int, state: Any, text: str) -> tuple[Any, float, float, bool]: ...


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


class EpisodeWorkflow:
    """The batched Workflow over an Episode: states as object arrays, [B] or [B, K]."""

    def __init__(self, episode: Episode):
        for member in ("roles", "max_turns", "reset", "prompt", "step"):
            if not hasattr(episode, member):
                raise ValueError(f"env.workflow: {type(episode).__name__} has no {member!r}: an episode needs "
                                 "roles, max_turns, reset, prompt and step (atgrpo_jax/envs/episode.py)")
        self.episode = episode
        self.name = getattr(episode, "name", type(episode).__name__)
        self.agents = tuple(Agent(role, _first_line) for role in episode.roles)
        self.max_turns = int(episode.max_turns)
        self.splits = dict(getattr(episode, "splits", {"test": None}))
        self.test_splits = tuple(getattr(episode, "test_splits", [s for s in self.splits if s != "valid"]))

    def reset(self, task_ids: Sequence[int], split: str) -> dict:
        states = [self.episode.reset(int(t), split) for t in task_ids]
        n = len(states)
        return {"state": obj_array(states), "done": np.zeros(n, bool), "success": np.zeros(n, bool),
                "team": np.zeros(n, np.float32)}

    def prompts(self, state, agent: int, turn: int) -> list[Messages]:
        role = self.agents[agent].name
        return [self.episode.prompt(role, turn, s) for s in state["state"]]

    def step(self, state, agent: int, turn: int, responses: Sequence[Sequence[str]]) -> StepOut:
        grid = response_grid(responses, len(state["done"]))
        b, k = len(grid), len(grid[0])
        role = self.agents[agent].name
        out = {"state": np.empty((b, k), object), "done": np.zeros((b, k), bool), "success": np.zeros((b, k), bool),
               "team": np.zeros((b, k), np.float32)}
        local, team = np.zeros((b, k), np.float32), np.zeros((b, k), np.float32)
        for i in range(b):
            for j in range(k):
                if state["done"][i]:  # a finished task stays as it is
                    out["state"][i, j], out["done"][i, j] = state["state"][i], True
                    out["success"][i, j], out["team"][i, j] = state["success"][i], state["team"][i]
                    continue
                new, local[i, j], team[i, j], done = self.episode.step(role, turn, copy.deepcopy(state["state"][i]),
                                                                       grid[i][j])
                last = agent == len(self.agents) - 1 and turn + 1 >= self.max_turns
                out["state"][i, j], out["done"][i, j], out["team"][i, j] = new, bool(done) or last, team[i, j]
                out["success"][i, j] = self._success(new, team[i, j])
        return StepOut(out, local, team, parsed_as=obj_array([_first_line(t) for row in grid for t in row]).reshape(b, k))

    def _success(self, state, team: float) -> bool:
        judge = getattr(self.episode, "success", None)
        return bool(judge(state)) if judge is not None else team > 0

    def done(self, state) -> np.ndarray:
        return np.asarray(state["done"], bool)

    def success(self, state) -> np.ndarray:
        return np.asarray(state["success"], bool)


def as_workflow(obj):
    """An object handed to the Python API as a workflow: a batched Workflow as it is, an Episode wrapped."""
    if all(hasattr(obj, m) for m in ("agents", "prompts", "done")):
        return obj
    return EpisodeWorkflow(obj)
