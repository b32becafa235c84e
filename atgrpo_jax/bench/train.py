"""`python -m atgrpo_jax.bench train`: our jitted GRPO update vs the same loss in PyTorch eager.

Same random weights (ours saved as an HF checkpoint and loaded by
`Qwen3ForCausalLM`), same batch (B rows of T tokens: a prompt, a response,
some right padding), same old log-probs and advantages.
- Ours: `train.update.make_update_fns` (the trainer's update: chunked log-probs,
  clipped token-mean loss, global-norm clip 1.0, AdamW wd 0.01 from
  `train.config.base_config().optim`), jitted with donated state.
- PyTorch (`bench.torch_baseline`): HF forward, full `log_softmax` over the vocabulary,
  gather, the same clipped surrogate token-mean, backward, `clip_grad_norm_(1.0)`,
  `torch.optim.AdamW(weight_decay=0.01)` (verl/TRL style).
Steps alternate (ours, theirs, ours, ...) after one warm-up each, so load from
other processes hits both sides alike; the best step of each is reported, with the
CPU seconds (user + system, all threads) the process spent in it, which depend less on
that load. On a VM much of the system time is page faults on freshly mapped buffers.
Tokens/s counts all B*T tokens of the update. FLOPs count useful work:
6 * (layer + LM head params) per token plus causal attention; our remat of the
LM-head chunks is not counted as useful.

Memory of the log-prob computation (final hidden states [B, T-1, D] and head
[D, V] in, loss of token log-probs, gradients of both out) is measured for
ours (chunked), a full-logits `log_softmax` JAX version and the PyTorch
baseline's code, two ways (`bench/peak_memory.py`): XLA's compiled temp bytes (JAX only;
inputs and outputs excluded) and the peak RSS rise over the call, sampled every
0.5 ms (all three; includes the [D, V] head gradient the call returns). The peak RSS
rise of one whole update step is reported for both sides too.
"""
from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.bench.common import KEEP_HEAP_HELP, machine_notes, matmul_peak, print_json_last
from atgrpo_jax.bench.peak_memory import PeakRSS, logprob_memory, rss_follows_live_buffers
from atgrpo_jax.bench.torch_baseline import load_hf_model, torch_batch, torch_optimizer, torch_step
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.model_config import Qwen3Config
from atgrpo_jax.models.hf_io import save_pretrained
from atgrpo_jax.train.config import base_config
from atgrpo_jax.bench.rows import rows_from_packed, rows_packed, rows_update
from atgrpo_jax.train.update import init_state, make_optimizer, make_update_fns

TARGET_SPEEDUP = 1.5
TARGET_MEMORY_RATIO = 4.0


# ---------------------------------------------------------------- figures

def update_flops(cfg: Qwen3Config, batch: int, seq: int) -> float:
    """Useful FLOPs of one forward+backward over [batch, seq] tokens (embedding lookup excluded)."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    layers = cfg.num_layers * (d * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * d * f)
    head = d * cfg.vocab_size
    causal_keys = seq * (seq + 1) / 2  # per row
    attention = 3 * 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * causal_keys
    return batch * (6 * (layers + head) * seq + attention)


# ---------------------------------------------------------------- inputs

def make_batch(vocab: int, batch: int, seq: int, seed: int = 0) -> dict:
    """Numpy tokens/valid/is_resp/adv: prompts of T/4..T/2 tokens, responses to the end
    minus up to T/8 right padding (row 0 unpadded)."""
    rng = np.random.RandomState(seed)
    tokens = rng.randint(1, vocab, (batch, seq)).astype(np.int32)
    prompt = rng.randint(seq // 4, seq // 2 + 1, batch)
    length = seq - rng.randint(0, seq // 8 + 1, batch)
    length[0] = seq
    col = np.arange(seq)[None]
    valid = col < length[:, None]
    tokens = np.where(valid, tokens, 0)
    is_resp = valid & (col >= prompt[:, None])
    adv = rng.randn(batch).astype(np.float32)
    return dict(tokens=tokens, valid=valid, is_resp=is_resp, adv=adv)


def make_models(cfg: Qwen3Config, seed: int, path: str):
    """Our random model, and the same weights loaded by `transformers` from `path`."""
    ours = nnx.jit(lambda: Qwen3(cfg, rngs=nnx.Rngs(seed)))()
    save_pretrained(ours, path)
    return ours, load_hf_model(path).train()


def optim_config(lr: float | None = None):
    optim = base_config().optim
    if lr is not None:
        optim.lr = lr
    return optim


# ---------------------------------------------------------------- the two updates

def bench_optimizer(optim):
    """The benchmarks' optimizer: the trainer's clipping and AdamW, its schedule over 1,000 steps."""
    return make_optimizer(optim, total_steps=1000)[0]


def jax_update(model, optim, loss_cfg: LossSettings, chunk: int):
    """(logprobs_fn, update_fn, state) of the trainer's update on `model`'s weights; update_fn takes rows."""
    graphdef, params = nnx.split(model)
    params = jax.tree.map(jnp.copy, params)  # the update donates its state
    tx = bench_optimizer(optim)
    logprobs_fn, update_fn = make_update_fns(graphdef, nnx.State({}), tx, loss_cfg, chunk)
    return logprobs_fn, rows_update(update_fn), init_state(params, tx)


def scoring_rows(tokens, valid):
    """Rows [N, L] as the Packed batch that scores every token given its prefix."""
    valid = jnp.asarray(valid)
    return rows_packed(jnp.asarray(tokens), valid, valid, None, jnp.zeros(len(valid)))


def rows_logprobs(logprobs_fn, params, tokens, valid) -> np.ndarray:
    """[N, L] log-prob of every token of the rows given its prefix (column 0: 0)."""
    return np.asarray(rows_from_packed(logprobs_fn(params, scoring_rows(tokens, valid))))


def old_logprobs(logprobs_fn, params, data: dict, noise: float = 0.3, seed: int = 1) -> np.ndarray:
    """Current log-probs plus noise on response tokens, so some ratios leave the clip range."""
    logp = rows_logprobs(logprobs_fn, params, data["tokens"], data["valid"])
    jitter = np.random.RandomState(seed).randn(*logp.shape).astype(np.float32)
    return np.where(data["is_resp"], logp + noise * jitter, 0.0).astype(np.float32)


def jax_batch(data: dict, old_logp: np.ndarray) -> tuple:
    """The rows for `train.batch.rows_update` (packed one sample per row inside the jitted update)."""
    return (jnp.asarray(data["tokens"]), jnp.asarray(data["valid"]), jnp.asarray(data["is_resp"]),
            jnp.asarray(old_logp), jnp.asarray(data["adv"]))


# ---------------------------------------------------------------- the benchmark

def wall_and_cpu_seconds(fn) -> tuple[float, float]:
    """Wall seconds of fn() and the CPU seconds (user + system, all threads) this process spent.
    CPU time is less sensitive than wall time to other processes sharing the cores."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def jax_step(sides: dict) -> dict:
    """One of our update steps on the live state, waited for; returns its metrics."""
    sides["state"], metrics = sides["update_fn"](sides["state"], sides["jb"])
    return jax.block_until_ready(metrics)


def bench_speed(name: str, args, peak: float) -> tuple[dict, dict]:
    """Timed, interleaved update steps of both sides; returns (figures, the live sides)."""
    import torch
    torch.set_num_threads(args.threads)
    cfg = get_preset(name)
    loss_cfg, optim = LossSettings(), optim_config()
    data = make_batch(cfg.vocab_size, args.batch, args.seq)
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = make_models(cfg, 0, tmp)
    logprobs_fn, update_fn, state = jax_update(ours, optim, loss_cfg, args.chunk)
    old = old_logprobs(logprobs_fn, state.params, data)
    tb, opt = torch_batch(data, old), torch_optimizer(theirs, optim)
    sides = dict(update_fn=update_fn, state=state, jb=jax_batch(data, old),
                 step_torch=lambda: torch_step(theirs, opt, loss_cfg, tb, optim.grad_clip))
    timed_sides = [("jax", lambda: jax_step(sides)), ("torch", sides["step_torch"])]
    if args.keep_elementwise:  # the same weights, keeping the layers' elementwise intermediates
        other = nnx.eval_shape(lambda: Qwen3(cfg.replace(recompute_elementwise=False), rngs=nnx.Rngs(0)))
        nnx.update(other, nnx.state(ours))
        _, keep_update, keep_state = jax_update(other, optim, loss_cfg, args.chunk)  # a state of its own
        keep = dict(update_fn=keep_update, state=keep_state, jb=sides["jb"])
        jax_step(keep)  # compiles
        timed_sides.append(("jax_keep", lambda: jax_step(keep)))
    del ours

    start = time.perf_counter()
    m = jax_step(sides)
    jax_first = (float(m["loss"]), float(m["grad_norm"]))
    compile_s = time.perf_counter() - start
    torch_first = sides["step_torch"]()  # warm-up on the same weights as our first step

    walls, cpus = {side: [] for side, _ in timed_sides}, {side: [] for side, _ in timed_sides}
    for _ in range(args.steps):  # interleaved: load from other processes hits all alike
        for side, step in timed_sides:
            w, c = wall_and_cpu_seconds(step)
            walls[side].append(w)
            cpus[side].append(c)
    (jax_s, torch_s), (jax_cpu, torch_cpu) = (walls["jax"], walls["torch"]), (cpus["jax"], cpus["torch"])

    tokens = args.batch * args.seq
    flops = update_flops(cfg, args.batch, args.seq)
    best_j, best_t = min(jax_s), min(torch_s)
    res = {"config": name, "params": cfg.num_params(), "batch": args.batch, "seq": args.seq,
           "tokens_per_step": tokens, "chunk": args.chunk, "steps": args.steps,
           "first_step_loss": {"jax": jax_first[0], "torch": torch_first[0]},
           "first_step_grad_norm": {"jax": jax_first[1], "torch": torch_first[1]},
           "jax_compile_and_first_step_seconds": compile_s,
           "jax_step_seconds": jax_s, "torch_step_seconds": torch_s,
           "jax_step_cpu_seconds": jax_cpu, "torch_step_cpu_seconds": torch_cpu,
           "speedup_cpu_time": min(torch_cpu) / min(jax_cpu),
           "jax_tokens_per_s": tokens / best_j, "torch_tokens_per_s": tokens / best_t,
           "speedup": best_t / best_j, "speedup_median": float(np.median(torch_s) / np.median(jax_s)),
           "useful_flops_per_step": flops,
           "jax_fraction_of_peak": flops / best_j / peak, "torch_fraction_of_peak": flops / best_t / peak}
    if "jax_keep" in walls:
        res.update(jax_keep_step_seconds=walls["jax_keep"], recompute_speedup=min(walls["jax_keep"]) / best_j)
    return res, sides


def bench_memory(res: dict, sides: dict, args) -> None:
    """Peak RSS rise of one more update step per side, and the log-prob memory table (into res)."""
    with PeakRSS() as rss:
        jax_step(sides)
    res["jax_step_peak_rss_rise_bytes"] = rss.peak
    with PeakRSS() as rss:
        sides["step_torch"]()
    res["torch_step_peak_rss_rise_bytes"] = rss.peak
    sides.clear()  # free both models before the log-prob measurements
    cfg = get_preset(res["config"])
    mem = logprob_memory(cfg, args.batch, args.seq, sorted({args.chunk, *args.sweep_chunks}))
    ours, full = mem[f"jax_chunk_{args.chunk}"], mem["jax_full_logits"]
    res.update(logprob_memory=mem,
               memory_ratio_xla_temp=full["xla_temp_bytes"] / max(ours["xla_temp_bytes"], 1),
               memory_ratio_rss_jax_full=full["peak_rss_rise_bytes"] / max(ours["peak_rss_rise_bytes"], 1),
               memory_ratio_rss_torch=mem["torch_full_logits"]["peak_rss_rise_bytes"]
               / max(ours["peak_rss_rise_bytes"], 1))


def report(r: dict, peak: float) -> None:
    gb = lambda x: f"{x / 1e9:6.2f} GB"  # noqa: E731
    print(f"== {r['config']} ({r['params'] / 1e6:.1f}M params), batch {r['batch']} x {r['seq']} tokens, "
          f"log-prob chunk {r['chunk']}")
    print(f"  first step, same weights: loss jax {r['first_step_loss']['jax']:.6f} "
          f"torch {r['first_step_loss']['torch']:.6f}; grad norm jax {r['first_step_grad_norm']['jax']:.6f} "
          f"torch {r['first_step_grad_norm']['torch']:.6f}")
    for side, label in (("jax", "ours (jax update)"), ("torch", "pytorch eager")):
        secs = r[f"{side}_step_seconds"]
        print(f"  {label:18s} {r[f'{side}_tokens_per_s']:8.1f} tok/s  best {min(secs):6.2f} s "
              f"(all: {', '.join(f'{s:.2f}' for s in secs)}; CPU {min(r[f'{side}_step_cpu_seconds']):.1f} s)  "
              f"{100 * r[f'{side}_fraction_of_peak']:5.1f}% of {peak / 1e9:.0f} GFLOP/s  "
              f"step RSS rise {gb(r[f'{side}_step_peak_rss_rise_bytes'])}")
    if "recompute_speedup" in r:
        print(f"  ours keeping the layers' elementwise intermediates: best {min(r['jax_keep_step_seconds']):6.2f} s "
              f"(all: {', '.join(f'{s:.2f}' for s in r['jax_keep_step_seconds'])}); recomputing them is "
              f"{r['recompute_speedup']:.2f}x")
    ok = "meets" if r["speedup"] >= TARGET_SPEEDUP else "BELOW"
    print(f"  speedup {r['speedup']:.2f}x best, {r['speedup_median']:.2f}x median, "
          f"{r['speedup_cpu_time']:.2f}x in CPU time ({ok} the "
          f"{TARGET_SPEEDUP}x target); jax compile + first step {r['jax_compile_and_first_step_seconds']:.1f} s")
    print("  log-prob forward+backward memory (XLA temp / peak RSS rise / seconds):")
    for name, m in r["logprob_memory"].items():
        temp = gb(m["xla_temp_bytes"]) if "xla_temp_bytes" in m else "    n/a  "
        print(f"    {name:18s} {temp}  {gb(m['peak_rss_rise_bytes'])}  {m['seconds']:6.2f} s")
    ok = "meets" if r["memory_ratio_xla_temp"] >= TARGET_MEMORY_RATIO else "BELOW"
    print(f"  full-logits / ours: XLA temp {r['memory_ratio_xla_temp']:.1f}x ({ok} the "
          f"{TARGET_MEMORY_RATIO}x target), RSS {r['memory_ratio_rss_jax_full']:.1f}x; "
          f"torch full-logits RSS / ours {r['memory_ratio_rss_torch']:.1f}x")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m atgrpo_jax.bench train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="bench-small,bench-qwen-like", help="comma-separated presets")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side after one warm-up")
    parser.add_argument("--chunk", type=int, default=base_config().loss.logprob_chunk,
                        help="log-prob chunk (rows) of our update (default: the trainer's)")
    parser.add_argument("--sweep-chunks", default="", help="more chunk sizes for the memory table")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--json", action="store_true", help="print all figures as a JSON line last")
    parser.add_argument("--keep-heap", action="store_true", help=KEEP_HEAP_HELP)
    parser.add_argument("--keep-elementwise", action="store_true",
                        help="also time our update with model.recompute_elementwise off (same weights, interleaved)")
    args = parser.parse_args(argv)
    args.sweep_chunks = [int(c) for c in args.sweep_chunks.split(",") if c]
    if args.seq < 8 or args.batch < 1 or args.steps < 1 or args.chunk < 1:
        parser.error("need --seq >= 8, --batch >= 1, --steps >= 1, --chunk >= 1")

    notes = machine_notes(args.keep_heap)
    peak = matmul_peak("float32")
    print(f"machine: {notes}; float32 matmul peak {peak / 1e9:.1f} GFLOP/s "
          "(shared machine: figures are comparable within this run only)")
    # All timings first, under the default allocator; then the memory figures.
    runs = [bench_speed(name.strip(), args, peak) for name in args.configs.split(",")]
    with rss_follows_live_buffers() as exact_rss:
        for res, sides in runs:
            bench_memory(res, sides, args)
    for res, _ in runs:
        report(res, peak)
    print_json_last({"benchmark": "train", "machine": notes, "matmul_peak_flops_per_s": peak,
                     "rss_follows_live_buffers": exact_rss, "results": [r for r, _ in runs]}, args.json)
    return 0
