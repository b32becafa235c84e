"""The training loop: steps, evaluation, metrics, checkpoints; resumes where a run stopped."""
from __future__ import annotations

import json
import time

import jax

from atgrpo_jax.train import checkpoint, setup
from atgrpo_jax.train.metrics import MetricsWriter, ProgressBar
from atgrpo_jax.train.step import evaluate, policy_states, set_policy_states, train_step
from atgrpo_jax.train.workdir import prepare, require_support


def run_training(config, workdir: str) -> dict:
    """Train (resuming from workdir's last complete checkpoint); returns the last metrics."""
    t = config.train
    require_support(workdir, checkpoints=True)  # a gs:// workdir without its packages fails here, not after compiling
    run = setup.build_run(config)  # validates the config before anything compiles
    lead = jax.process_index() == 0
    ckpt = checkpoint.Checkpointer(prepare(config, workdir, lead=lead), keep_last=t.keep_last,
                        best_metric="eval_success")
    start = 0
    if ckpt.latest_step() is not None:
        states, meta = ckpt.restore(ckpt.latest_step(), target=policy_states(run))
        set_policy_states(run, states)
        start = int(meta["step"])
    writer = MetricsWriter(workdir, enabled=lead, resume_step=start)
    bar = ProgressBar(t.steps, enabled=lead)
    began = time.time()
    last: dict = {}
    step = start
    try:
        if start == 0 and t.eval_every:
            last = evaluate(run, t.eval_tasks, t.eval_k)
            writer.write(0, dict(last, time_s=0.0))
            if lead:
                print(f"step 0 (before training): held-out success {last['eval_success']:.1%}", flush=True)
        for step in range(start + 1, t.steps + 1):
            metrics = train_step(run, step)
            out_of_time = bool(t.time_budget_s) and time.time() - began > t.time_budget_s
            if t.eval_every and (step % t.eval_every == 0 or step == t.steps or out_of_time):
                metrics.update(evaluate(run, t.eval_tasks, t.eval_k))
            metrics["time_s"] = time.time() - began
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
