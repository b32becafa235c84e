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
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.envs.text_state import obj_array
from atgrpo_jax.envs.workflow import Workflow, take_branch
from atgrpo_jax.rollout.samples import SampleOut, Samples, concat, right_padded

# sample_fn(agent, prompt_ids, k, keys) -> SampleOut, keys [len(prompt_ids)]: one PRNG
# key per prompt (branch k draws from fold_in(key, k)); the router lives inside it.
# encode(messages, agent) -> prompt token ids (the agent's chat template settings).
SampleFn = Callable[[int, Sequence[Sequence[int]], int, jax.Array], SampleOut]


@jax.jit
def _prompt_keys(key, streams, turn, agent):
    fold = jax.random.fold_in
    return jax.vmap(lambda s: fold(fold(fold(key, s), turn), agent))(streams)


def prompt_keys(key: jax.Array, streams: np.ndarray, turn: int, agent: int) -> jax.Array:
    """One key per prompt from its stream (its task's position in the step), the
    turn and the agent: a task's samples do not depend on which other tasks share
    the batch, or on which process rolls it out."""
    return _prompt_keys(key, np.asarray(streams, np.uint32), np.uint32(turn), np.uint32(agent))


@dataclasses.dataclass
class Episodes:
    success: np.ndarray  # [B] bool (plain GRPO: the mean over a task's K episodes)
    turns: np.ndarray  # [B] turns taken
    agent_reward: np.ndarray  # [A] mean reward per agent over live samples
    episode_success: np.ndarray  # [B, E] bool: each episode (tree: one per task; plain: K per task)
    # Every sample of every turn (tree: the groups; plain: one-sample groups, task = episode
    # index task * K + k), for episode logs.
    trajectory: Samples | None = None


@dataclasses.dataclass
class _Record:
    """One agent's turn over B tasks (K branches each)."""

    turn: int
    agent: int
    prompt: np.ndarray  # [B, P] right-padded
    prompt_len: np.ndarray  # [B]
    out: SampleOut  # B*K rows (dead tasks: empty rows)
    reward: np.ndarray  # [B, K]
    local: np.ndarray  # [B, K]
    team: np.ndarray  # [B, K]
    parsed_as: np.ndarray  # [B, K] object
    mask: np.ndarray  # [B, K]
    best: np.ndarray  # [B]


def _where_live(live: np.ndarray, new: Any, old: Any) -> Any:
    """Per task: the new state where live, else the old one (finished tasks freeze)."""
    def pick(n, o):
        cond = live.reshape(live.shape + (1,) * (np.ndim(n) - 1))
        return jnp.where(cond, n, o) if isinstance(n, jax.Array) else np.where(cond, n, o)
    return jax.tree.map(pick, new, old)


def _spread(out: SampleOut, rows: np.ndarray, b: int, k: int) -> SampleOut:
    """The sampled rows of the live tasks `rows` placed among B tasks (dead tasks: empty)."""
    width = out.tokens.shape[1]
    dest = (rows[:, None] * k + np.arange(k)).ravel()
    tokens, logps = np.zeros((b * k, width), np.int32), np.zeros((b * k, width), np.float32)
    lengths, texts = np.zeros(b * k, np.int32), [""] * (b * k)
    tokens[dest], logps[dest], lengths[dest] = out.tokens, out.logprobs, out.lengths
    for d, text in zip(dest, out.texts):
        texts[d] = text
    return SampleOut(tokens, lengths, logps, texts)


def _run(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids, split: str,
         k: int, max_turns: int, alpha: float, key: jax.Array, streams: np.ndarray):
    """The loop both modes share. Returns the records, the final state and turns per task.
    streams [B]: the random stream of each task (see prompt_keys)."""
    state = workflow.reset(task_ids, split)
    b = len(task_ids)
    turns = np.zeros(b, np.int32)
    records = []
    for turn in range(max_turns):
        live = ~np.asarray(workflow.done(state))
        if not live.any():
            break
        turns += live
        for agent in range(len(workflow.agents)):
            live = ~np.asarray(workflow.done(state))
            if not live.any():
                break
            prompts = [np.asarray(encode(m, agent), np.int32) for m in workflow.prompts(state, agent, turn)]
            rows = np.flatnonzero(live)  # sample only live tasks
            out = _spread(sample_fn(agent, [prompts[i] for i in rows], k, prompt_keys(key, streams[rows], turn, agent)),
                          rows, b, k)
            texts = [out.texts[i * k:(i + 1) * k] for i in range(b)]
            step = workflow.step(state, agent, turn, texts)
            reward = np.asarray(step.local_reward + alpha * step.team_reward, np.float32)
            mask = np.repeat(live[:, None], k, axis=1)
            best = np.argmax(np.where(mask, reward, -np.inf), axis=1)
            state = _where_live(live, take_branch(step.state, best), state)
            parsed_as = step.parsed_as if step.parsed_as is not None else np.full((b, k), "", object)
            records.append(_Record(turn, agent, *right_padded(prompts), out, reward,
                                   np.asarray(step.local_reward, np.float32), np.asarray(step.team_reward, np.float32),
                                   parsed_as, mask, best))
    return records, state, turns


def _record_samples(r: _Record, k: int, streams: np.ndarray) -> Samples:
    """One record's B groups (task, agent, turn) of K samples."""
    b = len(streams)
    width = r.out.tokens.shape[1]
    return Samples(
        prompt=np.repeat(r.prompt[:, None], k, axis=1), prompt_len=np.repeat(r.prompt_len[:, None], k, axis=1),
        response=r.out.tokens.reshape(b, k, width), response_len=r.out.lengths.reshape(b, k),
        sampler_logp=r.out.logprobs.reshape(b, k, width), reward=r.reward, local_reward=r.local,
        team_reward=r.team, mask=r.mask, task=np.asarray(streams), agent=np.full(b, r.agent),
        sample_agent=np.full((b, k), r.agent), turn=np.full(b, r.turn),
        text=obj_array(r.out.texts).reshape(b, k), parsed_as=r.parsed_as,
        selected=np.where(r.mask[:, 0], r.best, -1))


def tree_rollout(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int],
                 split: str, *, k: int, max_turns: int, alpha: float, key: jax.Array, first_task: int = 0):
    """AT-GRPO tree sampling: groups (task, agent, turn) of exactly K samples.

    Samples.task is a task's position in the step's task list: `first_task` + i
    for task_ids[i] (a process rolling out a slice passes where it starts)."""
    streams = first_task + np.arange(len(task_ids))
    records, state, turns = _run(workflow, sample_fn, encode, task_ids, split, k, max_turns, alpha, key, streams)
    samples = concat([_record_samples(r, k, streams) for r in records]) if records else Samples.empty(k)
    success = np.asarray(workflow.success(state))
    return samples, Episodes(success, turns, _agent_reward(samples, len(workflow.agents)), success[:, None], samples)


def plain_rollout(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int],
                  split: str, *, k: int, max_turns: int, alpha: float, key: jax.Array, first_task: int = 0,
                  grouping: str = "task"):
    """Plain GRPO: K independent episodes per task, no selection. grouping "task" (the reference
    system's): one group per task, every agent's sample at the task's maximum turn (the last turn
    any of its K episodes reached; an episode that ended earlier has none), K * agents wide;
    "task_agent": one group per (task, agent) with the last sample of each of the K episodes."""
    if grouping not in PLAIN_GROUPINGS:
        raise ValueError(f"grouping must be one of {PLAIN_GROUPINGS}, got {grouping!r}")
    b, num_agents = len(task_ids), len(workflow.agents)
    episode_tasks = np.repeat(np.asarray(task_ids), k)  # episode e = task e // k, branch e % k
    streams = first_task * k + np.arange(b * k)
    records, state, turns = _run(workflow, sample_fn, encode, episode_tasks, split, 1, max_turns, alpha, key,
                                 streams)
    one = concat([_record_samples(r, 1, streams) for r in records]) if records else None  # [R * B*K] of 1
    samples = Samples.empty(k if grouping == "task_agent" else k * num_agents, shared_prompt=False)
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
    success = np.asarray(workflow.success(state)).reshape(b, k)
    return samples, Episodes(success.mean(1), turns.reshape(b, k).mean(1), _agent_reward(samples, num_agents),
                             success, one)


PLAIN_GROUPINGS = ("task", "task_agent")


def _gather(one: Samples, idx: np.ndarray, has: np.ndarray, **group) -> Samples:
    """Groups [G, W] made of `one`'s one-sample groups idx[g, w] (samples where `has`)."""
    g, w = idx.shape
    flat = one.take(idx.ravel())
    shaped = lambda x: x.reshape(g, w, *x.shape[2:])  # noqa: E731
    zero = lambda x: np.where(has, shaped(x), 0).astype(x.dtype)  # noqa: E731
    return Samples(prompt=shaped(flat.prompt), prompt_len=shaped(flat.prompt_len), response=shaped(flat.response),
                   response_len=zero(flat.response_len), sampler_logp=shaped(flat.sampler_logp),
                   reward=zero(flat.reward), local_reward=zero(flat.local_reward), team_reward=zero(flat.team_reward),
                   mask=has, sample_agent=shaped(flat.sample_agent), text=shaped(flat.text),
                   parsed_as=shaped(flat.parsed_as), selected=np.full(g, -1), shared_prompt=False, **group)


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
    def merged(samples: Samples) -> Samples:
        order = [g for g in np.lexsort((samples.task, samples.agent, samples.turn)) if samples.mask[g].any()]
        return samples.take(np.asarray(order, np.int64))

    samples = merged(concat([s for s, _ in parts]))
    trajectories = [e.trajectory for _, e in parts if e.trajectory is not None]
    cat = lambda name: np.concatenate([getattr(e, name) for _, e in parts])
    episodes = Episodes(cat("success"), cat("turns"), _agent_reward(samples, num_agents), cat("episode_success"),
                        merged(concat(trajectories)) if trajectories else None)
    return samples, episodes
