"""A reward function is enough: the tiny demo model learns to add two digits with `prompt_reward`.

The task is a dataset (envs/data/sum_digits: "3+5=" prompts over the digits 0-6; 12 ordered pairs
of different digits are held out, "a+b=" while "b+a=" is trained on, and the other 37 pairs are the
training set) and the function `reward` below; no workflow code. Plain GRPO: one agent, one turn,
K answers per prompt, scored by `reward`; success = an exact sum (score 1).

    python -m atgrpo_jax.train --config=configs/sum_digits.py --workdir=runs/sum_digits
"""
import re

from atgrpo_jax.envs.text_state import DATA_DIR
from atgrpo_jax.train.config import base_config

ALPHABET = "0123456789+=\nuseraitn"  # the task's characters + the chat template's


def reward(completions, records):
    """1 for the exact sum; a wrong number earns less the further off it is; no number 0."""
    scores = []
    for text, record in zip(completions, records):
        number = re.match(r"\d+", text.strip())
        if number is None:
            scores.append(0.0)
        else:
            scores.append(1.0 if int(number.group()) == record["answer"] else
                          0.5 * max(0.0, 1 - abs(int(number.group()) - record["answer"]) / 10))
    return scores


def get_config():
    c = base_config()
    c.model.update(preset="demo-tiny", vocab_size=4 + len(ALPHABET))
    c.tokenizer = "char"
    c.char_alphabet = ALPHABET
    c.mesh = dict(data=1, fsdp=1, tensor=1)
    c.env.workflow = "prompt_reward"
    c.env.kwargs = dict(train_path=str(DATA_DIR / "sum_digits" / "train.jsonl"),
                        test_path=str(DATA_DIR / "sum_digits" / "test.jsonl"),
                        reward_fn="atgrpo_jax.configs.sum_digits:reward")
    c.regime = "plain_grpo"
    c.rollout.update(num_tasks=16, k=8, max_turns=1, temperature=1.0, max_prompt_len=32, prompt_buckets=(32,),
                     max_new_tokens=2, eval_temperature=0.0)
    c.algo.update(alpha=0.0, drop_low_mean_frac=0.0)
    c.optim.update(lr=3e-4, schedule="constant", warmup_steps=2, mini_batch_size=128, weight_decay=0.01)
    c.train.update(steps=200, eval_every=10, eval_tasks=12, checkpoint_every=50, keep_last=1)
    return c
