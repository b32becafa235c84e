"""The multi-agent, multi-turn tree rollout of AT-GRPO, and what every rollout strategy shares.

A strategy (`TreeRollout` here, `plain.PlainRollout`) holds its own settings; `strategy.begin(inputs)`
starts a rollout of `RolloutInputs` (the tasks, the workflow, how to sample, the seed) as an `InFlight`,
whose `run()` (or `advance` in parts, then `result()`) gives (Samples, Episodes).

Tree sampling: for each turn and each agent in turn order, K responses from the shared state
(one prefill, K branches), K copies of the state stepped, each scored with the
agent's reward (own + alpha * team); the K samples form the group
(task, agent, turn). Then the best branch becomes the state of all K slots, so
the next agent observes and steps exactly the selected branch.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np

from atgrpo_jax.envs.text_state import obj_array
from atgrpo_jax.envs.workflow import Workflow
from atgrpo_jax.rollout.cohort import Record, ReferenceTree, Stages, combine, run_sync
from atgrpo_jax.rollout.dispatch import Running, Schedule, run_async, run_watched, split_cohorts  # noqa: F401
from atgrpo_jax.rollout.samples import SampleOut, Samples, concat

# sample_fn(agent, prompt_ids, k, keys) -> SampleOut, keys [len(prompt_ids)]: one PRNG
# key per prompt (branch k draws from fold_in(key, k)); the router lives inside it.
SampleFn = Callable[[int, Sequence[Sequence[int]], int, jax.Array], SampleOut]


@dataclasses.dataclass(frozen=True)
class RolloutInputs:
    """What one rollout rolls out, whatever the strategy: which tasks of which split, in which workflow,
    sampled and encoded how, for how many turns, with which seed."""

    workflow: Workflow
    sample_fn: SampleFn
    encode: Callable  # encode(messages, agent) -> prompt token ids (the agent's chat template settings)
    task_ids: Sequence[int]
    split: str
    max_turns: int
    alpha: float  # an agent's reward: its own + alpha * the team's
    key: jax.Array
    # Samples.task of task_ids[i] is first_task + i: a task's position in the step's task list (a process
    # rolling out a slice passes where it starts)
    first_task: int = 0
    schedule: Schedule | None = None
    team_weights: tuple[float, ...] = ()  # per turn, the team reward's multiplier (algo.team_weighting); (): 1
    counterfactual: bool = False  # record each sample's counterfactual reward (rollout/counterfactual.py)


@dataclasses.dataclass
class Episodes:
    success: np.ndarray  # [B] bool (plain GRPO: the mean over a task's K episodes)
    turns: np.ndarray  # [B] turns taken
    agent_reward: np.ndarray  # [A] mean reward per agent over live samples
    episode_success: np.ndarray  # [B, E] bool: each episode (tree: one per task; plain: K per task)
    # Every sample of every turn (tree: the groups; plain: one-sample groups, task = episode
    # index task * K + k), for episode logs.
    trajectory: Samples | None = None


@dataclasses.dataclass(frozen=True)
class PoolGroups:
    """A pool's complete groups, before the rest of the rollout is done (Schedule.finished)."""

    pool: int
    samples: Samples


class InFlight:
    """A rollout under way: its cohorts, advanced turn by turn (`advance`), then `result`. A rollout
    made in one go advances once, to its last turn; with system.staleness >= 2 it advances in parts,
    each under the weights current then (a partial rollout: an episode's later turns sample with newer
    weights, and every stage records the version it sampled with: Samples.version)."""

    def __init__(self, stages: Stages, sample_fn: SampleFn, task_ids, split: str, schedule: Schedule | None,
                 post: Callable, groups_of: Callable | None = None):
        self.stages, self.sample_fn, self.schedule = stages, sample_fn, schedule or Schedule()
        self.task_ids, self.post, self.groups_of = np.asarray(task_ids), post, groups_of
        self.cohorts = [stages.start(self.task_ids, split, rows)
                        for rows in split_cohorts(len(self.task_ids), self.schedule.cohorts)]

    def advance(self, end: int | None = None, versions: tuple[int, ...] = ()) -> None:
        """Every stage of the turns before `end` (None: all) not yet run, recording `versions` (per agent:
        the optimizer step of the weights its policy samples with now). groups_of(records): the Samples
        of a pool's records, put on schedule.finished as soon as they are complete (asynchronous runs)."""
        stages = dataclasses.replace(self.stages, versions=versions or self.stages.versions,
                                     max_turns=self.stages.max_turns if end is None else min(end, self.stages.max_turns))
        schedule, cohorts, n = self.schedule, self.cohorts, len(self.task_ids)
        if schedule.asynchronous:
            pools = schedule.pool_of_agent or (0,) * len(stages.workflow.agents)
            for done in run_async(stages, cohorts, self.sample_fn, dataclasses.replace(schedule, pool_of_agent=pools)):
                if schedule.finished is not None and self.groups_of is not None:
                    agents = {a for a, q in enumerate(pools) if int(q) == done.pool}
                    mine = [dataclasses.replace(c, records=[r for r in list(c.records) if r.agent in agents])
                            for c in cohorts]
                    schedule.finished.put(PoolGroups(done.pool, self.groups_of(combine(mine, n, stages.k))))
            return
        names = schedule.pool_names
        label = (lambda agent: f"pool {names[schedule.pool_of_agent[agent]]}") if names else None  # noqa: E731
        running = Running()  # a hung stage is named after system.stage_timeout_s, as the dispatcher's are
        for i, c in enumerate(cohorts):
            run_watched(lambda: run_sync(stages, c, self.sample_fn, schedule.tracer, label, running, i), running,
                        schedule.stage_timeout_s)

    def result(self):
        """The finished rollout (what its strategy returns: samples and episodes)."""
        workflow, n = self.stages.workflow, len(self.task_ids)
        success, turns = np.zeros(n, bool), np.zeros(n, np.int32)
        for c in self.cohorts:
            success[c.rows], turns[c.rows] = np.asarray(workflow.success(c.state)), c.turns
        return self.post(combine(self.cohorts, n, self.stages.k), success, turns)

    def run(self):
        """Every stage, then the result: the rollout made in one go."""
        self.advance()
        return self.result()


def record_samples(r: Record, k: int, streams: np.ndarray) -> Samples:
    """One record's B groups (task, agent, turn) of K samples; streams [B]: each group's Samples.task."""
    b = len(streams)
    width = r.out.tokens.shape[1]
    return Samples(
        prompt=r.prompt, prompt_len=r.prompt_len, prompt_of=np.repeat(np.arange(b)[:, None], k, axis=1),
        response=r.out.tokens.reshape(b, k, width), response_len=r.out.lengths.reshape(b, k),
        sampler_logp=r.out.logprobs.reshape(b, k, width), reward=r.reward, local_reward=r.local,
        team_reward=r.team, mask=r.mask, task=np.asarray(streams), agent=np.full(b, r.agent),
        sample_agent=np.full((b, k), r.agent), turn=np.full(b, r.turn),
        text=obj_array(r.out.texts).reshape(b, k), parsed_as=r.parsed_as,
        selected=np.where(r.mask[:, 0], r.best, -1), version=np.full((b, k), r.version),
        reward_parts=r.reward_parts if r.reward_parts is not None else np.full((b, k), None, object),
        counterfactual_reward=r.counterfactual)


@dataclasses.dataclass(frozen=True)
class TreeRollout:
    """AT-GRPO's tree sampling: one prompt per task and stage, K branches; groups (task, agent, turn)
    of exactly K samples. reference_tree: the reference engine's behaviours to reproduce."""

    k: int
    reference_tree: ReferenceTree = ReferenceTree()

    def prompts(self, tasks: int) -> int:
        """The most prompts one sample call gets for `tasks` tasks."""
        return tasks

    def begin(self, inputs: RolloutInputs) -> InFlight:
        """The rollout of `inputs`, not yet run."""
        k, workflow = self.k, inputs.workflow
        streams = inputs.first_task + np.arange(len(inputs.task_ids))  # see cohort.prompt_keys
        as_samples = lambda records: concat([record_samples(r, k, streams) for r in records]) \
            if records else Samples.empty(k)  # noqa: E731
        stages = Stages(workflow, inputs.encode, k, inputs.max_turns, inputs.alpha, inputs.key, streams,
                        reference_tree=self.reference_tree, team_weights=inputs.team_weights,
                        counterfactual=inputs.counterfactual)

        def post(records, success, turns):
            samples = as_samples(records)
            return samples, Episodes(success, turns, agent_reward(samples, len(workflow.agents)), success[:, None],
                                     samples)

        # (a pool's early samples in the order merge_rollouts gives the whole step's)
        return InFlight(stages, inputs.sample_fn, inputs.task_ids, inputs.split, inputs.schedule, post,
                        lambda records: canonical(as_samples(records)))


def agent_reward(samples: Samples, num_agents: int) -> np.ndarray:
    """[A] each agent's mean reward over its live samples (NaN where it has none)."""
    out = np.zeros(num_agents, np.float32)
    for a in range(num_agents):
        m = samples.mask & (samples.sample_agent == a)
        out[a] = samples.reward[m].mean() if m.any() else np.nan
    return out


def merge_rollouts(parts: Sequence[tuple[Samples, Episodes]], num_agents: int) -> tuple[Samples, Episodes]:
    """One step's rollouts of consecutive task slices (e.g. one per process) as
    one: groups in (turn, agent, task) order, groups with no live sample
    dropped, so the result does not depend on how the tasks were split."""
    samples = canonical(concat([s for s, _ in parts]))
    trajectories = [e.trajectory for _, e in parts if e.trajectory is not None]
    cat = lambda name: np.concatenate([getattr(e, name) for _, e in parts])
    episodes = Episodes(cat("success"), cat("turns"), agent_reward(samples, num_agents), cat("episode_success"),
                        canonical(concat(trajectories)) if trajectories else None)
    return samples, episodes


def canonical(samples: Samples) -> Samples:
    """Groups in (turn, agent, task) order, those with no live sample dropped: the order a step's
    samples have however its tasks were split (processes, cohorts) or its pools finished."""
    order = [g for g in np.lexsort((samples.task, samples.agent, samples.turn)) if samples.mask[g].any()]
    return samples.take(np.asarray(order, np.int64))
