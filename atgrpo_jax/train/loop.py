"""The training loop: steps, evaluation, metrics, checkpoints; resumes where a run stopped.

A workdir holds one run. Resuming checks the config against the run's own config.json:
only the keys of `config.RESUMABLE` (how long, how often, where) may change, unless
`allow_config_change` (then the old config.json is kept as config.step<N>.json).
"""
from __future__ import annotations

import json
import time

import jax

from atgrpo_jax.train import checkpoint, setup
from atgrpo_jax.train import workdir as wd
from atgrpo_jax.train.config import RESUMABLE, ConfigError, changed_keys, from_saved
from atgrpo_jax.train.validate import resolve
from atgrpo_jax.train.episodes import as_markdown, training_records
from atgrpo_jax.train.metrics import EPISODES_FILE, MetricsWriter
from atgrpo_jax.train.progress import ProgressBar
from atgrpo_jax.trace import Tracer
from atgrpo_jax.train.step import (evaluation, evaluation_splits, policy_states, rollout_step, set_policy_states,
                                   train_step)


def check_resume(config, workdir: str, allow_config_change: bool) -> dict:
    """The keys in which `config` (resolved) differs from the run's config.json; an error if any
    of them may not change on a resume."""
    saved = wd.saved_config(workdir)
    if saved is None:
        return {}
    before = resolve(from_saved(saved), weights=False)
    changed = changed_keys(before, config)
    fixed = {k: v for k, v in changed.items() if not k.startswith(RESUMABLE)}
    if fixed and not allow_config_change:
        shown = "; ".join(f"config.{k}: {a!r} in the run, {b!r} now" for k, (a, b) in fixed.items())
        raise ConfigError(f"{workdir} holds a run with another config ({shown}). Resume with the run's config, "
                          "use a new --workdir, or pass --allow_config_change to continue with this one")
    return changed


def pool_busy(tracer: Tracer, run, seconds: float) -> dict:
    """The fraction of the step each pool (policy) spent sampling or updating, and the host workers stepping."""
    out = {f"pool_busy/{p.name}": tracer.busy_seconds(f"pool {p.name}") / max(seconds, 1e-9) for p in run.policies}
    out["host_busy"] = tracer.busy_seconds("host") / max(seconds, 1e-9)
    return out


def run_training(config, workdir: str, *, allow_config_change: bool = False) -> dict:
    """Train (resuming from workdir's last complete checkpoint); returns the last metrics."""
    t = config.train
    resolve(config)  # every config error before anything is written or compiled
    wd.require_support(workdir, checkpoints=True)  # a gs:// workdir without its packages fails here
    wd.check_workdir(workdir)
    resumed = bool(wd.exists(wd.checkpoint_dir(workdir)))
    changed = check_resume(config, workdir, allow_config_change) if resumed else {}
    run = setup.build_run(config)
    lead = jax.process_index() == 0
    splits = evaluation_splits(run)
    best = "valid_success" if "valid" in splits else "eval_success"  # choose on validation, report test
    ckpt = checkpoint.Checkpointer(wd.checkpoint_dir(workdir), keep_last=t.keep_last, best_metric=best)
    latest = ckpt.latest_step()
    if lead:
        wd.write_config(config, workdir, keep_as=f"config.step{latest}.json" if changed and latest else "")
    start = 0
    if latest is not None:
        states, meta = ckpt.restore(latest, target=policy_states(run))
        set_policy_states(run, states)
        start = int(meta["step"])
        if lead and changed:
            print(f"resuming at step {start} with changed settings: "
                  + ", ".join(f"{k}={b!r} (was {a!r})" for k, (a, b) in changed.items()), flush=True)
    writer = MetricsWriter(workdir, enabled=lead, resume_step=start)
    bar = ProgressBar(t.steps, enabled=lead, start_step=start)
    names = [a.name for a in run.workflow.agents]
    began = time.time()
    last: dict = {}
    step = start

    def log_episodes(step):
        def write(samples, episodes, adv):
            records = training_records(step, samples, episodes, adv, names, run.tokenizer, t.log_episodes_tasks)
            writer.write_rows(EPISODES_FILE, records)
            if records:
                writer.write_text(step, "episodes", as_markdown(records[0]))
        return write if t.log_episodes_every and step % t.log_episodes_every == 0 else None

    stale = bool(config.system.staleness)
    ahead = {}  # staleness 1: the next step's rollout, made while this step's update ran

    def next_rollout(step, tracer):
        def go():  # runs while this step's updates are on the devices, with the weights from before them
            ahead["rollout"] = rollout_step(run, step + 1, tracer, stale=True)
        return go if stale and step < t.steps else None

    try:
        if start == 0 and t.eval_every:
            last, _ = evaluation(run, splits, t.eval_tasks, t.eval_k)
            writer.write(0, dict(last, time_s=0.0))
            if lead:
                print(f"step 0 (before training): held-out success {last['eval_success']:.1%}", flush=True)
        for step in range(start + 1, t.steps + 1):
            tracer = Tracer()
            step_began = time.perf_counter()
            metrics = train_step(run, step, on_rollout=log_episodes(step), tracer=tracer, ro=ahead.pop("rollout", None),
                                 then=next_rollout(step, tracer))
            for p in run.policies:
                p.behavior = None
            metrics.update(pool_busy(tracer, run, time.perf_counter() - step_began))
            if lead and config.system.trace_every and step % config.system.trace_every == 0:
                tracer.write(wd.join(workdir, "trace", f"step_{step}.json"))
            out_of_time = bool(t.time_budget_s) and time.time() - began > t.time_budget_s
            evaluating = t.eval_every and (step % t.eval_every == 0 or step == t.steps or out_of_time)
            if evaluating:
                metrics.update(evaluation(run, splits, t.eval_tasks, t.eval_k)[0])
            metrics["time_s"] = time.time() - began
            if evaluating or step % t.log_every == 0 or step == t.steps or out_of_time:
                writer.write(step, metrics)
            bar.update(step, metrics)
            if t.checkpoint_every and (step % t.checkpoint_every == 0 or step == t.steps or out_of_time):
                writer.sync()  # an object store then holds every row a resume from this checkpoint keeps
                ckpt.save(step, policy_states(run), meta={"step": step}, metrics=metrics)
            last = metrics
            if out_of_time:
                if lead:
                    print(f"time budget of {t.time_budget_s:.0f}s reached after step {step}", flush=True)
                break
        ckpt.close()
    finally:
        writer.close()  # an object-store workdir gets its last upload even after an error
    if lead:
        print(json.dumps({k: v for k, v in last.items() if k.startswith("eval")} | {"steps": step if t.steps else 0}))
    return last
