"""`python -m atgrpo_jax.bench sampler`: our jitted sampler vs `transformers` generate.

Same random weights (ours saved as an HF checkpoint and loaded by
`AutoModelForCausalLM` as the model's own family), same prompts, same settings (do_sample, temperature 1,
no top-k/top-p, all `--new` tokens forced: no stop tokens, min_new_tokens),
one after the other in this process, each warmed up first. Prints tokens/s
of both, their ratio, the achieved FLOP/s as a fraction of a matmul peak in
`--dtype` (float32 by default) measured in the same run, the time to prefill and set up K=1 vs K
branches (the prefill itself does not depend on K; the setup copies the last
logits to the branches and makes their cache slots), and the per-step cost
of each token-selection mode. `--json` prints all figures as
the last line.

`--tunix` (auto: when `google-tunix` is installed; on: required) adds Tunix's
sampler on the same weights and prompts, timed after ours and transformers'
(fixed lengths only; tunix_baseline.py says how to install it beside this
environment, what is timed and how the weights are checked).

FLOPs count the useful work: 2 * (layer weights + LM head) per generated
token plus attention (4 * heads * head_dim per key), and for the prefill
every prompt token's layers and attention plus one LM head row.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import jax
import numpy as np
from flax import nnx

from atgrpo_jax.bench import tunix_baseline
from atgrpo_jax.bench.common import machine_notes, matmul_peak, print_json_last, timed
from atgrpo_jax.bench.longtail import bench_longtail, report_longtail
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.model_config import Qwen3Config
from atgrpo_jax.models.hf_io import save_pretrained
from atgrpo_jax.sampling import decode, generate, select


def layer_params(cfg: Qwen3Config) -> int:
    attn = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    return cfg.num_layers * (attn + 3 * cfg.hidden_size * cfg.intermediate_size)


def generate_flops(cfg: Qwen3Config, batch: int, prompt: int, new: int) -> float:
    """Useful FLOPs of prefilling `prompt` tokens and sampling `new` tokens, per batch."""
    attn_per_key = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim
    head = cfg.hidden_size * cfg.vocab_size
    prefill = prompt * 2 * layer_params(cfg) + attn_per_key * prompt * (prompt + 1) / 2 + 2 * head
    decode_steps = sum(2 * (layer_params(cfg) + head) + attn_per_key * (prompt + i) for i in range(1, new))
    return batch * (prefill + decode_steps)


def make_models(cfg: Qwen3Config, seed: int, tmp: str, torch_model: bool = True, torch_dtype: str | None = None):
    """Our model, saved as an HF checkpoint in `tmp`, and transformers' reading of it in `torch_dtype`
    (None: the model's; None without torch_model: --no-torch does not import torch)."""
    ours = nnx.jit(lambda: Qwen3(cfg, rngs=nnx.Rngs(seed)))()
    save_pretrained(ours, tmp)
    if not torch_model:
        return ours, None
    import torch
    import transformers
    dtype = getattr(torch, torch_dtype or cfg.compute_dtype)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=dtype).eval()
    return ours, theirs


def run_ours(model, prompts, new, repeats):
    key = jax.random.key(0)
    gen = lambda: generate(model, prompts, max_new_tokens=new, key=key,  # noqa: E731
                           buckets=(prompts.shape[1],), temperature=1.0)
    times = timed(gen, repeats=repeats, warmup=1)
    out = gen()
    assert out.lengths.min() == new, "every row must produce all new tokens"
    return min(times)


def run_torch(model, prompts, new, repeats, threads):
    import torch
    torch.set_num_threads(threads)
    ids = torch.tensor(prompts, dtype=torch.long)
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
              pad_token_id=0, eos_token_id=None, use_cache=True)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, **kw)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
            times.append(time.perf_counter() - start)
    assert out.shape[1] == prompts.shape[1] + new
    return min(times)


def prefill_times(model, prompts, new, branches, repeats):
    """Best seconds of the prefill (which does not depend on K) and of the setup that grows
    with K before decoding (copying the last logits to the K branches, their cache slots)."""
    graphdef, weights = nnx.split(model)
    mask = np.ones(prompts.shape, bool)
    prefill = lambda: decode.prefill_jit(graphdef, weights, prompts, mask)  # noqa: E731
    seconds = min(timed(prefill, repeats=repeats, warmup=1))
    pre = prefill()
    setup = {}
    for k in (1, branches):
        settings = decode.DecodeSettings(new, num_branches=k)
        fn = jax.jit(lambda pre, s=settings: decode.start(nnx.merge(graphdef, weights), pre, s))
        setup[k] = min(timed(fn, pre, repeats=repeats, warmup=1))
    return seconds, setup[1], setup[branches]


def selection_costs(batch, vocab, repeats):
    """Milliseconds per step of each selection mode on [batch, vocab] logits ~ N(0, scale^2).

    Scale 1 gives a flat distribution whose top-p nucleus holds many thousand
    tokens; scale 8 a sharp one with a small nucleus (the threshold search of
    sampling/nucleus.py needs a few passes over the row either way).
    """
    z = jax.random.normal(jax.random.key(0), (batch, vocab))
    u = jax.random.uniform(jax.random.key(1), (batch, 2))
    modes = {  # name: (scale, temperature, top_p, top_k)
        "greedy": (1.0, 0.0, 1.0, 0), "t=1": (1.0, 1.0, 1.0, 0), "t=0.7": (1.0, 0.7, 1.0, 0),
        "top_k=50": (1.0, 1.0, 1.0, 50), "top_p=0.95 flat": (1.0, 1.0, 0.95, 0),
        "top_p=0.95 sharp": (8.0, 1.0, 0.95, 0),
    }
    costs = {}
    for name, (scale, t, p, k) in modes.items():
        fn = jax.jit(lambda x, u, t, k=k, p=p: select(x, u, t, top_k=k, top_p=p))
        costs[name] = 1e3 * min(timed(fn, z * scale, u, t, repeats=max(repeats, 5), warmup=1))
    return costs


def bench_config(name, args, peak):
    cfg = get_preset(name, compute_dtype=args.dtype, param_dtype=args.dtype, decode_unroll=args.decode_unroll)
    rng = np.random.RandomState(0)
    prompts = rng.randint(1, cfg.vocab_size, (args.batch, args.prompt)).astype(np.int32)
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = make_models(cfg, 0, tmp, not args.no_torch, args.torch_dtype)
        tunix_model = tunix_baseline.load_model(cfg, tmp) if args.tunix_run else None
    tokens = args.batch * args.new
    flops = generate_flops(cfg, args.batch, args.prompt, args.new)
    res = {"config": name, "params": cfg.num_params(), "batch": args.batch, "prompt": args.prompt,
           "new": args.new, "dtype": args.dtype, "torch_dtype": args.torch_dtype or args.dtype,
           "decode_unroll": args.decode_unroll}
    ours_s = run_ours(ours, prompts, args.new, args.repeats)
    res.update(ours_seconds=ours_s, ours_tokens_per_s=tokens / ours_s,
               ours_flops_per_s=flops / ours_s, ours_fraction_of_peak=flops / ours_s / peak)
    prefill, setup1, setupk = prefill_times(ours, prompts, args.new, args.branches, args.repeats)
    res.update(prefill_seconds=prefill, branch_setup_k1_seconds=setup1, branch_setup_kN_seconds=setupk,
               branches=args.branches, prefill_ratio=(prefill + setupk) / (prefill + setup1))
    res["selection_ms"] = selection_costs(args.batch, cfg.vocab_size, args.repeats)
    if not args.no_torch:
        torch_s = run_torch(theirs, prompts, args.new, args.repeats, args.threads)
        res.update(torch_seconds=torch_s, torch_tokens_per_s=tokens / torch_s,
                   torch_flops_per_s=flops / torch_s, torch_fraction_of_peak=flops / torch_s / peak,
                   speedup=torch_s / ours_s)
    if tunix_model is not None:
        t = tunix_baseline.run(tunix_model, ours, prompts, args.new, args.repeats)
        res.update(tunix_seconds=t["seconds"], tunix_tokens_per_s=tokens / t["seconds"],
                   tunix_flops_per_s=flops / t["seconds"], tunix_fraction_of_peak=flops / t["seconds"] / peak,
                   tunix_tokenizer_seconds=t["tokenizer_seconds"], tunix_logit_max_diff=t["logit_max_diff"],
                   speedup_vs_tunix=t["seconds"] / ours_s)
    return res


def bench_longtail_config(name, args):
    cfg = get_preset(name, compute_dtype=args.dtype, param_dtype=args.dtype, decode_unroll=args.decode_unroll)
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = make_models(cfg, 0, tmp, not args.no_torch, args.torch_dtype)
    return bench_longtail(cfg, ours, theirs, args)


def report(r):
    print(f"== {r['config']} ({r['params'] / 1e6:.1f}M params), batch {r['batch']}, prompt {r['prompt']}, "
          f"{r['new']} new tokens; ours {r['dtype']} (decode_unroll {r['decode_unroll']}), "
          f"transformers {r['torch_dtype']}")
    print(f"  ours (jax)        {r['ours_tokens_per_s']:8.1f} tok/s  {r['ours_seconds']:6.2f} s  "
          f"{r['ours_flops_per_s'] / 1e9:6.1f} GFLOP/s = {100 * r['ours_fraction_of_peak']:.1f}% of peak")
    if "torch_seconds" in r:
        print(f"  transformers      {r['torch_tokens_per_s']:8.1f} tok/s  {r['torch_seconds']:6.2f} s  "
              f"{r['torch_flops_per_s'] / 1e9:6.1f} GFLOP/s = {100 * r['torch_fraction_of_peak']:.1f}% of peak")
        print(f"  speedup           {r['speedup']:8.2f}x")
    if "tunix_seconds" in r:
        print(f"  tunix sampler     {r['tunix_tokens_per_s']:8.1f} tok/s  {r['tunix_seconds']:6.2f} s  "
              f"{r['tunix_flops_per_s'] / 1e9:6.1f} GFLOP/s = {100 * r['tunix_fraction_of_peak']:.1f}% of peak "
              f"(id<->string adapter {1e3 * r['tunix_tokenizer_seconds']:.1f} ms of it; "
              f"logits within {r['tunix_logit_max_diff']:.1g} of ours)")
        print(f"  speedup vs tunix  {r['speedup_vs_tunix']:8.2f}x")
    k = r["branches"]
    print(f"  prefill {r['prefill_seconds']:.3f} s for any K; + branch setup K=1 "
          f"{r['branch_setup_k1_seconds']:.3f} s, K={k} {r['branch_setup_kN_seconds']:.3f} s; "
          f"prefill+setup K={k} / K=1 = {r['prefill_ratio']:.2f}")
    print("  selection per step: " + ", ".join(f"{k} {v:.1f} ms" for k, v in r["selection_ms"].items()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m atgrpo_jax.bench sampler", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="bench-small,bench-qwen-like",
                        help="comma-separated model presets")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--branches", type=int, default=8, help="K for the prefill comparison")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs after warm-up (best is kept)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--lengths", choices=("fixed", "longtail"), default="fixed",
                        help="fixed: every row makes --new tokens; longtail: forced lognormal lengths (longtail.py)")
    parser.add_argument("--segment", type=int, default=16, help="longtail: decode steps between row drops")
    parser.add_argument("--slots", type=int, default=0,
                        help="longtail: rows decoded at once in the continuous-batching run (0: batch/2)")
    parser.add_argument("--tunix", choices=("auto", "on", "off"), default="auto",
                        help="Tunix's sampler as a second baseline (fixed lengths): auto runs it when "
                             "google-tunix is installed, on requires it")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="weights and matmul inputs (bfloat16: the fast kind on a CPU with AMX, accumulated "
                             "in float32)")
    parser.add_argument("--torch-dtype", choices=("float32", "bfloat16"), default=None,
                        help="transformers' dtype (default: --dtype); float32 is its fastest on a CPU")
    parser.add_argument("--decode-unroll", type=int, default=0,
                        help="our model's decode_unroll: layers per loop iteration of a decode step (0: auto)")
    parser.add_argument("--json", action="store_true", help="print all figures as a JSON line last")
    args = parser.parse_args(argv)
    args.tunix_run = False
    if args.tunix == "on" and args.lengths != "fixed":
        parser.error("--tunix=on: the Tunix baseline runs with --lengths=fixed only")
    if args.tunix != "off" and args.lengths == "fixed":
        args.tunix_run = tunix_baseline.available()
        if not args.tunix_run:
            print(tunix_baseline.missing_message(), file=sys.stderr if args.tunix == "on" else sys.stdout)
            if args.tunix == "on":
                return 2

    notes = machine_notes()
    peak = matmul_peak(args.dtype)
    print(f"machine: {notes}; {args.dtype} matmul peak {peak / 1e9:.1f} GFLOP/s "
          "(shared machine: figures are comparable within this run only)")
    results = []
    for name in args.configs.split(","):
        if args.lengths == "longtail":
            results.append(dict(config=name.strip(), **bench_longtail_config(name.strip(), args)))
            report_longtail(name.strip(), results[-1])
            continue
        results.append(bench_config(name.strip(), args, peak))
        report(results[-1])
    print_json_last({"benchmark": "sampler", "machine": notes, "dtype": args.dtype, "matmul_peak_flops_per_s": peak,
                     "results": results}, args.json)
    return 0
