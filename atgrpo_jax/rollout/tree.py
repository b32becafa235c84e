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

from atgrpo_jax.envs.workflow import Workflow, take_branch


@dataclasses.dataclass
class SampleOut:
    """K responses for each of B prompts (row b*K + k)."""

    response_ids: list[np.ndarray]  # B*K int arrays, stop token included
    logprobs: list[np.ndarray]  # B*K float arrays, sampler log-prob per response token
    texts: list[str]  # B*K decoded responses


# sample_fn(agent, prompt_ids, k, keys) -> SampleOut, keys [len(prompt_ids)]: one PRNG
# key per prompt (branch k draws from fold_in(key, k)); the router lives inside it.
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
class Samples:
    """A dense [G, K] table of samples; group g = (task[g], agent[g], turn[g])."""

    prompt: list[list[np.ndarray]]  # [G][K] token ids
    response: list[list[np.ndarray]]  # [G][K]
    sampler_logp: list[list[np.ndarray]]  # [G][K]
    reward: np.ndarray  # [G, K] float32: local + alpha * team
    mask: np.ndarray  # [G, K] bool: the sample exists (its task was live)
    task: np.ndarray  # [G]
    agent: np.ndarray  # [G]
    turn: np.ndarray  # [G]


@dataclasses.dataclass
class Episodes:
    success: np.ndarray  # [B] bool
    turns: np.ndarray  # [B] turns taken
    agent_reward: np.ndarray  # [A] mean reward per agent over live samples


def _where_live(live: np.ndarray, new: Any, old: Any) -> Any:
    """Per task: the new state where live, else the old one (finished tasks freeze)."""
    def pick(n, o):
        cond = live.reshape(live.shape + (1,) * (np.ndim(n) - 1))
        return jnp.where(cond, n, o) if isinstance(n, jax.Array) else np.where(cond, n, o)
    return jax.tree.map(pick, new, old)


def _run(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids, split: str,
         k: int, max_turns: int, alpha: float, key: jax.Array, streams: np.ndarray):
    """The loop both modes share. Returns per-step records and the final state.
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
            prompts = [np.asarray(encode(m), np.int32) for m in workflow.prompts(state, agent, turn)]
            rows = np.flatnonzero(live)  # sample only live tasks
            out = sample_fn(agent, [prompts[i] for i in rows], k, prompt_keys(key, streams[rows], turn, agent))
            texts = [[""] * k for _ in range(b)]
            resp = [[np.zeros(0, np.int32)] * k for _ in range(b)]
            logp = [[np.zeros(0, np.float32)] * k for _ in range(b)]
            for j, i in enumerate(rows):
                texts[i] = out.texts[j * k:(j + 1) * k]
                resp[i] = out.response_ids[j * k:(j + 1) * k]
                logp[i] = out.logprobs[j * k:(j + 1) * k]
            step = workflow.step(state, agent, turn, texts)
            reward = np.asarray(step.local_reward + alpha * step.team_reward, np.float32)
            mask = np.repeat(live[:, None], k, axis=1)
            best = np.argmax(np.where(mask, reward, -np.inf), axis=1)
            state = _where_live(live, take_branch(step.state, best), state)
            records.append(dict(turn=turn, agent=agent, prompts=prompts, resp=resp, logp=logp,
                                reward=reward, mask=mask, best=best))
    return records, state, turns


def tree_rollout(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int],
                 split: str, *, k: int, max_turns: int, alpha: float, key: jax.Array, first_task: int = 0):
    """AT-GRPO tree sampling: groups (task, agent, turn) of exactly K samples.

    Samples.task is a task's position in the step's task list: `first_task` + i
    for task_ids[i] (a process rolling out a slice passes where it starts)."""
    b = len(task_ids)
    streams = first_task + np.arange(b)
    records, state, turns = _run(workflow, sample_fn, encode, task_ids, split, k, max_turns, alpha, key,
                                 streams)
    g = dict(prompt=[], response=[], sampler_logp=[], reward=[], mask=[], task=[], agent=[], turn=[])
    for r in records:
        for i in range(b):
            g["prompt"].append([r["prompts"][i]] * k)
            g["response"].append(r["resp"][i])
            g["sampler_logp"].append(r["logp"][i])
            g["task"].append(streams[i])
            g["agent"].append(r["agent"])
            g["turn"].append(r["turn"])
        g["reward"].append(r["reward"])
        g["mask"].append(r["mask"])
    samples = _pack(g, k)
    return samples, _episodes(workflow, state, turns, samples)


def plain_rollout(workflow: Workflow, sample_fn: SampleFn, encode: Callable, task_ids: Sequence[int],
                  split: str, *, k: int, max_turns: int, alpha: float, key: jax.Array, first_task: int = 0):
    """Plain GRPO: K independent episodes per task, no selection; each group is
    (task, agent) with the last-turn sample of each of the K episodes."""
    b = len(task_ids)
    episode_tasks = np.repeat(np.asarray(task_ids), k)  # episode e = task e // k, branch e % k
    streams = first_task * k + np.arange(b * k)
    records, state, turns = _run(workflow, sample_fn, encode, episode_tasks, split, 1, max_turns, alpha, key,
                                 streams)
    num_agents = len(workflow.agents)
    g = dict(prompt=[], response=[], sampler_logp=[], reward=[], mask=[], task=[], agent=[], turn=[])
    for agent in range(num_agents):
        last = {}  # episode -> its last record for this agent
        for r in records:
            if r["agent"] == agent:
                for e in np.flatnonzero(r["mask"][:, 0]):
                    last[e] = r
        for i in range(b):
            eps = range(i * k, (i + 1) * k)
            g["prompt"].append([last[e]["prompts"][e] if e in last else np.zeros(0, np.int32) for e in eps])
            g["response"].append([last[e]["resp"][e][0] if e in last else np.zeros(0, np.int32) for e in eps])
            g["sampler_logp"].append([last[e]["logp"][e][0] if e in last else np.zeros(0, np.float32) for e in eps])
            g["reward"].append(np.array([last[e]["reward"][e, 0] if e in last else 0.0 for e in eps], np.float32))
            g["mask"].append(np.array([e in last for e in eps]))
            g["task"].append(first_task + i)
            g["agent"].append(agent)
            g["turn"].append(-1)
    samples = _pack(g, k, stacked=False)
    success = np.asarray(workflow.success(state)).reshape(b, k).mean(1)
    return samples, Episodes(success, turns.reshape(b, k).mean(1), _agent_reward(samples, num_agents))


def _pack(g: dict, k: int, stacked: bool = True) -> Samples:
    reward = np.concatenate(g["reward"]) if stacked and g["reward"] else np.asarray(g["reward"], np.float32)
    mask = np.concatenate(g["mask"]) if stacked and g["mask"] else np.asarray(g["mask"], bool)
    return Samples(g["prompt"], g["response"], g["sampler_logp"], reward.reshape(-1, k).astype(np.float32),
                   mask.reshape(-1, k), np.asarray(g["task"]), np.asarray(g["agent"]), np.asarray(g["turn"]))


def _agent_reward(samples: Samples, num_agents: int) -> np.ndarray:
    out = np.zeros(num_agents, np.float32)
    for a in range(num_agents):
        m = samples.mask[samples.agent == a]
        out[a] = samples.reward[samples.agent == a][m].mean() if m.any() else np.nan
    return out


def _episodes(workflow: Workflow, state, turns, samples: Samples) -> Episodes:
    return Episodes(np.asarray(workflow.success(state)), turns, _agent_reward(samples, len(workflow.agents)))


def merge_rollouts(parts: Sequence[tuple[Samples, Episodes]], num_agents: int) -> tuple[Samples, Episodes]:
    """One step's rollouts of consecutive task slices (e.g. one per process) as
    one: groups in (turn, agent, task) order, groups with no live sample
    dropped, so the result does not depend on how the tasks were split."""
    cat = lambda name: [x for s, _ in parts for x in getattr(s, name)]
    arr = lambda name: np.concatenate([getattr(s, name) for s, _ in parts])
    task, agent, turn = arr("task"), arr("agent"), arr("turn")
    mask = arr("mask")
    order = [g for g in np.lexsort((task, agent, turn)) if mask[g].any()]  # lexsort is stable
    pick = lambda xs: [xs[g] for g in order]
    samples = Samples(pick(cat("prompt")), pick(cat("response")), pick(cat("sampler_logp")),
                      arr("reward")[order].reshape(-1, parts[0][0].reward.shape[1]),
                      mask[order].reshape(-1, mask.shape[1]),
                      task[order], agent[order], turn[order])
    episodes = Episodes(np.concatenate([e.success for _, e in parts]), np.concatenate([e.turns for _, e in parts]),
                        _agent_reward(samples, num_agents))
    return samples, episodes
