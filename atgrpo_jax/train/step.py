"""One training step: rollout -> advantages -> filters (groups.py) -> per-policy update.

Every random choice of step s derives from (train.seed, s), so a run resumed
from the checkpoint of step s continues exactly as an uninterrupted one.

Its public API (`__all__`) is what the loop, evaluation, export and the benchmarks use: a step, its
rollout, and the update's parts (the benchmarks time them apart, against their baselines).
"""
from __future__ import annotations

import dataclasses
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from atgrpo_jax.algo.advantages import first_informative, group_filter
from atgrpo_jax.distributed import gather_objects, task_slice
from atgrpo_jax.envs.workflow import TRAIN_TASK_STRIDE
from atgrpo_jax.rollout.cohort import ReferenceTree
from atgrpo_jax.rollout.router import make_sample_fn
from atgrpo_jax.rollout.plain import PlainRollout
from atgrpo_jax.rollout.tree import InFlight, RolloutInputs, Schedule, TreeRollout, merge_rollouts
from atgrpo_jax.train.groups import Groups, batch_of, group_policies, score_groups, step_rewards
from atgrpo_jax.train.guard import StepAbandoned
from atgrpo_jax.train.pending import (dispatch_updates, finish_update, finish_updates, packed_minibatches,
                                     start_update)
from atgrpo_jax.train.setup import Run
from atgrpo_jax.trace import Tracer



__all__ = ["TRAIN_TASK_STRIDE", "begin_step_rollout", "end_rollout", "finish_update", "packed_minibatches",
           "policy_states", "rollout", "rollout_step", "sample_fn_for", "sampling_versions", "set_policy_states",
           "start_update", "train_step"]

def sample_fn_for(run: Run, temperature: float | None, max_prompts: int, evaluation: bool = False):
    """The rollout's sample function: each agent's sampling settings in training (or `evaluation`),
    `temperature`, if given, for all."""
    sampling = run.eval_sampling if evaluation else run.sampling
    return make_sample_fn(run.policies, run.policy_of_agent, run.tokenizer, sampling=sampling,
                          temperature=temperature, stop_ids=run.stop_ids,
                          prompt_buckets=run.config.rollout.prompt_buckets, max_tasks=max_prompts,
                          decode_slots=run.config.rollout.decode_slots)


def schedule_for(run: Run, tracer: Tracer | None, finished: queue.Queue | None = None) -> Schedule:
    """The rollout schedule of config.system: one pool (sampling worker) per policy."""
    s = run.config.system
    return Schedule(cohorts=s.cohorts if s.schedule == "async" else 1, asynchronous=s.schedule == "async",
                    host_workers=s.host_workers, pool_of_agent=tuple(int(p) for p in run.policy_of_agent),
                    pool_names=tuple(p.name for p in run.policies), tracer=tracer, stage_timeout_s=s.stage_timeout_s,
                    finished=finished)


def begin_rollout(run: Run, strategy: TreeRollout | PlainRollout, task_ids: np.ndarray, split: str,
                  temperature: float | None, key, tracer=None, evaluation: bool = False,
                  finished: queue.Queue | None = None) -> InFlight:
    """`strategy` (rollout.tree.TreeRollout or rollout.plain.PlainRollout) over this process's slice of
    task_ids, with the agents' training (or `evaluation`) sampling, not yet run (`end_rollout` after it
    has advanced).
    finished: where each policy's complete groups go early (`early_updates`)."""
    mine = task_slice(len(task_ids))
    r = run.config.rollout
    sample_fn = sample_fn_for(run, temperature, strategy.prompts(mine.stop - mine.start), evaluation)
    return strategy.begin(RolloutInputs(run.workflow, sample_fn, run.encode, task_ids[mine], split,
                                        max_turns=r.max_turns, alpha=run.config.algo.alpha, key=key,
                                        first_task=mine.start, schedule=schedule_for(run, tracer, finished)))


def end_rollout(run: Run, inflight: InFlight):
    """(samples, episodes) of a finished rollout, the slices of all processes merged (every process gets
    the whole step)."""
    return merge_rollouts(gather_objects(inflight.result()), len(run.workflow.agents))


def sampling_versions(run: Run, held: dict | None = None) -> tuple[int, ...]:
    """Per agent: the optimizer step of the weights its policy samples with (`held`: {policy name:
    train.policies.Snapshot} that sample instead of the current weights)."""
    steps = [held[p.name].step if held else int(p.state.step) for p in run.policies]
    return tuple(steps[int(p)] for p in run.policy_of_agent)


def rollout(run: Run, strategy, task_ids: np.ndarray, split: str, temperature: float | None, key, tracer=None,
            evaluation: bool = False, finished: queue.Queue | None = None):
    """`begin_rollout`, run in one go with the current weights, then `end_rollout`."""
    inflight = begin_rollout(run, strategy, task_ids, split, temperature, key, tracer, evaluation, finished)
    inflight.advance(versions=() if evaluation else sampling_versions(run))
    return end_rollout(run, inflight)


@dataclasses.dataclass
class Rollout:
    """A step's rollout and what the update needs from it."""

    step: int
    samples: Any
    episodes: Any
    seconds: float
    # system.staleness: made (in part) with weights from before earlier updates (Samples.version says
    # which); the importance ratio is then taken against the sampler's log-probs
    stale: bool = False


def begin_step_rollout(run: Run, step: int, tracer: Tracer | None = None, finished: queue.Queue | None = None,
                       round_: int = 0) -> InFlight:
    """The step's tree (or plain) rollout of its training tasks, with each agent's sampling settings, not
    yet run; round_ r > 0: the r-th extra rollout of dynamic sampling, of the next rollout.num_tasks tasks."""
    c, r = run.config, run.config.rollout
    key = jax.random.fold_in(jax.random.key(c.train.seed), step)
    if round_:
        key = jax.random.fold_in(key, round_)
    quirks = ReferenceTree(c.reference.shared_later_reward, c.reference.drop_after_done)  # the reference's engine
    strategy = TreeRollout(r.k, quirks) if r.tree else PlainRollout(r.k, r.plain_grouping)
    tasks = step * TRAIN_TASK_STRIDE + round_ * r.num_tasks + np.arange(r.num_tasks)
    return begin_rollout(run, strategy, tasks, "train", None, key, tracer, finished=finished)


def rollout_step(run: Run, step: int, tracer: Tracer | None = None, finished: queue.Queue | None = None,
                 round_: int = 0) -> Rollout:
    """`begin_step_rollout` run in one go with the current weights."""
    t0 = time.perf_counter()
    inflight = begin_step_rollout(run, step, tracer, finished, round_)
    inflight.advance(versions=sampling_versions(run))
    samples, episodes = end_rollout(run, inflight)
    return Rollout(step, samples, episodes, time.perf_counter() - t0)


def dynamic_sampling(run: Run, ro: Rollout, tracer: Tracer | None) -> tuple[Rollout, np.ndarray, dict]:
    """DAPO's dynamic sampling (algo.dynamic_sampling = N): while a policy has fewer groups with reward
    variance than its first rollout had groups, roll out rollout.num_tasks more tasks (at most N more
    times); returns (the rollouts merged, [G] the groups chosen: `first_informative`, its counts)."""
    c, policies = run.config, len(run.policies)
    scope = group_policies(run, ro.samples, ro.step)
    want = np.bincount(scope + 1, minlength=policies + 1)[1:]  # the first rollout's groups per policy
    rounds = 0
    while True:
        rewards, mask = step_rewards(run, ro.samples)
        informative = np.asarray(group_filter(rewards, mask, 0.0, True))
        have = np.bincount(scope[informative] + 1, minlength=policies + 1)[1:]
        if (have >= want).all() or rounds == c.algo.dynamic_sampling:
            break
        rounds += 1
        extra = rollout_step(run, ro.step, tracer, round_=rounds)
        samples, episodes = merge_rollouts([(ro.samples, ro.episodes), (extra.samples, extra.episodes)],
                                           len(run.workflow.agents))
        ro = Rollout(ro.step, samples, episodes, ro.seconds + extra.seconds, ro.stale)
        scope = group_policies(run, ro.samples, ro.step)
    chosen = first_informative(scope, informative, ro.samples.task, want)  # task ids grow with the round
    return ro, chosen, {"sampling_rounds": float(rounds + 1), "groups_wanted": float(want.sum()),
                        "groups_informative": float(informative.sum())}


def updates_may_start_early(run: Run) -> bool:
    """Whether a policy's update may start as soon as its groups are complete, while the other policies
    still sample (asynchronous steps with several policies): not where that could change the result:
    several processes (the others' samples arrive at the end), plain GRPO's groups, a low-mean filter
    ranking the whole batch, and dynamic sampling (which may roll out more)."""
    c = run.config
    return (c.system.schedule == "async" and len(run.policies) > 1 and c.rollout.tree
            and c.algo.filter_scope != "batch" and not c.algo.dynamic_sampling and jax.process_count() == 1)


def early_updates(run: Run, step: int, tracer: Tracer, finished: queue.Queue, abandon=None) -> dict:
    """The update side of an asynchronous step: reads each policy's complete groups from `finished`
    (tree.PoolGroups, until None) and starts that policy's update; returns {policy: its PendingUpdate, or
    None with nothing to train}. Once abandon() says a stop was asked for, no more update starts early
    (so the step can still be dropped)."""
    started = {}
    while (groups := finished.get()) is not None:
        if abandon is not None and abandon():
            continue
        policy, p = groups.pool, run.policies[groups.pool]
        with tracer.span("start update", track=f"pool {p.name}"):
            batch = batch_of(run, step, groups.samples, score_groups(run, groups.samples, step), policy)
            if batch is not None:
                p.set_lr(run.lr_schedules[policy](step))  # as train_step sets it for the others
            started[policy] = None if batch is None else start_update(run, p, batch)
    return started


def train_step(run: Run, step: int, on_rollout=None, tracer: Tracer | None = None, prefetch=None,
               abandon=None) -> dict:
    """One AT-GRPO step on every policy: rollout -> advantages and filters -> each policy's update;
    returns scalar metrics. on_rollout(samples, episodes, adv), if given, sees the step's rollout
    (episode logs). prefetch (train.prefetch.Prefetch, system.staleness = N): the step's rollout may
    have been made ahead, and parts of the next N steps' are made while this step's updates are on the
    devices, with the weights from before them. abandon(), if given, is asked once the rollout is done: True
    raises StepAbandoned and leaves every policy as it was (unless a policy's update began during the
    rollout: then the step is finished, the next safe point)."""
    tracer = tracer or Tracer()
    ahead = prefetch is not None and prefetch.covers(step + 1)  # the next rollout overlaps this update
    ro, started = prefetch.take(step) if prefetch is not None else None, {}
    if ro is None:  # started: policies whose update began during the rollout (early_updates)
        ro, started = rollout_with_early_updates(run, step, tracer, abandon, early=not ahead)
    if abandon is not None and not any(started.values()) and abandon():  # a stop was asked for: drop the
        raise StepAbandoned(step)  # step before its update starts
    chosen, refill = None, {}
    if run.config.algo.dynamic_sampling:
        ro, chosen, refill = dynamic_sampling(run, ro, tracer)
    samples, episodes = ro.samples, ro.episodes
    t1 = time.perf_counter()
    groups = score_groups(run, samples, step, chosen)
    batches = [None if p in started else batch_of(run, step, samples, groups, p) for p in range(len(run.policies))]
    if on_rollout is not None:
        on_rollout(samples, episodes, groups.adv)
    metrics = dict(rollout_metrics(run, ro, groups), **refill)
    if prefetch is not None:
        prefetch.start(step)  # the weights the rollouts made during this update sample with
    lrs = [float(lr_at(step)) for lr_at in run.lr_schedules]
    for i, p in enumerate(run.policies):  # the schedule moves once per training step (verl's), whatever the
        if i not in started:  # optimizer steps (an early update set it before it started)
            p.set_lr(lrs[i])
    todo = {i: b for i, b in enumerate(batches) if i not in started and b is not None}
    beside = (lambda: prefetch.make(tracer)) if ahead else None  # noqa: E731
    # a stale rollout: the ratio is taken against the sampler's log-probs, unless loss.is_correction asks
    # for the decoupled form (recomputed old log-probs, weighted by their importance over the sampler's)
    behavior = ro.stale and run.config.loss.is_correction == "none"
    pending = [p for p in dispatch_updates(run, todo, behavior, beside, started) if p is not None]
    tokens = sum(p.tokens for p in pending)
    for p, out in zip(pending, finish_updates(pending, tracer)):
        for k, v in out.items():
            metrics[f"{p.policy.name}/{k}" if len(run.policies) > 1 else k] = v
    metrics["samples"] = float(sum(p.samples for p in pending))  # every policy's, for per-step comparisons
    if len(set(lrs)) > 1:  # policy.role_optim: each policy's rate
        metrics.update({f"{p.name}/lr": lr for p, lr in zip(run.policies, lrs)})
    t2 = time.perf_counter()
    metrics.update(rollout_s=ro.seconds, update_s=t2 - t1,
                   lr=lrs[0], tokens_per_s=tokens / max(t2 - t1, 1e-9),
                   rollout_tokens_per_s=float(samples.response_len[samples.mask].sum()) / max(ro.seconds, 1e-9))
    return metrics


def rollout_with_early_updates(run: Run, step: int, tracer: Tracer, abandon, early: bool):
    """(the step's rollout, {policy: its PendingUpdate, or None}) with, if `early` (and
    `updates_may_start_early`), each policy's update started as soon as its groups are complete."""
    if not (early and updates_may_start_early(run)):
        return rollout_step(run, step, tracer), {}
    finished: queue.Queue = queue.Queue()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="early-update") as worker:
        update_side = worker.submit(early_updates, run, step, tracer, finished, abandon)
        try:
            ro = rollout_step(run, step, tracer, finished=finished)
        finally:
            finished.put(None)  # the rollout is over: the update side ends
    return ro, update_side.result()


def rollout_metrics(run: Run, ro: Rollout, groups: Groups) -> dict:
    """Success, turns, kept groups, advantages and rewards of the step's rollout; with a stale one, the
    optimizer steps between the weights that sampled it and those its update starts from."""
    samples, episodes, adv, keep = ro.samples, ro.episodes, groups.adv, groups.keep
    metrics = {"success": float(np.mean(episodes.success)), "turns": float(np.mean(episodes.turns)),
               "groups_kept": float(keep.sum()), "groups": float(len(keep)),
               "adv_abs_mean": float(np.abs(adv[samples.mask]).mean()) if samples.mask.any() else 0.0,
               "reward_mean": float(samples.reward[samples.mask].mean()) if samples.mask.any() else 0.0}
    for a, agent in enumerate(run.workflow.agents):
        metrics[f"reward/{agent.name}"] = float(episodes.agent_reward[a])
    metrics.update(completion_metrics(samples, [s.max_new_tokens for s in run.sampling], run.stop_ids,
                                      [a.name for a in run.workflow.agents]))
    kinds = getattr(run.workflow, "kinds", None)  # a mixture of workflows: the success of each
    if kinds is not None:  # (episodes are in task order: the step's ids, rounds of dynamic sampling after)
        kind = kinds(ro.step * TRAIN_TASK_STRIDE + np.arange(len(episodes.success)), "train")
        for i, name in enumerate(run.workflow.names):
            if (kind == i).any():
                metrics[f"success/{name}"] = float(np.mean(episodes.success[kind == i]))
    if ro.stale:
        metrics.update(staleness(run, samples))
    return metrics


def completion_metrics(samples, max_new_tokens: list[int], stop_ids, names: list[str]) -> dict:
    """What TRL users watch, of the live samples: completion lengths (mean, min, max), the share cut at
    their agent's max_new_tokens without a stop token (clipped_ratio), and the share of groups whose
    rewards do not differ (zero_std_groups: no signal). Per role ("ROLE/...") with several agents."""
    live = samples.mask
    if not live.any():
        return {}
    length = samples.response_len
    last = np.take_along_axis(samples.response, np.maximum(length - 1, 0)[..., None], axis=-1)[..., 0]
    budget = np.asarray(max_new_tokens)[samples.sample_agent]
    clipped = (length >= budget) & ~np.isin(last, np.asarray(stop_ids, np.int64))
    out = {}
    for a, name in [(None, "")] + ([(a, f"{n}/") for a, n in enumerate(names)] if len(names) > 1 else []):
        mine = live if a is None else live & (samples.sample_agent == a)
        if not mine.any():
            continue
        rewards = np.where(mine, samples.reward, np.nan)
        groups = mine.sum(axis=1) >= 2
        flat = groups & (np.nanmax(rewards, axis=1, initial=-np.inf) == np.nanmin(rewards, axis=1, initial=np.inf))
        out.update({f"{name}completion_len_mean": float(length[mine].mean()),
                    f"{name}completion_len_min": float(length[mine].min()),
                    f"{name}completion_len_max": float(length[mine].max()),
                    f"{name}clipped_ratio": float(clipped[mine].mean()),
                    f"{name}zero_std_groups": float(flat.sum() / max(groups.sum(), 1))})
    return out


def staleness(run: Run, samples) -> dict:
    """How many optimizer steps the weights that sampled the live samples are behind those their update
    starts from: the mean and the most (system.staleness N: up to N training steps' updates)."""
    live = samples.mask
    if not live.any():
        return {}
    now = np.array([int(p.state.step) for p in run.policies])[np.asarray(run.policy_of_agent)[samples.sample_agent]]
    lag = (now - samples.version)[live]
    return {"lag_updates": float(lag.mean()), "lag_updates_max": float(lag.max())}


def policy_states(run: Run) -> dict:
    return {p.name: p.state for p in run.policies}


def set_policy_states(run: Run, states: dict) -> None:
    for p in run.policies:
        p.load(states[p.name])
