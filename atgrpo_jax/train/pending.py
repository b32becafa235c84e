"""A policy's update, dispatched to its devices and read back: the update side of a training step
(train/step.py). Packing, old and reference log-probs, the clipped updates of every mini-batch,
without waiting; then, once, their metrics.
"""
from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from atgrpo_jax.algo.loss import OWN_OLD_LOGP, is_weights
from atgrpo_jax.distributed import global_array, to_host
from atgrpo_jax.sharding import batch_shards
from atgrpo_jax.trace import Tracer
from atgrpo_jax.train.batch import Minibatch, PolicyBatch, length_bucket, pack
from atgrpo_jax.train.setup import Run


def packed_minibatches(run: Run, policy, batch: PolicyBatch) -> list[Minibatch]:
    """The policy batch's mini-batches in the update's packed layout (a group's prompt once)."""
    o, r = run.config.optim, run.config.rollout
    widest = length_bucket(r.max_prompt_len + run.config.rollout.longest_response())  # an unshared row's, as the planner's
    sample_ids = run.config.loss.ratio_level == "sequence"
    return [pack(mb, batch_shards(policy.mesh), o.share_prompts, r.k, widest, sample_ids)
            for mb in batch.minibatches(o.mini_batch_size)]


@dataclasses.dataclass
class PendingUpdate:
    """A policy's update, dispatched to its devices and not yet read back."""

    policy: Any
    metrics: list  # per mini-batch step: device arrays
    measures_gap: bool  # the old log-probs are the trainer's (not the sampler's): their gap to the sampler's is logged
    packed: list[Minibatch]
    samples: int
    tokens: int  # response tokens trained on (per epoch)


def start_update(run: Run, policy, batch: PolicyBatch, behavior_logprobs: bool = False,
                 paced: bool = False) -> PendingUpdate:
    """Old log-probs, then epochs x mini-batches of clipped updates, all dispatched to the policy's
    devices without waiting (so the updates of policies on other devices run at the same time).
    behavior_logprobs: the importance ratio is taken against the sampler's log-probs (a rollout
    made with older weights, system.staleness >= 1) instead of recomputed ones. paced: each
    mini-batch is dispatched once the one before has run, so that sampling calls dispatched
    meanwhile (the rollouts made beside the update) run between them, not after all of them."""
    o = run.config.optim
    # Each mini-batch is packed (a group's prompt once) and placed on the policy's mesh
    # once (every process holds the same batch); old and reference log-probs stay there.
    packed = packed_minibatches(run, policy, batch)
    placed = [mb.packed.placed(lambda x: global_array(x, policy.mesh)) for mb in packed]
    logprobs = lambda params, mbs: [policy.logprobs(mb, params) for mb in mbs]  # noqa: E731
    if behavior_logprobs:
        old = [global_array(mb.sampler_logp, policy.mesh) for mb in packed]
    elif first_step_is_on_policy(run):  # the first mini-batch's come out of its own update
        own = global_array(np.full(packed[0].packed.target.shape, OWN_OLD_LOGP, np.float32), policy.mesh)
        old = [own, *logprobs(policy.state.params, placed[1:])]
    else:
        old = logprobs(policy.state.params, placed)
    ref = run.ref_params.get(policy.name)  # the KL reference's log-probs, once per batch like old
    ref_logp = [None] * len(placed) if ref is None else logprobs(ref, placed)
    cfg = run.config.loss  # the sampler's mismatch with the trainer, corrected by choice
    weights = [None] * len(placed) if cfg.is_correction == "none" else \
        [is_weights(cfg, old_mb, global_array(mb.sampler_logp, policy.mesh)) for mb, old_mb in zip(packed, old)]
    metrics = []
    for _ in range(o.epochs):
        for mb, old_mb, ref_mb, is_mb in zip(placed, old, ref_logp, weights):
            metrics.append(policy.update(mb._replace(old_logp=old_mb, ref_logp=ref_mb, is_weight=is_mb)))
            if paced:
                jax.block_until_ready(metrics[-1])
    return PendingUpdate(policy, metrics, not behavior_logprobs, packed, batch.num_samples,
                         int(batch.lengths()[1].sum()))


def first_step_is_on_policy(run: Run) -> bool:
    """Whether a batch's first optimizer step takes its old log-probs from its own forward pass (as TRL
    does with one iteration), saving a forward pass of its mini-batch: its params are those the ratio is
    taken against, and nothing before the update needs them (no importance correction, no sequence-level
    ratio). Later mini-batches, and all of a second epoch, follow an optimizer step: theirs are computed
    before the first update."""
    cfg = run.config.loss
    return run.config.optim.epochs == 1 and cfg.is_correction == "none" and cfg.ratio_level == "token"


def finish_update(p: PendingUpdate) -> dict:
    """Wait for a dispatched update and read its metrics (once, at the end): their means, and the
    gap between the old log-probs (recomputed, or the first step's own) and the sampler's (0 when the
    two are one distribution)."""
    # the old log-probs each update took (the first epoch's hold every mini-batch's), sharded like the
    # batch: read with to_host, not with the metrics
    olds = [m.pop("old_logp") for m in p.metrics][:len(p.packed)]
    logs = jax.device_get(p.metrics)
    out = {k: float(np.mean([log[k] for log in logs])) for k in logs[0]}
    skipped = [bool(log["skipped"]) for log in logs]
    out["skipped"] = float(sum(skipped))
    out["updates"] = float(len(skipped))
    last_applied = max((i + 1 for i, s in enumerate(skipped) if not s), default=0)
    out["skipped_tail"] = float(len(skipped) - last_applied)  # skipped after the last applied update
    if p.measures_gap:
        scored = np.concatenate([mb.packed.scored.ravel() for mb in p.packed])
        old = np.concatenate([to_host(x).ravel() for x in olds])
        sampler = np.concatenate([mb.sampler_logp.ravel() for mb in p.packed])
        out["logprob_gap"] = float(np.abs(old - sampler)[scored].mean()) if scored.any() else 0.0
    out["samples"] = float(p.samples)
    return out


def finish_updates(pending: list[PendingUpdate], tracer: Tracer) -> list[dict]:
    """Wait for every policy's update at once, one thread each, so the timeline shows when each ended."""
    if not pending:  # every group was filtered out (e.g. no reward variance anywhere): nothing to update
        return []
    if len(pending) == 1:
        with tracer.span("update", track=f"pool {pending[0].policy.name}"):
            return [finish_update(pending[0])]

    def wait(p):
        with tracer.span("update", track=f"pool {p.policy.name}"):
            return finish_update(p)

    with ThreadPoolExecutor(max_workers=len(pending)) as threads:
        return list(threads.map(wait, pending))


def dispatch_updates(run: Run, batches: dict, stale: bool, beside=None, started: dict | None = None) -> list:
    """Every policy's PendingUpdate (None: nothing to train), policy by policy: those `started` early,
    the others' `batches` {policy: PolicyBatch} dispatched now. beside(), if given, runs while the
    updates do (the rollouts made ahead, train.prefetch): the updates are then paced a mini-batch at a
    time from threads, so that its sampling calls get onto the devices between their mini-batches (with
    one process: with several, the updates' collectives must be dispatched in one order everywhere, so
    they are dispatched at once, as without `beside`)."""
    started = started or {}
    if beside is None or jax.process_count() > 1:  # several processes: every one dispatches in the same order
        out = {i: start_update(run, run.policies[i], b, behavior_logprobs=stale) for i, b in batches.items()}
        if beside is not None:
            beside()
    else:
        with ThreadPoolExecutor(max_workers=max(1, len(batches)), thread_name_prefix="update") as threads:
            futures = {i: threads.submit(start_update, run, run.policies[i], b, stale, True)
                       for i, b in batches.items()}
            beside()
            out = {i: f.result() for i, f in futures.items()}
    return [started.get(i) if i in started else out.get(i) for i in range(len(run.policies))]
