"""`python -m atgrpo_jax.bench sampler --lengths=longtail`: answers of long-tailed lengths.

Each row's length is drawn once from a lognormal (median `--new`/4, clipped to [1, --new]) and
forced on both sides: ours gets it as the row's `max_new_tokens` budget (no stop tokens);
`transformers` gets a logits processor that forbids EOS before the row's length and forces it
there. Both thus produce the same number of tokens per row. Reported: useful tokens/s of each
(the forced lengths summed, over wall time), their ratio, and the fraction of decode work spent on
rows that had already finished (ours: rows x steps over all decode segments, as the sampler
counts them; transformers: batch x longest, since `generate` keeps finished rows in the batch).
Timed alongside: our run with the rows' own caches at full width from the start (`grow_own=False`:
every step reads all `--new` slots), our run with `segment=0` (no dropping, the old sampler), our run with continuous
batching (`--slots` rows decode at once, a finished row's slot takes the next waiting row; default
B/2), and ours on the same number of tokens at one fixed length (every row useful/B tokens, the
remainder spread one each, all B rows at once): the long tail should cost little more per useful
token than equal lengths do.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from atgrpo_jax.bench.common import timed
from atgrpo_jax.sampling import generate

EOS = 1  # the token transformers is made to end with; ours stops on its budget instead


def longtail_lengths(batch: int, new: int, seed: int = 0, sigma: float = 1.0) -> np.ndarray:
    """[batch] lengths: lognormal with median new/4, clipped to [1, new]; one row always gets `new`
    (the tail reaches the budget, as long answers do)."""
    rng = np.random.RandomState(seed)
    lengths = np.clip(np.round(np.exp(rng.normal(np.log(new / 4), sigma, batch))), 1, new).astype(int)
    lengths[rng.randint(batch)] = new
    return lengths


def wasted_fraction(useful: int, row_steps: int) -> float:
    return 1.0 - useful / row_steps


def run_ours(model, prompts, lengths, repeats, segment, slots=None, grow_own=True):
    key = jax.random.key(0)
    gen = lambda: generate(model, prompts, max_new_tokens=[int(n) for n in lengths], key=key,  # noqa: E731
                           buckets=(prompts.shape[1],), temperature=1.0, segment=segment, slots=slots,
                           grow_own=grow_own)
    seconds = min(timed(gen, repeats=repeats, warmup=1))
    out = gen()
    assert (out.lengths == lengths).all(), "every row must produce exactly its forced length"
    return seconds, int(out.row_steps)


def forced_eos(lengths: np.ndarray, prompt_len: int):
    """A transformers logits processor that ends row b after exactly lengths[b] tokens."""
    import torch
    import transformers

    class ForcedLengths(transformers.LogitsProcessor):
        targets = {}  # per device, made once: the processor runs every step

        def __call__(self, input_ids, scores):
            target = self.targets.setdefault(scores.device, torch.tensor(lengths, dtype=torch.long,
                                                                         device=scores.device))
            produced = input_ids.shape[1] - prompt_len  # tokens so far; this step makes one more
            last = produced == target - 1
            scores[:, EOS] = torch.where(last, scores[:, EOS], torch.tensor(float("-inf"), device=scores.device))
            scores[last] = torch.where(torch.arange(scores.shape[1], device=scores.device) == EOS, 0.0,
                                       float("-inf"))
            return scores

    return transformers.LogitsProcessorList([ForcedLengths()])


def run_torch(model, prompts, lengths, repeats, threads):
    import torch
    torch.set_num_threads(threads)
    ids = torch.tensor(prompts, dtype=torch.long)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
              pad_token_id=0, eos_token_id=EOS, use_cache=True, max_new_tokens=int(lengths.max()),
              logits_processor=forced_eos(lengths, prompts.shape[1]))
    with torch.no_grad():
        model.generate(ids, **kw)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(ids, **kw)
            times.append(time.perf_counter() - start)
    produced = out[:, prompts.shape[1]:]
    got = np.where((produced == EOS).any(1).numpy(), (produced == EOS).int().argmax(1).numpy() + 1, produced.shape[1])
    assert (got == lengths).all(), "transformers must end every row at its forced length"
    return min(times), produced.shape[0] * produced.shape[1]


def bench_longtail(cfg, ours_model, torch_model, args) -> dict:
    rng = np.random.RandomState(0)
    prompts = rng.randint(2, cfg.vocab_size, (args.batch, args.prompt)).astype(np.int32)
    lengths = longtail_lengths(args.batch, args.new)
    useful = int(lengths.sum())
    res = {"batch": args.batch, "prompt": args.prompt, "new": args.new, "useful_tokens": useful,
           "median_length": float(np.median(lengths)), "max_length": int(lengths.max())}
    even = np.full(args.batch, useful // args.batch) + (np.arange(args.batch) < useful % args.batch)
    slots = args.slots or max(1, args.batch // 2)
    res["slots"] = slots
    # (own caches grow wherever segments.run can grow them: not without segments, nor for late rows)
    for name, segment, rows, s, grow in (("ours", args.segment, lengths, None, True),
                                         ("ours_full_own", args.segment, lengths, None, False),
                                         ("ours_no_drop", 0, lengths, None, True),
                                         ("ours_continuous", args.segment, lengths, slots, True),
                                         ("ours_fixed_lengths", args.segment, even, None, True)):
        seconds, steps = run_ours(ours_model, prompts, rows, args.repeats, segment, s, grow)
        res[name] = {"seconds": seconds, "useful_tokens_per_s": useful / seconds,
                     "wasted_fraction": wasted_fraction(useful, steps)}
    if torch_model is not None:
        seconds, steps = run_torch(torch_model, prompts, lengths, args.repeats, args.threads)
        res["transformers"] = {"seconds": seconds, "useful_tokens_per_s": useful / seconds,
                               "wasted_fraction": wasted_fraction(useful, steps)}
        res["speedup"] = res["transformers"]["seconds"] / res["ours"]["seconds"]
        res["continuous_speedup"] = res["transformers"]["seconds"] / res["ours_continuous"]["seconds"]
    res["speedup_over_no_drop"] = res["ours_no_drop"]["seconds"] / res["ours"]["seconds"]
    res["speedup_over_full_own"] = res["ours_full_own"]["seconds"] / res["ours"]["seconds"]
    fixed = res["ours_fixed_lengths"]["useful_tokens_per_s"]
    res["vs_fixed_lengths"] = res["ours"]["useful_tokens_per_s"] / fixed
    res["continuous_vs_fixed_lengths"] = res["ours_continuous"]["useful_tokens_per_s"] / fixed
    return res


def report_longtail(name, r):
    print(f"== {name}: long-tail lengths, batch {r['batch']}, prompt {r['prompt']}, budget {r['new']} "
          f"(median {r['median_length']:.0f}, longest {r['max_length']}, {r['useful_tokens']} useful tokens)")
    for side in ("ours", "ours_full_own", "ours_no_drop", "ours_continuous", "ours_fixed_lengths", "transformers"):
        if side in r:
            s = r[side]
            print(f"  {side:<18} {s['useful_tokens_per_s']:8.1f} useful tok/s  {s['seconds']:6.2f} s  "
                  f"decode work on finished rows {100 * s['wasted_fraction']:.0f}%"
                  + (f"  ({r['slots']} slots)" if side == "ours_continuous" else ""))
    if "speedup" in r:
        print(f"  speedup vs transformers: {r['speedup']:.2f}x dropping rows, {r['continuous_speedup']:.2f}x continuous")
    print(f"  own caches grown as needed vs full width from the start: {r['speedup_over_full_own']:.2f}x")
    print(f"  dropping finished rows vs not: {r['speedup_over_no_drop']:.2f}x; long tail vs fixed lengths, "
          f"same tokens: {r['vs_fixed_lengths']:.2f}x dropping rows, {r['continuous_vs_fixed_lengths']:.2f}x "
          "continuous (useful tok/s)")
