"""Plain GRPO ("no tree"): K independent episodes per task, one branch each, no selection.

Episode e of a rollout of B tasks is task e // K's branch e % K (e = task * K + branch). Each stage
(turn, agent) is one record with one sample per episode, so the trajectory holds R records x B * K
one-sample groups: group r * B * K + e is record r's sample of episode e (`live` [R, B * K]: whether
episode e took part in record r). The samples are then grouped by `PlainRollout.grouping`:
"task" (`samples_at_last_turn`) or "task_agent" (`last_sample_per_agent`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from atgrpo_jax.rollout.cohort import Stages
from atgrpo_jax.rollout.samples import Samples, concat
from atgrpo_jax.rollout.section import PLAIN_GROUPINGS
from atgrpo_jax.rollout.tree import Episodes, InFlight, RolloutInputs, agent_reward, record_samples


@dataclasses.dataclass(frozen=True)
class PlainRollout:
    """Plain GRPO: K independent episodes per task, grouped by `grouping`: "task" (the reference
    system's), one group per task, every agent's sample at the task's last turn, K * agents wide;
    "task_agent", one group per (task, agent) with the last sample of each of the K episodes."""

    k: int
    grouping: str = "task"

    def __post_init__(self):
        if self.grouping not in PLAIN_GROUPINGS:
            raise ValueError(f"grouping must be one of {PLAIN_GROUPINGS}, got {self.grouping!r}")

    def prompts(self, tasks: int) -> int:
        """The most prompts one sample call gets for `tasks` tasks."""
        return tasks * self.k  # every episode prompts on its own

    def begin(self, inputs: RolloutInputs) -> InFlight:
        """The rollout of `inputs`, not yet run. Its Episodes.trajectory: every record's one-sample groups,
        Samples.task = the episode's stream (first_task * K + e)."""
        k, num_tasks, num_agents = self.k, len(inputs.task_ids), len(inputs.workflow.agents)
        episode_tasks = np.repeat(np.asarray(inputs.task_ids), k)  # [B * K]: episode e rolls out task e // K
        streams = inputs.first_task * k + np.arange(num_tasks * k)
        tasks = inputs.first_task + np.arange(num_tasks)  # the groups' Samples.task
        stages = Stages(inputs.workflow, inputs.encode, 1, inputs.max_turns, inputs.alpha, inputs.key, streams,
                        team_weights=inputs.team_weights)

        def post(records, success, turns):
            if not records:
                trajectory = None
                samples = Samples.empty(k if self.grouping == "task_agent" else k * num_agents)
            else:
                trajectory = concat([record_samples(r, 1, streams) for r in records])
                live = trajectory.mask[:, 0].reshape(len(records), num_tasks * k)
                record_agent = np.array([r.agent for r in records])
                if self.grouping == "task_agent":
                    samples = last_sample_per_agent(trajectory, live, record_agent, tasks, k)
                else:
                    record_turn = np.array([r.turn for r in records])
                    samples = samples_at_last_turn(trajectory, live, record_turn, record_agent, tasks, k, num_agents)
            success = success.reshape(num_tasks, k)
            return samples, Episodes(success.mean(1), turns.reshape(num_tasks, k).mean(1),
                                     agent_reward(samples, num_agents), success, trajectory)

        return InFlight(stages, inputs.sample_fn, episode_tasks, inputs.split, inputs.schedule, post)


def last_sample_per_agent(trajectory: Samples, live: np.ndarray, record_agent: np.ndarray, tasks: np.ndarray,
                          k: int) -> Samples:
    """Grouping "task_agent": groups [A' * B, K], for each agent that acted (ascending) one group per task,
    whose column j is the agent's last sample in episode task * K + j (masked out where it never acted).
    trajectory, live [R, B * K]: see the module; record_agent [R]: each record's agent; tasks [B]: the
    groups' Samples.task. Samples.turn is -1 (a group's samples come from different turns)."""
    num_tasks, episodes = len(tasks), live.shape[1]
    groups = []
    for agent in np.unique(record_agent):
        records = np.flatnonzero(record_agent == agent)  # [R_a] the agent's records, in turn order
        took_part = live[records]  # [R_a, B * K]
        last_record = records[len(records) - 1 - np.argmax(took_part[::-1], axis=0)]  # [B * K], per episode
        sample = last_record * episodes + np.arange(episodes)  # [B * K]: its one-sample group in the trajectory
        groups.append(_gather(trajectory, sample.reshape(num_tasks, k), took_part.any(0).reshape(num_tasks, k),
                              task=tasks, agent=np.full(num_tasks, agent), turn=np.full(num_tasks, -1)))
    return concat(groups)


def samples_at_last_turn(trajectory: Samples, live: np.ndarray, record_turn: np.ndarray, record_agent: np.ndarray,
                         tasks: np.ndarray, k: int, num_agents: int) -> Samples:
    """Grouping "task" (the reference system's): one group per task, [B, K * A]: column j * A + a is agent
    a's sample in episode task * K + j at the task's last turn (the latest turn any of its K episodes
    reached; masked out where that episode had ended before it, or the agent did not act then).
    trajectory, live [R, B * K]: see the module; record_turn, record_agent [R]: each record's stage;
    tasks [B]: the groups' Samples.task. Samples.turn is that last turn, Samples.agent -1."""
    num_tasks, episodes = len(tasks), live.shape[1]
    episode_turn = np.max(np.where(live, record_turn[:, None], -1), axis=0)  # [B * K] each episode's last turn
    last_turn = episode_turn.reshape(num_tasks, k).max(1)  # [B]
    record_of = {(t, a): r for r, (t, a) in enumerate(zip(record_turn, record_agent))}  # stage -> its record
    branch, agent = np.divmod(np.arange(k * num_agents), num_agents)  # [K * A] each column's
    record = np.array([[record_of.get((turn, a), -1) for a in agent] for turn in last_turn])  # [B, K * A]; -1: none
    episode = np.arange(num_tasks)[:, None] * k + branch[None]  # [B, K * A]
    took_part = (record >= 0) & live[np.maximum(record, 0), episode]
    sample = np.maximum(record, 0) * episodes + episode  # [B, K * A]: its one-sample group in the trajectory
    return _gather(trajectory, sample, took_part, task=tasks, agent=np.full(num_tasks, -1), turn=last_turn)


def _gather(one: Samples, idx: np.ndarray, has: np.ndarray, **group) -> Samples:
    """Groups [G, W] made of `one`'s one-sample groups idx[g, w] (samples where `has`)."""
    g, w = idx.shape
    flat = one.take(idx.ravel())
    shaped = lambda x: x.reshape(g, w, *x.shape[2:])  # noqa: E731
    zero = lambda x: np.where(has, shaped(x), 0).astype(x.dtype)  # noqa: E731
    return Samples(prompt=flat.prompt, prompt_len=flat.prompt_len, prompt_of=shaped(flat.prompt_of),
                   response=shaped(flat.response),
                   response_len=zero(flat.response_len), sampler_logp=shaped(flat.sampler_logp),
                   reward=zero(flat.reward), counterfactual_reward=zero(flat.counterfactual_reward),
                   local_reward=zero(flat.local_reward), team_reward=zero(flat.team_reward),
                   mask=has, sample_agent=shaped(flat.sample_agent), text=shaped(flat.text),
                   parsed_as=shaped(flat.parsed_as), selected=np.full(g, -1), version=shaped(flat.version),
                   reward_parts=np.where(has, shaped(flat.reward_parts), None), **group)
