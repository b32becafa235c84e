"""The training loop: steps, evaluation, metrics, checkpoints; resumes where a run stopped.

A workdir holds one run. Resuming checks the config against the run's own config.json:
only the keys of `config.RESUMABLE` (how long, how often, where) may change, unless
`allow_config_change` (then the old config.json is kept as config.step<N>.json). It restores
the newest checkpoint that restores (older ones in turn), and writes nothing before that.

A run stops early, with one line and an exit code (cli.RunStopped), on SIGTERM/SIGINT (after
saving its last completed step, within train.preempt_deadline_s: guard.StopSignals), on divergence
(guard.skip_streaks), when a checkpoint cannot be saved (checkpoint.SaveError), and when a step's user
code fails or a stage hangs (system.stage_timeout_s): then too after saving the last completed step.
"""
from __future__ import annotations

import json
import sys
import time

from atgrpo_jax import cli, workdir as wd
from atgrpo_jax.envs.workflow import episodes_per_problem
from atgrpo_jax.trace import Tracer
from atgrpo_jax.train import guard
from atgrpo_jax.train.hooks import user_hooks
from atgrpo_jax.train.episodes import as_markdown, training_records
from atgrpo_jax.train.heldout import evaluation
from atgrpo_jax.train.hooks import Hook, StepInfo, run_hooks
from atgrpo_jax.train.metrics_files import EPISODES_FILE, last_logged
from atgrpo_jax.train.progress import say
from atgrpo_jax.train.setup import Run
from atgrpo_jax.train.start import Launch, Opened, check_before_writing, held, open_run
from atgrpo_jax.train.step import policy_states, train_step
from atgrpo_jax.errors import StageTimeout
from atgrpo_jax.train.stops import Saver, close_keeping, diverged_stop, ending_in_one_line, step_failed
from atgrpo_jax.train.validate import resolve


def pool_busy(tracer: Tracer, run: Run, seconds: float) -> dict:
    """The fraction of the step each pool (policy) spent sampling or updating, and the host workers stepping."""
    out = {f"pool_busy/{p.name}": tracer.busy_seconds(f"pool {p.name}") / max(seconds, 1e-9) for p in run.policies}
    out["host_busy"] = tracer.busy_seconds("host") / max(seconds, 1e-9)
    return out


def run_training(config, workdir: str, *, allow_config_change: bool = False,
                 fresh_if_unreadable: bool = False, print_result: bool = True, callbacks=(),
                 new_history: bool = False) -> dict:
    """Train (resuming from workdir's newest checkpoint that restores); returns the last metrics, and
    prints their evaluation part as a JSON line last (the command's result; print_result=False: the
    Python API, which returns it). callbacks: objects with any of TRL's `on_step_end`, `on_evaluate`,
    `on_save` methods, each called as method(step, metrics) on the lead process (hooks.user_hooks).

    Stops early with cli.RunStopped (one line, an exit code) on SIGTERM/SIGINT (after saving the
    last completed step), on divergence, and when a checkpoint cannot be saved. new_history: resume even
    when metrics.jsonl is missing or damaged, in a new file (history.check_history)."""
    config = resolve(config)  # every config error before anything is written or compiled
    check_before_writing(config, workdir)
    launch = Launch(workdir, allow_config_change, fresh_if_unreadable, new_history)
    with held(workdir, config.train.preempt_deadline_s) as stop:
        return _train(config, launch, stop, print_result, callbacks)


def _train(config, launch: Launch, stop, print_result: bool = True, callbacks=()) -> dict:
    t, workdir, lead = config.train, launch.workdir, launch.lead
    o = open_run(config, launch, stop)
    run, start, ckpt, writer, bar = o.run, o.start, o.ckpt, o.writer, o.bar
    began = time.time()
    last: dict = {}
    step = start
    health = guard.Health([p.name for p in run.policies], t.max_skipped_updates)
    prefetch = o.prefetch

    def contents(step):  # with staleness, the weights the rollouts in flight sampled with: a resume redoes them
        extra, behind = prefetch.checkpoint_extra() if prefetch is not None else (None, {})
        return policy_states(run), {"step": step, **behind}, extra

    saver = Saver(ckpt, writer, contents)
    stopped = lambda done: saver.stopped(stop, start, done, last, health.clean)  # noqa: E731
    with ending_in_one_line(ckpt, writer, bar, lambda: step):
        if stop.requested():
            raise stopped(start)
        if start == 0 and t.eval_every and t.eval_first:
            last = evaluate_before_training(o, writer, lead)
        if start and start >= t.steps:  # nothing left: the logged metrics, not an empty result
            last = last_logged(workdir)
            say(f"the run has already trained all {t.steps} steps (raise --config.train.steps to train on)", lead)
        hooks = step_hooks(o, saver, health, began, lead) + (user_hooks(callbacks, t.checkpoint_every) if lead else [])
        for step in range(start + 1, t.steps + 1):
            if stop.requested():
                raise stopped(step - 1)
            if step == start + 1:
                say(f"step {step}: the first step compiles what it runs (sampler buckets, the update); "
                    "later steps reuse it", lead)
            tracer = Tracer()
            step_began = time.perf_counter()
            held = saver.hold(step - 1)  # the last completed step, saved if this one fails
            try:
                with stop.abandonable():
                    metrics = train_step(run, step, on_rollout=episode_logger(o, step), tracer=tracer,
                                         prefetch=prefetch, abandon=stop.before_update)
            except guard.StepAbandoned:
                raise saver.abandoned(stop, start, step - 1, held, last, health.clean) from None
            except Exception as e:  # noqa: BLE001 - the user's reward, environment or workflow, a hung stage
                deadline = t.preempt_deadline_s if isinstance(e, StageTimeout) else None
                saved = saver.keep_held(step - 1, held, start, last, health.clean, deadline)
                failed = step_failed(e, step, saved, close_keeping(ckpt))
                if failed is None:
                    raise
                raise failed from None
            held = None  # (its arrays are the update's now)
            metrics.update(pool_busy(tracer, run, time.perf_counter() - step_began))
            no_signal = health.record(metrics)
            if no_signal and lead:
                print(no_signal, file=sys.stderr, flush=True)
            if lead and config.system.trace_every and step % config.system.trace_every == 0:
                tracer.write(wd.join(workdir, "trace", f"step_{step}.json"))
            out_of_time = bool(t.time_budget_s) and time.time() - began > t.time_budget_s
            run_hooks(hooks, StepInfo(step, metrics, step == t.steps or out_of_time, health.diverged,
                                      health.healthy(metrics)))
            last = metrics
            if out_of_time:
                if lead:
                    print(f"time budget of {t.time_budget_s:.0f}s reached after step {step}", flush=True)
                break
        ckpt.close()  # the last asynchronous save may fail here
        if health.skipped and step > start:
            report_skipped(ckpt.latest_step(), health.skipped, step, bool(t.checkpoint_every), lead)
    if lead and print_result:
        print(json.dumps({k: v for k, v in last.items() if k.startswith("eval")} | {"steps": step if t.steps else 0}))
    return last


def evaluate_before_training(o: Opened, writer, lead: bool) -> dict:
    """Step 0's row: the held-out success of the starting policies."""
    t = o.run.config.train
    say("evaluating before training (the first sampling call compiles the sampler)", lead)
    metrics, _ = evaluation(o.run, o.splits, t.eval_tasks, episodes_per_problem(o.run.workflow, t.eval_k))
    writer.write(0, dict(metrics, time_s=0.0))
    if lead:
        print(f"step 0 (before training): held-out success {metrics['eval_success']:.1%}", flush=True)
    return metrics


def episode_logger(o: Opened, step: int):
    """What the rollout calls with a logged step's episodes (train.log_episodes_every), or None."""
    t, run = o.run.config.train, o.run
    if not (t.log_episodes_every and step % t.log_episodes_every == 0):
        return None

    def write(samples, episodes, adv):
        names = [a.name for a in run.workflow.agents]
        records = training_records(step, samples, episodes, adv, names, run.tokenizer, t.log_episodes_tasks)
        o.writer.write_rows(EPISODES_FILE, records)
        if records:
            o.writer.write_text(step, "episodes", as_markdown(records[0]))
    return write


def step_hooks(o: Opened, saver: Saver, health: guard.Health, began: float, lead: bool) -> list[Hook]:
    """What runs after every step, in this order (hooks.py); `final`: the last step, or the time budget ran out."""
    t, run, writer, bar = o.run.config.train, o.run, o.writer, o.bar
    eval_k = episodes_per_problem(run.workflow, t.eval_k)

    def evaluate(info: StepInfo):
        info.metrics.update(evaluation(run, o.splits, t.eval_tasks, eval_k)[0])
        info.evaluated = True
        if lead:
            bar.note(f"step {info.step}: held-out success {info.metrics['eval_success']:.1%}")

    def diverge(info: StepInfo):
        raise diverged_stop(o.ckpt, health.streaks, info.step, t.max_skipped_updates)

    return [
        Hook(evaluate, t.eval_every, when=lambda i: bool(t.eval_every) and not i.diverged),
        Hook(lambda i: i.metrics.update(time_s=time.time() - began), every=1),
        Hook(lambda i: writer.write(i.step, i.metrics), t.log_every, also=lambda i: i.evaluated or i.diverged),
        Hook(lambda i: bar.update(i.step, i.metrics), every=1),
        Hook(diverge, 0, forced=False, also=lambda i: i.diverged),
        Hook(lambda i: saver.save(i.step, i.metrics), t.checkpoint_every,  # (healthy: guard.Health.healthy)
             when=lambda i: i.healthy and bool(t.checkpoint_every)),
    ]


def report_skipped(kept: int | None, skipped: int, step: int, checkpointing: bool, lead: bool) -> None:
    """A run that skipped updates says so at its end, and fails when it leaves no checkpoint at all
    (its weights diverged before any healthy step could be saved)."""
    what = f"{skipped} updates of this run were skipped (non-finite loss or gradient; {guard.DIVERGENCE_CAUSES})"
    if kept is None and checkpointing:
        raise cli.RunStopped(f"error: the run ended at step {step} without a checkpoint: {what}", 1)
    if lead:
        print(f"warning: {what}; the last checkpoint is step {kept}", flush=True)


