"""Writes the arithmetic data sets (deterministic: rerunning rewrites the same files,
`python envs/data/arithmetic/make.py`):

- train.jsonl, test.jsonl: two-digit additions "What is a + b?" (a, b in 10..49), {"prompt", "answer"}
  rows for a one-agent prompt-and-reward task. The 64 test pairs are drawn first and no training row
  uses them (in either order), so held-out accuracy is measured on sums the model never trained on.
- expressions_train.jsonl, expressions_test.jsonl: "Compute a + b + c." and "Compute a * b."
  (`expressions`), {"problem", "answer"} rows for the math workflow (a reasoner and a tool agent that
  writes Python): mental arithmetic a small model often gets wrong and a one-line program gets right.
  The test rows are drawn first; no training row has a test row's numbers.
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = "What is {a} + {b}? Reply with just the number."


def rows(pairs):
    return [{"prompt": PROMPT.format(a=a, b=b), "answer": a + b} for a, b in pairs]


def expressions(n_train=512, n_test=64, seed=0, out=HERE):
    """Half "Compute a + b + c." (a, b, c in 10..49), half "Compute a * b." (a in 10..49, b in 3..9),
    interleaved; no training row has a test row's numbers (in any order)."""
    rng = random.Random(seed)
    sums = [(a, b, c) for a in range(10, 50) for b in range(10, 50) for c in range(10, 50)]
    products = [(a, b) for a in range(10, 50) for b in range(3, 10)]
    rng.shuffle(sums)
    rng.shuffle(products)
    row = {3: lambda t: {"problem": "Compute {} + {} + {}.".format(*t), "answer": str(sum(t))},
           2: lambda t: {"problem": "Compute {} * {}.".format(*t), "answer": str(t[0] * t[1])}}
    half = n_test // 2
    test = [t for pair in zip(sums[:half], products[:half]) for t in pair]
    held = {tuple(sorted(t)) for t in test}
    fresh = lambda ts: [t for t in ts if tuple(sorted(t)) not in held]  # noqa: E731
    train = [t for pair in zip(fresh(sums[half:]), fresh(products[half:])) for t in pair][:n_train]
    for name, split in (("expressions_train", train), ("expressions_test", test)):
        with open(os.path.join(out, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(row[len(t)](t)) + "\n" for t in split)


def main(n_train=512, n_test=64, seed=0, out=HERE):
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10, 50) for b in range(10, 50)]
    rng.shuffle(pairs)
    test = pairs[:n_test]
    held = {frozenset(p) for p in test}
    train = [p for p in pairs[n_test:] if frozenset(p) not in held][:n_train]
    for name, split in (("train", train), ("test", test)):
        with open(os.path.join(out, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows(split))
    expressions(n_train, n_test, seed, out)


if __name__ == "__main__":
    main()
