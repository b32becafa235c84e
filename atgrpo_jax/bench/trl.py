"""`python -m atgrpo_jax.bench trl`: this project and TRL's `GRPOTrainer` on the same real model, side by side.

The same work on both sides: SmolLM2-135M-Instruct (or `--model`), the prompts and reward function of
configs/smollm2.py (two-digit sums; 1 for the bare sum, 0.5 for the sum as the last number), plain GRPO
with `--prompts` prompts x `--k` completions per step of at most `--max_new_tokens` tokens at
`--temperature`, group-normalised advantages, the clipped token-mean loss (TRL's "dapo") at epsilon 0.2,
no KL term, one update per step, AdamW at a constant `--lr` with gradient clipping at 1, in `--dtype`
(float32; or bfloat16 matmuls over float32 master weights on both sides), for `--steps` steps and each
of `--seeds` seeds (`SAME_WORK` lists every setting of both). Each side runs in a process of its own,
one after the other, on the whole machine; then this project's evaluator scores both sides' models
(this project's checkpoints and TRL's saved ones) on the same held-out sums, greedily, at the steps
of `--evals`.

Reported per side: seconds per step (median and min over the steps after the first, whose time is
this project's compilation and both sides' warm-up), sampled tokens per second of a step, peak RSS,
held-out accuracy at each evaluated step; `step_time_ratio` is TRL's median seconds per step over
this project's. Where the two cannot do the same work it says so in `DIFFERENCES`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import atgrpo_jax.configs
from atgrpo_jax.bench.common import machine_notes, print_json_last

CONFIG = os.path.join(os.path.dirname(atgrpo_jax.configs.__file__), "smollm2.py")  # a checkout's or installed
REWARD = "atgrpo_jax.configs.smollm2:reward"

# (setting, this project's config, TRL's GRPOConfig): both sides are given each one explicitly
SAME_WORK = (
    ("prompts per step x completions", "rollout.num_tasks=P, rollout.k=K", "per_device_train_batch_size=P*K, "
                                                                           "num_generations=K"),
    ("max completion length", "rollout.max_new_tokens", "max_completion_length"),
    ("temperature, no top-k/top-p", "rollout.temperature", "temperature, top_k=0, top_p=1"),
    ("advantages", "algo.advantage=grpo (group mean and std)", 'scale_rewards="group"'),
    ("loss", "loss.aggregation=token-mean, eps 0.2", 'loss_type="dapo", epsilon=0.2'),
    ("no KL, one update per step", "loss.kl_coef=0, optim.epochs=1, one mini-batch",
     "beta=0, num_iterations=1, steps_per_generation=1"),
    ("optimizer", "AdamW b1 0.9 b2 0.999, constant lr, no decay, clip 1", "the same, lr_scheduler_type=constant"),
    ("precision, memory", "float32, no remat; --dtype=bfloat16: model.param_dtype and compute_dtype bfloat16 over "
                          "float32 masters (optim.master_dtype)", "float32 (bf16=False), gradient_checkpointing=False; "
                          "--dtype=bfloat16: bf16=True (autocast over float32 weights)"),
)
DIFFERENCES = ("Both divide by a group's Bessel-corrected std, TRL after adding 1e-4 to it, this project 1e-6. "
               "TRL draws a step's prompts by its own shuffled sampler, this project by its task sampler: "
               "the same training set, in another order. With --dtype=bfloat16 each side runs its own mixed "
               "precision (this project: bfloat16 weights copied from the masters for sampling and the forward "
               "pass; TRL: torch autocast, where its own rules choose the ops in bfloat16); both sides' models "
               "are evaluated in float32.")


def steps_of_metrics(workdir: str) -> list[dict]:
    """This project's per-step seconds and sampled tokens, from the run's metrics.jsonl."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if line.strip()]
    out, last = [], 0.0
    for r in rows:
        if "rollout_s" not in r:
            continue
        out.append({"step": r["step"], "seconds": r["time_s"] - last,
                    "sampled_tokens": r["rollout_tokens_per_s"] * r["rollout_s"], "reward": r["reward_mean"]})
        last = r["time_s"]
    return out


def run_child(cmd: list[str], log: str) -> int:
    """Run cmd with its output in `log`; returns its peak RSS in bytes (os.wait4: that child's own)."""
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=os.getcwd())
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        tail = open(log).read()[-2000:]
        raise SystemExit(f"error: {' '.join(cmd[:4])} ... failed (exit {os.waitstatus_to_exitcode(status)}); "
                         f"the end of {log}:\n{tail}")
    return usage.ru_maxrss * 1024


def dtype_flags(dtype: str) -> list[str]:
    """This project's model in `dtype` (weights and matmul inputs)."""
    return [f"--config.model.param_dtype={dtype}", f"--config.model.compute_dtype={dtype}"]


def accuracy(out: str, checkpoint: str = "", hf_path: str = "") -> float:
    """Held-out greedy success by this project's evaluator, of a run's checkpoint or a model directory
    (with its own tokenizer, under configs/smollm2.py), in float32 as TRL's are (a run's masters are
    float32 whichever --dtype it trained in)."""
    model = ([f"--checkpoint={checkpoint}", *dtype_flags("float32")] if checkpoint else
             [f"--config={CONFIG}", f"--hf_path={hf_path}", f"--config.tokenizer={hf_path}", "--config.model.preset="])
    run_child([sys.executable, "-m", "atgrpo_jax.evaluate", *model, f"--out={out}"], out + ".log")
    with open(os.path.join(out, "eval.json")) as f:
        metrics = json.load(f)
    return float(metrics.get("eval_success", metrics.get("eval/test/avg@1")))


def summary(steps: list[dict], peak: int) -> dict:
    timed = [s["seconds"] for s in steps[1:]] or [s["seconds"] for s in steps]
    tokens = [s["sampled_tokens"] / s["seconds"] for s in steps[1:]] or [0.0]
    return {"median_step_s": statistics.median(timed), "min_step_s": min(timed),
            "sampled_tokens_per_s": statistics.median(tokens), "peak_rss_gb": peak / 1e9,
            "steps": steps}


def run_seed(args, seed: int, model_dir: str, common: dict) -> dict:
    root = os.path.join(args.workdir, f"seed{seed}")
    ours, theirs = os.path.join(root, "ours"), os.path.join(root, "trl")
    os.makedirs(theirs, exist_ok=True)
    evals = [s for s in args.evals if s > 0]
    every = math.gcd(*evals) if evals else args.steps
    flags = [f"--config.model.hf_path={model_dir}", "--config.model.preset=", f"--config.tokenizer={model_dir}",
             f"--config.rollout.num_tasks={args.prompts}", f"--config.rollout.k={args.k}",
             f"--config.rollout.max_new_tokens={args.max_new_tokens}", f"--config.rollout.temperature={args.temperature}",
             f"--config.optim.lr={args.lr}", f"--config.optim.mini_batch_size={args.prompts * args.k}"]
    if args.dtype == "bfloat16":
        flags += [*dtype_flags("bfloat16"), "--config.optim.master_dtype=float32"]
    peak = run_child([sys.executable, "-m", "atgrpo_jax.train", f"--config={CONFIG}", f"--workdir={ours}", *flags,
                      f"--config.train.steps={args.steps}", f"--config.train.seed={seed}", "--config.train.eval_every=0",
                      f"--config.train.checkpoint_every={every}", "--config.train.keep_last=0"], ours + ".log")
    result = {"ours": summary(steps_of_metrics(ours), peak)}
    spec = {**common, "model": model_dir, "out": theirs, "seed": seed, "save_steps": every}
    with open(os.path.join(root, "trl_spec.json"), "w") as f:
        json.dump(spec, f)
    peak = run_child([sys.executable, "-m", "atgrpo_jax.bench.trl_side", os.path.join(root, "trl_spec.json")],
                     theirs + ".log")
    with open(os.path.join(theirs, "trl_steps.json")) as f:
        trl_steps = json.load(f)
    result["trl"] = summary(trl_steps["steps"], peak)
    result["trl"]["version"] = trl_steps["trl"]
    for side, path in (("ours", ours), ("trl", theirs)):
        result[side]["accuracy"] = {
            s: accuracy(os.path.join(root, f"eval_{side}_{s}"), checkpoint=f"{ours}/checkpoints/{s}")
            if side == "ours" else accuracy(os.path.join(root, f"eval_{side}_{s}"), hf_path=f"{theirs}/checkpoint-{s}")
            for s in evals}
    return result


def plot_curves(result: dict, out_png: str) -> None:
    """Held-out accuracy of both sides against step and against the seconds of training up to it (the
    steps' own time: the evaluations between them are not counted), one line per side and seed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for side, style in (("ours", "-o"), ("trl", "--s")):
        for i, seed in enumerate(result["seeds"]):
            points = sorted((int(k), v) for k, v in seed[side]["accuracy"].items())
            if result.get("start_accuracy") is not None:
                points = [(0, result["start_accuracy"])] + points
            clock, total = {0: 0.0}, 0.0
            for s in seed[side]["steps"]:  # (steps 1, 2, ...: each side logs every step)
                total += s["seconds"]
                clock[s["step"]] = total
            label = f"{'this project' if side == 'ours' else 'TRL'} seed {i}"
            by_step.plot([p for p, _ in points], [a for _, a in points], style, label=label)
            by_time.plot([clock.get(p, float("nan")) / 60 for p, _ in points], [a for _, a in points], style, label=label)
    by_step.set_xlabel("training step")
    by_time.set_xlabel("minutes of training (evaluations not counted)")
    by_step.set_ylabel("held-out accuracy (greedy)")
    by_step.legend()
    fig.suptitle(f"{result['model']}: this project and TRL, the same work per step")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m atgrpo_jax.bench trl", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a Llama/Qwen checkpoint with a chat template")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--evals", default="", help="steps to evaluate at, e.g. 0,5,10 (default: 0, steps/2, steps)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="both sides: float32, or bfloat16 compute over float32 master weights")
    parser.add_argument("--workdir", default="runs/bench_trl")
    parser.add_argument("--json", action="store_true", help="print all figures as a JSON line last")
    args = parser.parse_args(argv)
    args.evals = sorted({int(s) for s in args.evals.split(",")} if args.evals else {0, args.steps // 2, args.steps})
    if args.steps < 2 or any(s < 0 or s > args.steps for s in args.evals):
        parser.error(f"--steps must be >= 2 and --evals within 0..{args.steps}")
    from atgrpo_jax.envs.text_state import DATA_DIR
    from atgrpo_jax.models.hub_ids import local_model_dir

    model_dir = local_model_dir(args.model)
    common = {"data": str(DATA_DIR / "arithmetic" / "train.jsonl"), "reward": REWARD, "steps": args.steps,
              "prompts_per_step": args.prompts, "k": args.k, "max_new_tokens": args.max_new_tokens,
              "temperature": args.temperature, "lr": args.lr, "dtype": args.dtype}
    notes, start = machine_notes(), time.time()
    start_accuracy = accuracy(os.path.join(args.workdir, "eval_start"), hf_path=model_dir) if 0 in args.evals else None
    seeds = [run_seed(args, seed, model_dir, common) for seed in range(args.seeds)]
    ratio = statistics.median(s["trl"]["median_step_s"] / s["ours"]["median_step_s"] for s in seeds)
    print(f"bench trl: {args.model}, {args.prompts} prompts x {args.k} completions of <= {args.max_new_tokens} "
          f"tokens, {args.dtype}, {args.steps} steps, {args.seeds} seed(s) ({time.time() - start:.0f} s)")
    print(f"{'':10}{'s/step (median, min)':>24}{'sampled tok/s':>15}{'peak RSS':>10}  held-out accuracy by step")
    for side in ("ours", "trl"):
        for i, s in enumerate(seeds):
            r = s[side]
            start = {0: start_accuracy} if start_accuracy is not None else {}
            acc = ", ".join(f"{k}: {v:.3f}" for k, v in (start | r["accuracy"]).items())
            print(f"{side + f' s{i}':10}{r['median_step_s']:>15.1f}, {r['min_step_s']:6.1f}"
                  f"{r['sampled_tokens_per_s']:>15.1f}{r['peak_rss_gb']:>8.2f} GB  {acc}")
    print(f"step_time_ratio (TRL / ours, median over seeds): {ratio:.2f}x")
    result = {"benchmark": "trl", "machine": notes, "model": args.model, "dtype": args.dtype, "steps": args.steps,
              "evals": args.evals, "start_accuracy": start_accuracy, "step_time_ratio": ratio,
              "same_work": [list(x) for x in SAME_WORK],
              "differences": DIFFERENCES, "seeds": seeds}
    with open(os.path.join(args.workdir, "bench_trl.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot_curves(json.loads(json.dumps(result)), os.path.join(args.workdir, "curves.png"))  # (str keys, as read back)
    print(f"figures: {args.workdir}/bench_trl.json, curves: {args.workdir}/curves.png")
    print_json_last(result, args.json)
    return 0
