"""One step of a rollout as stages of cohorts: the unit both schedules run.

A cohort is a set of the step's tasks that move through the stages (turn, agent) together.
A stage is: render the live tasks' prompts (host), sample K responses per prompt (the
agent's policy, on its device pool), step the K branches and keep the best (host). The
synchronous schedule runs one cohort of all tasks, stage after stage; the asynchronous one
(dispatch.py) runs several cohorts whose stages interleave. Either way each task's stages,
keys and groups are the same, and `combine` turns the cohorts' records into one record per
stage over all tasks, as one cohort would have made them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from atgrpo_jax.envs.workflow import Workflow, take_branch
from atgrpo_jax.errors import RewardError
from atgrpo_jax.rollout import counterfactual
from atgrpo_jax.rollout.counterfactual import where_rows
from atgrpo_jax.rollout.samples import SampleOut, right_padded
from atgrpo_jax.trace import Tracer


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
class Record:
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
    version: int = -1  # the optimizer step of the weights that sampled it (-1: not known)
    reward_parts: np.ndarray | None = None  # [B, K] object: each response's reward by part (None: not said)
    counterfactual: np.ndarray | None = None  # [B, K] rollout/counterfactual.py's reward (None: `reward`)

    def __post_init__(self):
        if self.counterfactual is None:
            self.counterfactual = self.reward


@dataclasses.dataclass
class Request:
    """A stage's sampling work: the live tasks' prompts, one key each."""

    turn: int
    agent: int
    prompts: list[np.ndarray]  # every task's prompt (the dead ones' too: records keep them)
    rows: np.ndarray  # the live tasks (indices into the cohort)
    keys: jax.Array  # [len(rows)]

    @property
    def live_prompts(self) -> list[np.ndarray]:
        return [self.prompts[i] for i in self.rows]


@dataclasses.dataclass
class Cohort:
    rows: np.ndarray  # the cohort's tasks: positions in the step's task list
    state: Any  # the workflow state of those tasks
    turns: np.ndarray  # turns taken per task
    records: list[Record] = dataclasses.field(default_factory=list)
    turn: int = 0  # the next stage
    agent: int = 0
    replays: list = dataclasses.field(default_factory=list)  # this turn's counterfactual.Replay, if computed


@dataclasses.dataclass(frozen=True)
class ReferenceTree:
    """Two behaviours of the reference's tree engine (docs/paper.md, "Recipes", X3), off by default.
    shared_later_reward: a turn's later agents are scored on copies of the branch selected for its first
    agent, so their K samples share that branch's reward (a group with no variance) and the episode
    continues from it. drop_after_done: in a turn whose selected branch ends the episode, the samples of
    the agents after the first are dropped (the reference breaks out of its loop before recording them)."""

    shared_later_reward: bool = False
    drop_after_done: bool = False


@dataclasses.dataclass(frozen=True)
class Stages:
    """What every stage needs (the same for every cohort of a step)."""

    workflow: Workflow
    encode: Callable  # encode(messages, agent) -> ids
    k: int
    max_turns: int
    alpha: float
    key: jax.Array
    streams: np.ndarray  # the random stream of each of the step's tasks
    # per agent: the optimizer step of the weights its policy samples with (recorded with each stage;
    # empty: not known). A rollout run in parts (InFlight) changes it between parts.
    versions: tuple[int, ...] = ()
    reference_tree: ReferenceTree = ReferenceTree()
    team_weights: tuple[float, ...] = ()  # per turn, the team reward's multiplier (algo.team_weighting); (): 1
    counterfactual: bool = False  # compute every sample's counterfactual reward (rollout/counterfactual.py)

    def start(self, task_ids: np.ndarray, split: str, rows: np.ndarray) -> Cohort:
        return Cohort(rows, self.workflow.reset(task_ids[rows], split), np.zeros(len(rows), np.int32))

    def next_request(self, c: Cohort) -> Request | None:
        """The cohort's next stage (prompts rendered), or None: it is finished (its turns are used
        up, or none of its tasks is live)."""
        live = ~np.asarray(self.workflow.done(c.state))
        if c.turn >= self.max_turns or not live.any():
            return None
        if c.agent == 0:
            c.turns += live
        prompts = [np.asarray(self.encode(m, c.agent), np.int32) for m in self.workflow.prompts(c.state, c.agent, c.turn)]
        rows = np.flatnonzero(live)  # sample only live tasks
        return Request(c.turn, c.agent, prompts, rows, prompt_keys(self.key, self.streams[c.rows[rows]], c.turn, c.agent))

    def finish(self, c: Cohort, req: Request, out: SampleOut):
        """Step the K branches of the stage's sampled responses, keep each task's best, record it."""
        b, k = len(c.rows), self.k
        out = _spread(out, req.rows, b, k)
        live = np.zeros(b, bool)
        live[req.rows] = True
        step = self.workflow.step(c.state, req.agent, req.turn, [out.texts[i * k:(i + 1) * k] for i in range(b)])
        where = lambda kind: f"{self.workflow.agents[req.agent].name}'s {kind} reward at turn {req.turn}"  # noqa: E731
        tasks = self.streams[c.rows]
        local = checked_rewards(step.local_reward, live, k, where("local"), tasks)
        team = checked_rewards(step.team_reward, live, k, where("team"), tasks)
        with np.errstate(over="ignore", invalid="ignore"):
            alpha = self.alpha * (self.team_weights[req.turn] if self.team_weights else 1.0)
            reward = checked_rewards(local + np.float32(alpha) * team, live, k, where("combined"), tasks)
        mask = np.repeat(live[:, None], k, axis=1)
        best = np.argmax(np.where(mask, reward, -np.inf), axis=1)
        quirks = self.reference_tree
        if req.agent > 0 and quirks.shared_later_reward:  # every branch is a copy of the first agent's pick
            best = next(r.best for r in reversed(c.records) if r.turn == req.turn and r.agent == 0)
            local, team, reward = (np.repeat(x[np.arange(b), best][:, None], k, axis=1) for x in (local, team, reward))
        c.state = where_rows(live, take_branch(step.state, best), c.state)  # finished tasks freeze
        if req.agent > 0 and quirks.drop_after_done:
            mask &= ~np.asarray(self.workflow.done(c.state), bool)[:, None]
        parsed_as = step.parsed_as if step.parsed_as is not None else np.full((b, k), "", object)
        c.records.append(Record(req.turn, req.agent, *right_padded(req.prompts), out, reward, local, team,
                                parsed_as, mask, best, self.versions[req.agent] if self.versions else -1,
                                step.reward_parts))
        if self.counterfactual:
            self._replay(c, req, out, live, best, step.state, team, alpha, tasks)
        c.agent += 1
        if c.agent == len(self.workflow.agents):
            c.turn, c.agent, c.replays = c.turn + 1, 0, []

    def _replay(self, c: Cohort, req: Request, out: SampleOut, live, best, branched, team, alpha, tasks):
        """The earlier agents' branches of this turn stepped with this agent's chosen responses, their
        counterfactual rewards updated (rollout/counterfactual.py); this stage's branches kept for the
        agents after it."""
        k = self.k
        chosen = [out.texts[i * k + int(best[i])] if live[i] else "" for i in range(len(live))]
        for replay in c.replays:
            counterfactual.advance(self.workflow, replay, req.agent, req.turn, chosen, live)
            r = c.records[replay.record]
            name = f"{self.workflow.agents[r.agent].name}'s counterfactual reward at turn {req.turn}"
            with np.errstate(over="ignore", invalid="ignore"):
                r.counterfactual = checked_rewards(r.local + np.float32(alpha) * replay.team, r.mask[:, 0], k,
                                                   name, tasks)
        if req.agent + 1 < len(self.workflow.agents):
            c.replays.append(counterfactual.start(len(c.records) - 1, branched, team))


def checked_rewards(values, live: np.ndarray, k: int, what: str, tasks: np.ndarray) -> np.ndarray:
    """`values` (broadcast to [B, K]) as float32, or a RewardError naming the first value of a live task
    that is not a finite number (a string, None, inf, NaN, or a number float32 cannot hold, such as
    1e39) with its task and branch. Bools count as numbers; finished tasks' values are not read."""
    shape = (len(live), k)
    try:
        arr = np.broadcast_to(np.asarray(values), shape)
    except ValueError:
        raise RewardError(f"{what}: shape {np.shape(values)}, expected {shape} (tasks x branches)") from None
    numeric = arr.dtype.kind in "biuf" or all(isinstance(v, (bool, int, float, np.number)) for v in arr.ravel())
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = arr.astype(np.float32) if numeric else None
    bad = np.argwhere(live[:, None] & (~np.isfinite(f32) if numeric else np.ones(shape, bool)))
    if numeric:
        bad = bad[:1]
    else:  # object arrays: the first value that is not a number
        bad = [(b, j) for b, j in bad if not isinstance(arr[b, j], (bool, int, float, np.number))][:1]
    if len(bad):
        b, j = bad[0]
        kind = "is not a finite float32 number" if numeric else "is not a number"
        value = arr[b, j].item() if isinstance(arr[b, j], np.generic) else arr[b, j]
        raise RewardError(f"{what}: {value!r} {kind} (task {int(tasks[b])} of the step, branch {j})")
    return np.array(f32)


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


def run_sync(stages: Stages, c: Cohort, sample_fn, tracer=None, pool_label=None, running=None,
             index: int = 0) -> Cohort:
    """Every stage of one cohort, one after the other (timed on `tracer`: pool_label(agent) names
    the pool that samples for an agent). `running` (dispatch.Running), if given, is told which
    stage runs, named as the asynchronous schedule names it (cohort `index`), for its timeout."""

    tracer = tracer or Tracer(enabled=False)
    label = pool_label or (lambda agent: "pool")
    stage = running.start if running is not None else (lambda key, name: None)
    stage(("host", index), f"start of cohort {index}")
    with tracer.span("start", track="host"):
        req = stages.next_request(c)
    while req is not None:
        stage(("host", index), f"sample agent {req.agent} turn {req.turn} of cohort {index} ({label(req.agent)})")
        with tracer.span(f"sample agent {req.agent} turn {req.turn}", track=label(req.agent), prompts=len(req.rows)):
            out = sample_fn(req.agent, req.live_prompts, stages.k, req.keys)
        stage(("host", index), f"environment step of agent {req.agent} turn {req.turn} of cohort {index}")
        with tracer.span("step", track="host"):
            stages.finish(c, req, out)
            req = stages.next_request(c)
    if running is not None:
        running.end(("host", index))
    return c


def combine(cohorts: list[Cohort], n: int, k: int) -> list[Record]:
    """One record per stage over all n tasks, in stage order (tasks of a cohort that had no such
    stage: masked out), as a single cohort of all tasks would have recorded them."""
    stages = sorted({(r.turn, r.agent) for c in cohorts for r in c.records})
    out = []
    for turn, agent in stages:
        parts = [(c.rows, r) for c in cohorts for r in c.records if (r.turn, r.agent) == (turn, agent)]
        if len(parts) == 1 and len(parts[0][0]) == n:
            out.append(parts[0][1])
            continue
        width = max(r.out.tokens.shape[1] for _, r in parts)
        plen = np.zeros(n, np.int32)
        prompt = np.zeros((n, max(r.prompt.shape[1] for _, r in parts)), np.int32)
        tokens, logps = np.zeros((n * k, width), np.int32), np.zeros((n * k, width), np.float32)
        lengths, texts = np.zeros(n * k, np.int32), [""] * (n * k)
        arrays = {name: np.zeros((n, k), np.float32) for name in ("reward", "local", "team", "counterfactual")}
        parsed_as, mask, best = np.full((n, k), "", object), np.zeros((n, k), bool), np.zeros(n, np.int64)
        reward_parts = np.full((n, k), None, object)
        for rows, r in parts:
            dest = (rows[:, None] * k + np.arange(k)).ravel()
            prompt[rows, :r.prompt.shape[1]], plen[rows] = r.prompt, r.prompt_len
            tokens[dest, :r.out.tokens.shape[1]] = r.out.tokens
            logps[dest, :r.out.tokens.shape[1]] = r.out.logprobs
            lengths[dest] = r.out.lengths
            for d, text in zip(dest, r.out.texts):
                texts[d] = text
            for name in arrays:
                arrays[name][rows] = getattr(r, name)
            parsed_as[rows], mask[rows], best[rows] = r.parsed_as, r.mask, r.best
            if r.reward_parts is not None:
                reward_parts[rows] = r.reward_parts
        out.append(Record(turn, agent, prompt, plen, SampleOut(tokens, lengths, logps, texts), arrays["reward"],
                          arrays["local"], arrays["team"], parsed_as, mask, best, parts[0][1].version,
                          reward_parts, arrays["counterfactual"]))
    return out
