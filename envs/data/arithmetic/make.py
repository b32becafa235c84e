"""Writes train.jsonl and test.jsonl: two-digit additions "What is a + b?" (a, b in 10..49).

The 64 test pairs are drawn first and no training row uses them (in either order), so held-out
accuracy is measured on sums the model never trained on. Deterministic: rerunning rewrites the same
files (`python envs/data/arithmetic/make.py`).
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = "What is {a} + {b}? Reply with just the number."


def rows(pairs):
    return [{"prompt": PROMPT.format(a=a, b=b), "answer": a + b} for a, b in pairs]


def main(n_train=512, n_test=64, seed=0):
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10, 50) for b in range(10, 50)]
    rng.shuffle(pairs)
    test = pairs[:n_test]
    held = {frozenset(p) for p in test}
    train = [p for p in pairs[n_test:] if frozenset(p) not in held][:n_train]
    for name, split in (("train", train), ("test", test)):
        with open(os.path.join(HERE, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows(split))


if __name__ == "__main__":
    main()
