"""The multi-agent, multi-turn tree rollout of AT-GRPO.

For each turn and each agent in turn order: K responses from the shared state
(one prefill, K branches), K copies of the state stepped, each scored with the
agent's reward (own + alpha * team); the K samples form the group
(task, agent, turn). Then the best branch becomes the state of all K slots, so
the next agent observes and steps exactly the selected branch.

Plain GRPO ("no tree") runs K independent episodes per task with one branch
each and groups, per task and agent, the samples of the last turn each
episode reached.
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
from atgrpo_jax.rollout.section import PLAIN_GROUPINGS

# sample_fn(agent, prompt_ids, k, keys) -> SampleOut, keys [len(prompt_ids)]: one PRNG
# key per prompt (branch k draws from fold_in(key, k)); the router lives inside it.
# encode(messages, agent) -> prompt token ids (the agent's chat template settings).
SampleFn = Callable[[int, Sequence[Sequence[int]], int, jax.Array], SampleOut]


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


def _record_samples(r: Record, k: int, streams: np.ndarray) -> Samples:
    """One record's B groups (task, agent, turn) of K samples."""
    b = len(streams)
    width = r.out.tokens.shape[1]
    return Samples(
        prompt=r.prompt, prompt_len=r.prompt_len, prompt_of=np.repeat(np.arange(b)[:, None], k, axis=1),
        response=r.out.tokens.reshape(b, k, width), response_len=r.out.lengths.reshape(b, k),
        sampler_logp=r.out.logprobs.reshape(b, k, width), reward=r.reward, local_reward=r.local,
        team_reward=r.team, mask=r.mask, task=np.asarray(streams), agent=np.full(b, r.agent),
        sample_agent=np.full((b, k), r.agent), turn=np.full(b, r.turn),
        text=obj_array(r.out.texts).reshape(b, k), parsed_as=r.parsed_as,
        selected=np.where(r.mask[:, 0], r.best, -1), version=np.full((b, k), r.version))


def tree_rollout(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int],
                 split: str, *, k: int, max_turns: int, alpha: float, key: jax.Array, first_task: int = 0,
                 schedule: Schedule | None = None, reference_tree: ReferenceTree = ReferenceTree()):
    """AT-GRPO tree sampling: groups (task, agent, turn) of exactly K samples.

    Samples.task is a task's position in the step's task list: `first_task` + i
    for task_ids[i] (a process rolling out a slice passes where it starts). reference_tree: the
    reference engine's behaviours to reproduce (cohort.ReferenceTree)."""
    return begin_tree(workflow, sample_fn, encode, task_ids, split, k=k, max_turns=max_turns, alpha=alpha, key=key,
                      first_task=first_task, schedule=schedule, reference_tree=reference_tree).run()


def begin_tree(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int], split: str, *,
               k: int, max_turns: int, alpha: float, key: jax.Array, first_task: int = 0,
               schedule: Schedule | None = None, reference_tree: ReferenceTree = ReferenceTree()) -> InFlight:
    """`tree_rollout`, not yet run (InFlight.run, or advance in parts, then result)."""
    streams = first_task + np.arange(len(task_ids))
    as_samples = lambda records: concat([_record_samples(r, k, streams) for r in records]) \
        if records else Samples.empty(k)  # noqa: E731
    # (a pool's early samples in the order merge_rollouts gives the whole step's)
    stages = Stages(workflow, encode, k, max_turns, alpha, key, streams,  # streams: see cohort.prompt_keys
                    reference_tree=reference_tree)

    def post(records, success, turns):
        samples = as_samples(records)
        return samples, Episodes(success, turns, _agent_reward(samples, len(workflow.agents)), success[:, None],
                                 samples)

    return InFlight(stages, sample_fn, task_ids, split, schedule, post, lambda records: canonical(as_samples(records)))


def plain_rollout(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int],
                  split: str, *, k: int, max_turns: int, alpha: float, key: jax.Array, first_task: int = 0,
                  grouping: str = "task", schedule: Schedule | None = None):
    """Plain GRPO: K independent episodes per task, no selection. grouping "task" (the reference
    system's): one group per task, every agent's sample at the task's maximum turn (the last turn
    any of its K episodes reached; an episode that ended earlier has none), K * agents wide;
    "task_agent": one group per (task, agent) with the last sample of each of the K episodes."""
    return begin_plain(workflow, sample_fn, encode, task_ids, split, k=k, max_turns=max_turns, alpha=alpha, key=key,
                       first_task=first_task, grouping=grouping, schedule=schedule).run()


def begin_plain(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int], split: str, *,
                k: int, max_turns: int, alpha: float, key: jax.Array, first_task: int = 0, grouping: str = "task",
                schedule: Schedule | None = None) -> InFlight:
    """`plain_rollout`, not yet run (InFlight.run, or advance in parts, then result)."""
    if grouping not in PLAIN_GROUPINGS:
        raise ValueError(f"grouping must be one of {PLAIN_GROUPINGS}, got {grouping!r}")
    b, num_agents = len(task_ids), len(workflow.agents)
    episode_tasks = np.repeat(np.asarray(task_ids), k)  # episode e = task e // k, branch e % k
    streams = first_task * k + np.arange(b * k)
    stages = Stages(workflow, encode, 1, max_turns, alpha, key, streams)

    def post(records, success, turns):
        one = concat([_record_samples(r, 1, streams) for r in records]) if records else None  # [R * B*K] of 1
        samples = Samples.empty(k if grouping == "task_agent" else k * num_agents)
        if records:
            n = b * k
            live = one.mask[:, 0].reshape(len(records), n)  # [R, B*K]: episode e took part in record r
            rec_agent = np.array([r.agent for r in records])
            rec_turn = np.array([r.turn for r in records])
            tasks = first_task + np.arange(b)
            if grouping == "task_agent":
                parts = []
                for a in np.unique(rec_agent):
                    mine = np.flatnonzero(rec_agent == a)
                    last = mine[len(mine) - 1 - np.argmax(live[mine][::-1], axis=0)]  # [B*K] its last record
                    has = live[mine].any(0)
                    parts.append(_gather(one, (last * n + np.arange(n)).reshape(b, k), has.reshape(b, k),
                                         task=tasks, agent=np.full(b, a), turn=np.full(b, -1)))
                samples = concat(parts)
            else:
                last_turn = np.max(np.where(live, rec_turn[:, None], -1), axis=0)  # [B*K]
                top = last_turn.reshape(b, k).max(1)  # each task's maximum turn
                at = {(t, a): i for i, (t, a) in enumerate(zip(rec_turn, rec_agent))}
                cols = [(j, a) for j in range(k) for a in range(num_agents)]  # column j * A + a: episode j, agent a
                rec = np.array([[at.get((top[i], a), -1) for _, a in cols] for i in range(b)])
                ep = np.arange(b)[:, None] * k + np.array([j for j, _ in cols])[None]
                has = (rec >= 0) & live[np.maximum(rec, 0), ep]
                rec = np.maximum(rec, 0)
                samples = _gather(one, rec * n + ep, has, task=tasks, agent=np.full(b, -1), turn=top)
        success = success.reshape(b, k)
        return samples, Episodes(success.mean(1), turns.reshape(b, k).mean(1), _agent_reward(samples, num_agents),
                                 success, one)

    return InFlight(stages, sample_fn, episode_tasks, split, schedule, post)


@dataclasses.dataclass(frozen=True)
class TreeRollout:
    """AT-GRPO's tree sampling (`tree_rollout`): one prompt per task and stage, K branches."""

    k: int
    reference_tree: ReferenceTree = ReferenceTree()

    def prompts(self, tasks: int) -> int:
        """The most prompts one sample call gets for `tasks` tasks."""
        return tasks

    def __call__(self, workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int],
                 split: str, **kw):
        return tree_rollout(workflow, sample_fn, encode, task_ids, split, k=self.k, reference_tree=self.reference_tree,
                            **kw)

    def begin(self, workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int], split: str,
              **kw) -> InFlight:
        return begin_tree(workflow, sample_fn, encode, task_ids, split, k=self.k, reference_tree=self.reference_tree,
                          **kw)


@dataclasses.dataclass(frozen=True)
class PlainRollout:
    """Plain GRPO (`plain_rollout`): K independent episodes per task, grouped by `grouping`."""

    k: int
    grouping: str = "task"

    def prompts(self, tasks: int) -> int:
        return tasks * self.k  # every episode prompts on its own

    def __call__(self, workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int],
                 split: str, **kw):
        return plain_rollout(workflow, sample_fn, encode, task_ids, split, k=self.k, grouping=self.grouping, **kw)

    def begin(self, workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int], split: str,
              **kw) -> InFlight:
        return begin_plain(workflow, sample_fn, encode, task_ids, split, k=self.k, grouping=self.grouping, **kw)


def _gather(one: Samples, idx: np.ndarray, has: np.ndarray, **group) -> Samples:
    """Groups [G, W] made of `one`'s one-sample groups idx[g, w] (samples where `has`)."""
    g, w = idx.shape
    flat = one.take(idx.ravel())
    shaped = lambda x: x.reshape(g, w, *x.shape[2:])  # noqa: E731
    zero = lambda x: np.where(has, shaped(x), 0).astype(x.dtype)  # noqa: E731
    return Samples(prompt=flat.prompt, prompt_len=flat.prompt_len, prompt_of=shaped(flat.prompt_of),
                   response=shaped(flat.response),
                   response_len=zero(flat.response_len), sampler_logp=shaped(flat.sampler_logp),
                   reward=zero(flat.reward), local_reward=zero(flat.local_reward), team_reward=zero(flat.team_reward),
                   mask=has, sample_agent=shaped(flat.sample_agent), text=shaped(flat.text),
                   parsed_as=shaped(flat.parsed_as), selected=np.full(g, -1), version=shaped(flat.version), **group)


def _agent_reward(samples: Samples, num_agents: int) -> np.ndarray:
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
    episodes = Episodes(cat("success"), cat("turns"), _agent_reward(samples, num_agents), cat("episode_success"),
                        canonical(concat(trajectories)) if trajectories else None)
    return samples, episodes


def canonical(samples: Samples) -> Samples:
    """Groups in (turn, agent, task) order, those with no live sample dropped: the order a step's
    samples have however its tasks were split (processes, cohorts) or its pools finished."""
    order = [g for g in np.lexsort((samples.task, samples.agent, samples.turn)) if samples.mask[g].any()]
    return samples.take(np.asarray(order, np.int64))
