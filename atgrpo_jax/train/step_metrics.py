"""A training step's metrics (train/step.py): of its rollout (success, turns, rewards, kept groups, what TRL
users watch, the staleness of a rollout made ahead) and of its updates (each policy's, the samples, the rates,
the clocks).
"""
from __future__ import annotations

import numpy as np

from atgrpo_jax.envs.workflow import TRAIN_TASK_STRIDE
from atgrpo_jax.train.groups import Groups
from atgrpo_jax.train.pending import PendingUpdate
from atgrpo_jax.train.setup import Run


def rollout_metrics(run: Run, ro, groups: Groups) -> dict:
    """Success, turns, kept groups, advantages and rewards of the step's rollout `ro` (train.step.Rollout);
    with a stale one, the optimizer steps between the weights that sampled it and those its update starts
    from (so they are taken before the update)."""
    samples, episodes, adv, keep = ro.samples, ro.episodes, groups.adv, groups.keep
    metrics = {"success": float(np.mean(episodes.success)), "turns": float(np.mean(episodes.turns)),
               "groups_kept": float(keep.sum()), "groups": float(len(keep)),
               "adv_abs_mean": float(np.abs(adv[samples.mask]).mean()) if samples.mask.any() else 0.0,
               "reward_mean": float(samples.reward[samples.mask].mean()) if samples.mask.any() else 0.0}
    for a, agent in enumerate(run.workflow.agents):
        metrics[f"reward/{agent.name}"] = float(episodes.agent_reward[a])
    metrics.update(completion_metrics(samples, [s.max_new_tokens for s in run.sampling], run.stop_ids,
                                      [a.name for a in run.workflow.agents]))
    metrics.update(reward_part_metrics(samples, [a.name for a in run.workflow.agents]))
    kinds = getattr(run.workflow, "kinds", None)  # a mixture of workflows: the success of each
    if kinds is not None:  # (episodes are in task order: the step's ids, rounds of dynamic sampling after)
        kind = kinds(ro.step * TRAIN_TASK_STRIDE + np.arange(len(episodes.success)), "train")
        for i, name in enumerate(run.workflow.names):
            if (kind == i).any():
                metrics[f"success/{name}"] = float(np.mean(episodes.success[kind == i]))
    if ro.stale:
        metrics.update(staleness(run, samples))
    return metrics


def reward_part_metrics(samples, names: list[str] = ()) -> dict:
    """Each reward part's mean and std over the live samples that have it (`reward_fn/NAME/mean`, `/std`: a
    prompt_reward task's functions, unweighted, as TRL logs `rewards/NAME/mean`); per role ("ROLE/...")
    with several agents."""
    out = {}
    for a, prefix in [(None, "")] + ([(a, f"{n}/") for a, n in enumerate(names)] if len(names) > 1 else []):
        mine = samples.mask if a is None else samples.mask & (samples.sample_agent == a)
        values: dict[str, list[float]] = {}
        for parts in samples.reward_parts[mine]:
            for name, value in (parts or {}).items():
                values.setdefault(name, []).append(value)
        for name, v in sorted(values.items()):
            out[f"{prefix}reward_fn/{name}/mean"], out[f"{prefix}reward_fn/{name}/std"] = (float(np.mean(v)),
                                                                                          float(np.std(v)))
    return out


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


def update_metrics(run: Run, ro, pending: list[PendingUpdate], outs: list[dict], lrs: list[float],
                   update_s: float) -> dict:
    """Of the step's updates (`pending`, their metrics `outs`): each policy's ("POLICY/..." with several),
    the samples trained on (every policy's, for per-step comparisons), each policy's rate where they differ
    (policy.role_optim), and the clocks of the rollout `ro` and of the update."""
    metrics = {}
    for p, out in zip(pending, outs):
        for k, v in out.items():
            metrics[f"{p.policy.name}/{k}" if len(run.policies) > 1 else k] = v
    metrics["samples"] = float(sum(p.samples for p in pending))
    if len(set(lrs)) > 1:
        metrics.update({f"{p.name}/lr": lr for p, lr in zip(run.policies, lrs)})
    samples, tokens = ro.samples, sum(p.tokens for p in pending)
    metrics.update(rollout_s=ro.seconds, update_s=update_s,
                   lr=lrs[0], tokens_per_s=tokens / max(update_s, 1e-9),
                   rollout_tokens_per_s=float(samples.response_len[samples.mask].sum()) / max(ro.seconds, 1e-9))
    return metrics
