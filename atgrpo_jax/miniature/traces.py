"""Supervised data for a grid game's paper workflow: a solver's play, noised, as chat rows.

The workflow itself is driven, one episode per task, with scripted replies, so every prompt is exactly
what the workflow shows its agents in a run (its recipe, its turn structure, its history). At each
agent's turn the solver (envs/solvers.py: BFS for Plan-Path and Sokoban) gives the shortest move list
from the current state; the tool agent's reply is a program that prints it, the plan agent's (and the
single agent's) ends with it on a `####` line. With probability `noise` a reply's list is replaced by
random moves (1 to 4), so the warm start imitates a weak player and the environment's later states
(after a bad move) appear in the data too.
"""
from __future__ import annotations

import json
from collections.abc import Iterator

import jax
import numpy as np

from atgrpo_jax.envs import solvers
from atgrpo_jax.envs.workflow import take_branch

LETTERS = "UDLR"  # move codes 0..3, as the games and solvers number them


def solver_moves(game: str, env) -> list[int]:
    """The shortest move list from one task's current state (leaves unbatched); [] if it has none."""
    if game == "plan_path":
        moves = solvers.plan_path_shortest(np.asarray(env.walls), np.asarray(env.pos), np.asarray(env.goal))
    elif game == "sokoban":
        moves = solvers.sokoban_solve(np.asarray(env.walls), np.asarray(env.goals), np.asarray(env.boxes),
                                      np.asarray(env.player), max_states=200_000)
    else:
        raise ValueError(f"no solver traces for {game!r} (plan_path, sokoban)")
    return list(moves or [])


def move_list(moves: list[int]) -> str:
    return "[" + ", ".join(f'"{LETTERS[m]}"' for m in moves) + "]"


def reply(answer: str, moves: list[int]) -> str:
    """A role's reply carrying `moves`: a program for the tool agent, a `####` line for the others."""
    if answer == "code":
        return f"```python\nprint('**Actions List**: {move_list(moves)}')\n```"
    return f"#### {move_list(moves)}"


def noised(moves: list[int], noise: float, rng: np.random.Generator) -> list[int]:
    if rng.random() >= noise:
        return moves
    return [int(m) for m in rng.integers(0, 4, size=int(rng.integers(1, 5)))]


def episodes(workflow, game: str, task_ids, noise: float, seed: int) -> Iterator[dict]:
    """Chat rows ({"messages": [...]}) of one scripted episode per task id (train split)."""
    rng = np.random.default_rng(seed)
    state = workflow.reset(list(task_ids), "train")
    for turn in range(workflow.max_turns):
        for agent, role in enumerate(workflow.roles):
            active = ~workflow.done(state)
            if not active.any():
                return
            prompts = workflow.prompts(state, agent, turn)
            envs = jax.device_get(state.env)
            replies = []
            for b, messages in enumerate(prompts):
                moves = noised(solver_moves(game, jax.tree.map(lambda x, b=b: x[b], envs)), noise, rng)
                text = reply(role.answer, moves)
                replies.append([text])
                if active[b]:
                    yield {"messages": list(messages) + [{"role": "assistant", "content": text}]}
            out = workflow.step(state, agent, turn, replies)
            state = take_branch(out.state, np.zeros(len(prompts), np.int32))


def write_jsonl(rows, path: str) -> int:
    n = 0
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            n += 1
    return n
