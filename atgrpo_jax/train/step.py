"""One training step: rollout -> advantages -> filters (groups.py) -> per-policy update.

Every random choice of step s derives from (train.seed, s), so a run resumed
from the checkpoint of step s continues exactly as an uninterrupted one.

Its public API (`__all__`) is what the loop, evaluation, export and the benchmarks use: a step, its
rollout, and the update's parts (the benchmarks time them apart, against their baselines).
"""
from __future__ import annotations

import dataclasses
import functools
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from atgrpo_jax.algo.advantages import first_informative, group_filter
from atgrpo_jax.algo.section import team_weights
from atgrpo_jax.distributed import gather_objects, task_slice
from atgrpo_jax.envs.workflow import TRAIN_TASK_STRIDE
from atgrpo_jax.rollout.cohort import ReferenceTree
from atgrpo_jax.rollout.router import make_sample_fn
from atgrpo_jax.rollout.plain import PlainRollout
from atgrpo_jax.rollout.tree import InFlight, RolloutInputs, Schedule, TreeRollout, merge_rollouts
from atgrpo_jax.train.groups import batch_of, group_policies, score_groups, step_rewards
from atgrpo_jax.train.guard import StepAbandoned
from atgrpo_jax.train.pending import (PendingUpdate, dispatch_updates, finish_update, finish_updates,
                                     packed_minibatches, start_update)
from atgrpo_jax.train.setup import Run
from atgrpo_jax.train.step_metrics import rollout_metrics, update_metrics
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
    r, a = run.config.rollout, run.config.algo
    sample_fn = sample_fn_for(run, temperature, strategy.prompts(mine.stop - mine.start), evaluation)
    return strategy.begin(RolloutInputs(run.workflow, sample_fn, run.encode, task_ids[mine], split,
                                        max_turns=r.max_turns, alpha=run.config.algo.alpha, key=key,
                                        team_weights=team_weights(a.team_weighting, r.max_turns, a.team_discount),
                                        first_task=mine.start, schedule=schedule_for(run, tracer, finished),
                                        counterfactual=not evaluation and a.counterfactual_for(
                                            x.name for x in run.workflow.agents)))


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
    times); returns (the rollouts merged, [G] the groups chosen: `first_informative`, its counts). Off
    (N = 0): the rollout as it is, every group a candidate."""
    c, policies = run.config, len(run.policies)
    if not c.algo.dynamic_sampling:
        return ro, None, {}
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
    ranking the whole batch, dynamic sampling (which may roll out more), and counterfactual credit (an
    agent's rewards wait for the later agents of each turn)."""
    c = run.config
    return (c.system.schedule == "async" and len(run.policies) > 1 and c.rollout.tree
            and c.algo.filter_scope != "batch" and not c.algo.dynamic_sampling and jax.process_count() == 1
            and not c.algo.counterfactual_for(x.name for x in run.workflow.agents))


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


@dataclasses.dataclass(frozen=True)
class StepRollout:
    """A step's rollout and the updates begun while it was made (`early_updates`)."""

    rollout: Rollout
    started: dict = dataclasses.field(default_factory=dict)  # {policy: its PendingUpdate, or None: nothing to train}

    @property
    def updating(self) -> bool:
        """Whether a policy's update is under way (the step can no longer be dropped)."""
        return any(self.started.values())


def train_step(run: Run, step: int, on_rollout=None, tracer: Tracer | None = None, prefetch=None,
               abandon=None) -> dict:
    """One AT-GRPO step on every policy: rollout -> rewards, advantages and filters -> each policy's batch ->
    its update; returns scalar metrics. on_rollout(samples, episodes, adv), if given, sees the step's rollout
    (episode logs). The options are stages beside it. prefetch (train.prefetch.Prefetch, system.staleness =
    N): the step's rollout may have been made ahead, and parts of the next N steps' are made while this
    step's updates are on the devices, with the weights from before them. abandon(), if given, is asked
    once the rollout is done: True raises StepAbandoned and leaves every policy as it was (unless a policy's
    update began during the rollout, `early_updates`: then the step is finished, the next safe point).
    algo.dynamic_sampling may roll out more tasks first."""
    tracer = tracer or Tracer()
    # the prefetch making the next rollouts beside this step's update, if any
    ahead = prefetch if prefetch is not None and prefetch.covers(step + 1) else None
    got = step_rollout(run, step, tracer, prefetch, abandon, early=ahead is None)
    ro, chosen, refill = dynamic_sampling(run, got.rollout, tracer)
    began = time.perf_counter()
    groups = score_groups(run, ro.samples, step, chosen)
    batches = {p: batch_of(run, step, ro.samples, groups, p) for p in range(len(run.policies)) if p not in got.started}
    if on_rollout is not None:
        on_rollout(ro.samples, ro.episodes, groups.adv)
    metrics = dict(rollout_metrics(run, ro, groups), **refill)  # (before the updates move the optimizer steps)
    if prefetch is not None:
        prefetch.start(step)  # the step updates: the weights from before it are kept for the rollouts made beside
    lrs = set_learning_rates(run, step, got.started)
    pending = dispatch_step_updates(run, ro, batches, got.started, tracer, ahead)
    outs = finish_updates(pending, tracer)
    return metrics | update_metrics(run, ro, pending, outs, lrs, time.perf_counter() - began)


def step_rollout(run: Run, step: int, tracer: Tracer, prefetch, abandon, early: bool) -> StepRollout:
    """The step's rollout: the one `prefetch` made ahead, if any, else one made now (if `early`, with the
    updates `rollout_with_early_updates` starts). Then abandon(), if given, is asked whether a stop was asked
    for: True raises StepAbandoned, before any update starts (unless one began during the rollout)."""
    made = prefetch.take(step) if prefetch is not None else None
    got = StepRollout(made) if made is not None else rollout_with_early_updates(run, step, tracer, abandon, early)
    if abandon is not None and not got.updating and abandon():
        raise StepAbandoned(step)
    return got


def rollout_with_early_updates(run: Run, step: int, tracer: Tracer, abandon, early: bool) -> StepRollout:
    """The step's rollout with, if `early` (and `updates_may_start_early`), each policy's update started as
    soon as its groups are complete."""
    if not (early and updates_may_start_early(run)):
        return StepRollout(rollout_step(run, step, tracer))
    finished: queue.Queue = queue.Queue()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="early-update") as worker:
        update_side = worker.submit(early_updates, run, step, tracer, finished, abandon)
        try:
            ro = rollout_step(run, step, tracer, finished=finished)
        finally:
            finished.put(None)  # the rollout is over: the update side ends
    return StepRollout(ro, update_side.result())


def set_learning_rates(run: Run, step: int, started: dict) -> list[float]:
    """Each policy's learning rate at `step`, set on those whose update is still to start (an early update
    set its own before it started). The schedule moves once per training step (verl's), whatever the
    optimizer steps."""
    lrs = [float(lr_at(step)) for lr_at in run.lr_schedules]
    for i, p in enumerate(run.policies):
        if i not in started:
            p.set_lr(lrs[i])
    return lrs


def dispatch_step_updates(run: Run, ro: Rollout, batches: dict, started: dict, tracer: Tracer,
                          ahead=None) -> list[PendingUpdate]:
    """Every policy's update with something to train, in policy order: those `started` early, the others'
    `batches` ({policy: PolicyBatch, or None}) dispatched now. A stale rollout's ratio is taken against the
    sampler's log-probs, unless loss.is_correction asks for the decoupled form (recomputed old log-probs,
    weighted by their importance over the sampler's). ahead (train.prefetch.Prefetch): the parts of the
    next rollouts due now are made while the updates run."""
    todo = {i: b for i, b in batches.items() if b is not None}
    behavior = ro.stale and run.config.loss.is_correction == "none"
    beside = None if ahead is None else functools.partial(ahead.make, tracer)
    return [p for p in dispatch_updates(run, todo, behavior, beside, started) if p is not None]


def policy_states(run: Run) -> dict:
    return {p.name: p.state for p in run.policies}


def set_policy_states(run: Run, states: dict) -> None:
    for p in run.policies:
        p.load(states[p.name])
