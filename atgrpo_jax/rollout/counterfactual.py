"""Counterfactual credit (CCPO, arXiv 2603.21563) under tree sampling, without extra samples.

CCPO credits an agent with the team's outcome minus the outcome with that agent's action replaced and
the other agents' actions kept: A_i = R(a_i, a_-i) - R(ã_i, a_-i). Under tree sampling the replacements
are at hand: agent a's K branches at a turn are K actions from one state, and each one's team outcome
with the other agents' actions kept is found by replaying the responses the turn's later agents chose
(on the selected branch) on that branch. So a sample's counterfactual reward is its own reward plus alpha
times the team reward at the end of the turn, reached from its own branch with the later agents' chosen
responses; the `counterfactual` estimator then takes each sample's reward minus the mean of its
siblings' (the replaced actions). The turn's last agent has nobody after it: its counterfactual reward
is its reward.

Cost: no extra sampling. Each later agent's step is replayed on K branches of every earlier agent of
the turn: (A - 1 - a) extra environment steps of K branches per task for agent a of A. Later turns are not
replayed (their prompts would change with the branch, so their responses would have to be sampled anew).
A branch that ended the episode keeps its own team reward; so does a task whose later agents did not act.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs.workflow import take_branch


@dataclasses.dataclass
class Replay:
    """One earlier agent's K branches of a turn, advanced by each later agent's chosen response."""

    record: int  # the index of the agent's record in its cohort
    state: Any  # [B * K] the branches, flattened
    team: np.ndarray  # [B, K] the team reward reached so far on each branch


def start(record: int, branched: Any, team: np.ndarray) -> Replay:
    """A replay of a stage's K branches (`branched`, leaves [B, K, ...]) whose own team reward is `team`."""
    flat = jax.tree.map(lambda x: x.reshape((-1,) + tuple(x.shape[2:])), branched)
    return Replay(record, flat, np.array(team, np.float32))


def advance(workflow, replay: Replay, agent: int, turn: int, chosen: list[str], acted: np.ndarray) -> None:
    """Step every branch of `replay` with `agent`'s chosen response of its task (chosen [B]); acted [B]:
    the tasks the agent acted in. A branch that is done already, or whose task the agent skipped, stays."""
    b, k = replay.team.shape
    was_done = np.asarray(workflow.done(replay.state), bool).reshape(b, k)
    step = workflow.step(replay.state, agent, turn, [[chosen[i]] for i in range(b) for _ in range(k)])
    moved = acted[:, None] & ~was_done  # [B, K]
    replay.state = where_rows(moved.ravel(), take_branch(step.state, np.zeros(b * k, np.int64)), replay.state)
    team = np.asarray(step.team_reward, np.float32).reshape(b, k)
    replay.team = np.where(moved, team, replay.team)


def where_rows(rows: np.ndarray, new: Any, old: Any) -> Any:
    """Per row (leading axis): the new state where `rows`, else the old one."""
    def pick(n, o):
        cond = rows.reshape(rows.shape + (1,) * (np.ndim(n) - 1))
        return jnp.where(cond, n, o) if isinstance(n, jax.Array) else np.where(cond, n, o)
    return jax.tree.map(pick, new, old)
