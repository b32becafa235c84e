"""`python -m atgrpo_jax.bench e2e`: one whole AT-GRPO training step, ours vs the model work in PyTorch.

A step (as `train.step.train_step` does it): B tasks of a two-agent grid workflow;
tree rollout over T turns (per turn, per agent in turn order: K branches from one
state, each stepped and scored, the best one continues); group advantages; one
epoch of mini-batched clipped updates over every sample (no group filter).

- Ours: the trainer's pieces, built by `train.setup.build_run`: the sample function
  of `train.step.sample_fn_for` (jitted prefill once per prompt, K-branch decode in one
  `while_loop`) and `train.step.start_update` (jitted chunked log-probs and update).
- PyTorch: the same rollout driver (`rollout.tree.TreeRollout`), workflow, tokenizer,
  advantages and batching (`train.batch.policy_batch`, packed one sample per row), with `transformers`
  `Qwen3ForCausalLM.generate` as the sample function (K branches as K copies of each
  prompt, same max_new_tokens, temperature, stop tokens and vocabulary limit) and the
  eager update of `bench.torch_baseline` (full log_softmax, clipped token-mean,
  clip_grad_norm_, AdamW) on mini-batches of the same size, minus our static-shape
  padding (eager runs any shape for free).
Env stepping, prompt rendering, parsing and batching are the same Python code on both
sides, so the difference measured is the model work (sampling, log-probs, update)
plus its glue. Same weights (ours saved as an HF checkpoint and loaded by
transformers) and the same tasks at every step index.

Warm-up steps run on both sides first (JAX compiles there); then measured steps
alternate (ours, theirs, ours, ...) so load from other processes hits both alike.
Reported per side: best and median seconds per step, split into rollout (of which
`sample` is inside the sample function, the rest env, prompts and parsing) and
update (of which `model_update` is the policy update, the rest advantages and
batching); the CPU seconds of the step (user + system, all threads); tokens sampled
per second of rollout; ratios PyTorch / ours. JAX compilations during measured steps
are counted (non-zero: a shape was not warmed up). Contention from other processes
slows eager PyTorch (many small multi-threaded ops) far more than our compiled
programs, so a ratio measured on a loaded machine overstates the speedup: the load
average before and after the run is printed with the figures.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import resource
import tempfile
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from atgrpo_jax.algo.advantages import group_advantages, group_filter
from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.bench.common import KEEP_HEAP_HELP, machine_notes, print_json_last
from atgrpo_jax.bench.torch_baseline import hf_sample_fn, load_hf_model, torch_optimizer, torch_update_policy
from atgrpo_jax.models import get_preset
from atgrpo_jax.models.hf_io import save_pretrained
from atgrpo_jax.models.tokenizer import QWEN3_TOKENIZER_SIZE
from atgrpo_jax.rollout.tree import RolloutInputs, SampleFn, TreeRollout
from atgrpo_jax.bench.rows import as_rows
from atgrpo_jax.train.batch import fine_bucket, pack, policy_batch
from atgrpo_jax.train.config import base_config
from atgrpo_jax.train.validate import resolve
from atgrpo_jax.train.step import TRAIN_TASK_STRIDE, finish_update, packed_minibatches, sample_fn_for, start_update
from atgrpo_jax.train.setup import Run, build_run

TARGET_SPEEDUP = 3.0
PHASES = ("total", "rollout", "sample", "update", "model_update", "cpu")
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclasses.dataclass
class Side:
    """One implementation of the model work: a sample function and a per-policy update."""

    name: str
    sample_fn: SampleFn
    update: Callable[[int, dict], dict]  # (policy index, trainer batch) -> metrics, done on return


# ---------------------------------------------------------------- building both sides

def e2e_config(preset: str = "bench-small", workflow: str = "plan_path_direct", tokenizer: str = "auto",
               num_tasks: int = 8, k: int = 4, turns: int = 2, max_new_tokens: int = 32,
               temperature: float = 1.0, mini_batch: int = 16, max_prompt_len: int = 256, seed: int = 0):
    """The trainer config of the benchmarked step (shared policy, every sample updated).
    tokenizer "auto": Qwen3's if the preset's vocabulary holds it, else the character one."""
    if tokenizer == "auto":
        tokenizer = "qwen3" if get_preset(preset).vocab_size >= QWEN3_TOKENIZER_SIZE else "char"
    c = base_config()
    c.model.update(preset=preset, init_seed=seed)
    c.tokenizer = tokenizer
    c.mesh = dict(data=1, fsdp=1, tensor=1)
    c.env.workflow = workflow
    # 8 prompt lengths per octave (at most 12.5% padding in prefill), as the update's rows
    buckets = tuple(sorted({min(fine_bucket(n, 32), max_prompt_len) for n in range(1, max_prompt_len + 1)}))
    c.rollout.update(num_tasks=num_tasks, k=k, max_turns=turns, max_new_tokens=max_new_tokens,
                     temperature=temperature, max_prompt_len=max_prompt_len, prompt_buckets=buckets)
    c.algo.update(drop_low_mean_frac=0.0, drop_zero_variance=False)
    c.optim.update(mini_batch_size=mini_batch, epochs=1)
    c.train.seed = seed
    return resolve(c)


def our_side(run: Run, temperature: float | None = None, max_prompts: int | None = None) -> Side:
    """The trainer's sample function and update (`train.step`); max_prompts per sample call
    defaults to the step's B tasks."""
    t = run.config.rollout.temperature if temperature is None else temperature
    return Side("ours", sample_fn_for(run, t, max_prompts or run.config.rollout.num_tasks),
                lambda p, batch: finish_update(start_update(run, run.policies[p], batch)))


def torch_side(run: Run, temperature: float | None = None) -> Side:
    """generate and the eager update, on a copy of the run's (single, shared) policy weights."""
    if len(run.policies) != 1 or run.policies[0].is_lora:
        raise ValueError("the e2e benchmark compares one shared policy (one full model)")
    c = run.config
    loss_cfg = c.loss
    if loss_cfg != LossSettings(eps_low=loss_cfg.eps_low, eps_high=loss_cfg.eps_high, logprob_chunk=loss_cfg.logprob_chunk):
        raise ValueError("the PyTorch baseline implements the default loss only (clip, token-mean)")
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(run.policies[0].model(), tmp)
        model = load_hf_model(tmp).train()
    opt = torch_optimizer(model, c.optim)
    t = c.rollout.temperature if temperature is None else temperature
    sample = hf_sample_fn(model, run.tokenizer, max_new_tokens=c.rollout.max_new_tokens, temperature=t,
                          stop_ids=run.stop_ids, pad_id=run.tokenizer.pad_token_id or 0,
                          vocab_limit=len(run.tokenizer))  # as the trainer's sampler (rollout.router)

    def update(p: int, batch) -> dict:
        limit = len(run.tokenizer) if len(run.tokenizer) < run.policies[0].model().cfg.vocab_size else None
        rows = [as_rows(pack(mb, slots=1, share_prompts=False)) for mb in batch.minibatches(c.optim.mini_batch_size)]
        return torch_update_policy(model, opt, loss_cfg, rows, c.optim.grad_clip,
                                   limit, t if t > 0 else 1.0)  # the distribution sampled from, as ours

    return Side("pytorch", sample, update)


# ---------------------------------------------------------------- one step

def run_step(run: Run, side: Side, step: int) -> dict:
    """One training step with `side`'s model work on the tasks of step index `step`
    (the body of `train.step.train_step` on one process). Returns wall seconds per phase,
    the CPU seconds (user + system, all threads) the process spent, and counts."""
    c, r = run.config, run.config.rollout
    key = jax.random.fold_in(jax.random.key(c.train.seed), step)
    task_ids = step * TRAIN_TASK_STRIDE + np.arange(r.num_tasks)
    sample_s = [0.0]

    def timed_sample(*args):
        t = time.perf_counter()
        out = side.sample_fn(*args)
        sample_s[0] += time.perf_counter() - t
        return out

    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    samples, _ = TreeRollout(r.k).begin(RolloutInputs(run.workflow, timed_sample, run.encode, task_ids, "train",
                                                      max_turns=r.max_turns, alpha=c.algo.alpha, key=key)).run()
    t1 = time.perf_counter()
    rewards, mask = jnp.asarray(samples.reward), jnp.asarray(samples.mask)
    adv = np.asarray(group_advantages(rewards, mask, c.algo.advantage))
    keep = np.asarray(group_filter(rewards, mask, c.algo.drop_low_mean_frac, c.algo.drop_zero_variance,
                                   run.policy_of_agent[np.maximum(samples.agent, 0)]))
    rng = np.random.default_rng([c.train.seed, step])
    batches = [policy_batch(samples, adv, keep, run.policy_of_agent == p, c.optim.mini_batch_size, rng)
               for p in range(len(run.policies))]
    model_s, metrics = 0.0, {}
    for p, batch in enumerate(batches):
        if batch is not None:
            t = time.perf_counter()
            metrics = side.update(p, batch)
            model_s += time.perf_counter() - t
    t2, r2 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r2.ru_utime - r0.ru_utime) + (r2.ru_stime - r0.ru_stime)
    live = samples.mask
    real = [b for b in batches if b is not None]
    return {"total": t2 - t0, "rollout": t1 - t0, "sample": sample_s[0], "update": t2 - t1, "model_update": model_s,
            "cpu": cpu, "sampled_tokens": int(samples.response_len[live].sum()),
            "samples": int(live.sum()), "update_tokens": int(sum(sum(b.lengths()).sum() for b in real)),
            **packed_token_counts(run, batches),
            "loss": float(metrics.get("loss", np.nan)),
            "groups": [[int(samples.task[g]), int(samples.agent[g]), int(samples.turn[g]), int(samples.mask[g].sum())]
                       for g in range(samples.num_groups)]}


def packed_token_counts(run: Run, batches: list) -> dict:
    """Tokens our update runs the model on: each group's prompt once (real and padded)."""
    packed = [mb for p, b in enumerate(batches) if b is not None
              for mb in packed_minibatches(run, run.policies[p], b)]
    return {"update_packed_tokens": int(sum((mb.packed.segment >= 0).sum() for mb in packed)),
            "update_packed_padded_tokens": int(sum(mb.packed.segment.size for mb in packed))}


@contextlib.contextmanager
def count_compiles():
    """Seconds of every XLA compilation inside the block (a list that fills up)."""
    seen: list[float] = []

    def listener(event, duration, **_):
        if event == BACKEND_COMPILE_EVENT:
            seen.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


# ---------------------------------------------------------------- the benchmark

def summarize(steps: list[dict]) -> dict:
    """Best and median seconds per phase over measured steps, and tokens sampled per second."""
    out = {"steps": steps}
    for phase in PHASES:
        secs = [s[phase] for s in steps]
        out[phase] = {"best": min(secs), "median": float(np.median(secs)), "all": secs}
    out["sampled_tokens_per_step"] = float(np.mean([s["sampled_tokens"] for s in steps]))
    out["sampled_tokens_per_s"] = float(np.median([s["sampled_tokens"] / s["rollout"] for s in steps]))
    out["sampled_tokens_per_s_in_sampler"] = float(np.median([s["sampled_tokens"] / s["sample"] for s in steps]))
    return out


def bench(args) -> dict:
    config = e2e_config(args.preset, args.workflow, args.tokenizer, args.tasks, args.k, args.turns,
                        args.max_new_tokens, args.temperature, args.mini_batch, args.max_prompt_len, args.seed)
    import torch
    torch.set_num_threads(args.threads)
    t = time.perf_counter()
    run = build_run(config)
    sides = [our_side(run), torch_side(run)]
    setup_s = time.perf_counter() - t
    warm = {s.name: [] for s in sides}
    with count_compiles() as compiles:
        for step in range(args.warmup):
            for side in sides:
                warm[side.name].append(run_step(run, side, step)["total"])
    warm_compiles = len(compiles)
    measured = {s.name: [] for s in sides}
    with count_compiles() as compiles:
        for step in range(args.warmup, args.warmup + args.steps):  # alternating, same tasks per index
            for side in sides:
                measured[side.name].append(run_step(run, side, step))
    ours, theirs = summarize(measured["ours"]), summarize(measured["pytorch"])
    ratios = {f"{phase}_{how}": theirs[phase][how] / max(ours[phase][how], 1e-9)
              for phase in PHASES for how in ("best", "median")}
    cfg = get_preset(args.preset)
    return {"config": dict(preset=args.preset, params=cfg.num_params(), vocab=cfg.vocab_size,
                           tokenizer=config.tokenizer, workflow=args.workflow, tasks=args.tasks, k=args.k,
                           turns=args.turns, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           mini_batch=args.mini_batch, warmup=args.warmup, steps=args.steps,
                           torch_threads=args.threads),
            "setup_seconds": setup_s, "warmup_seconds": warm, "jax_compiles_in_warmup": warm_compiles,
            "jax_compiles_in_measured_steps": len(compiles), "ours": ours, "pytorch": theirs,
            "speedup": ratios["total_best"], "speedup_median": ratios["total_median"], "ratios": ratios}


def report(r: dict) -> None:
    c = r["config"]
    print(f"== e2e AT-GRPO step: {c['preset']} ({c['params'] / 1e6:.1f}M params, vocab {c['vocab']}, "
          f"{c['tokenizer']} tokenizer), {c['workflow']}, B={c['tasks']} K={c['k']} T={c['turns']}, "
          f"{c['max_new_tokens']} new tokens, temperature {c['temperature']}, mini-batch {c['mini_batch']}")
    o, p = r["ours"], r["pytorch"]
    last = o["steps"][-1]
    print(f"  samples/step {last['samples']} (both sides), sampled tokens/step ours "
          f"{o['sampled_tokens_per_step']:.0f} pytorch {p['sampled_tokens_per_step']:.0f}; update tokens/step: "
          f"pytorch {last['update_tokens']} (one row per sample), ours {last['update_packed_tokens']} "
          f"(a group's prompt once; {last['update_packed_padded_tokens']} with padding)")
    print(f"  {'seconds per step':28s} {'ours best':>10s} {'median':>8s} {'pytorch best':>13s} {'median':>8s} "
          f"{'ratio best':>11s} {'median':>7s}")
    labels = {"total": "step", "rollout": "rollout", "sample": "  in the sample function",
              "update": "advantages + update", "model_update": "  in the policy update",
              "cpu": "step CPU s (all threads)"}
    for phase, label in labels.items():
        print(f"  {label:28s} {o[phase]['best']:10.2f} {o[phase]['median']:8.2f} {p[phase]['best']:13.2f} "
              f"{p[phase]['median']:8.2f} {r['ratios'][phase + '_best']:10.2f}x "
              f"{r['ratios'][phase + '_median']:6.2f}x")
    print(f"  tokens sampled/s of rollout: ours {o['sampled_tokens_per_s']:.0f}, pytorch "
          f"{p['sampled_tokens_per_s']:.0f} (inside the sampler: {o['sampled_tokens_per_s_in_sampler']:.0f} vs "
          f"{p['sampled_tokens_per_s_in_sampler']:.0f})")
    ok = "meets" if r["speedup"] >= TARGET_SPEEDUP else "BELOW"
    warm = {side: ", ".join(f"{s:.1f}" for s in secs) for side, secs in r["warmup_seconds"].items()}
    print(f"  speedup (pytorch / ours) {r['speedup']:.2f}x best, {r['speedup_median']:.2f}x median ({ok} the "
          f"{TARGET_SPEEDUP}x target); warm-up steps ours {warm['ours']} s ({r['jax_compiles_in_warmup']} "
          f"compilations), pytorch {warm['pytorch']} s; compilations in measured steps: "
          f"{r['jax_compiles_in_measured_steps']}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m atgrpo_jax.bench e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="bench-small", help="model preset (random weights)")
    parser.add_argument("--workflow", default="plan_path_direct", help="a two-agent grid workflow")
    parser.add_argument("--tokenizer", default="auto", choices=("auto", "char", "qwen3"),
                        help="auto: qwen3 if the preset's vocabulary holds it, else char")
    parser.add_argument("--tasks", type=int, default=8, help="B tasks per step")
    parser.add_argument("-k", "--k", type=int, default=4, help="K branches per prompt")
    parser.add_argument("--turns", type=int, default=2, help="T turns")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--mini-batch", type=int, default=16, help="samples per update mini-batch")
    parser.add_argument("--max-prompt-len", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2,
                        help="warm-up steps per side (JAX compiles; the trainer's update compiles again on "
                             "its second call, as its scalar counters come back with another sharding)")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--json", action="store_true", help="print all figures as a JSON line last")
    parser.add_argument("--keep-heap", action="store_true", help=KEEP_HEAP_HELP)
    args = parser.parse_args(argv)
    if min(args.tasks, args.turns, args.max_new_tokens, args.mini_batch, args.steps) < 1 or args.k < 2 \
            or args.warmup < 0:
        parser.error("need --tasks, --turns, --max-new-tokens, --mini-batch, --steps >= 1, -k >= 2, --warmup >= 0")
    notes = machine_notes(args.keep_heap)
    print(f"machine: {notes} (shared machine: figures are comparable within this run only)")
    result = bench(args)
    result["load_average_1min_after"] = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    report(result)
    print(f"  load average (1 min) before {notes.get('load_average_1min')}, after "
          f"{result['load_average_1min_after']} on {notes['cpu_count']} cores")
    print_json_last({"benchmark": "e2e", "machine": notes, **result}, args.json)
    return 0
