"""TRL's side of `bench trl`: its `GRPOTrainer` on the same model, prompts, reward and settings, in a
process of its own (its peak memory is its own), timing every step and saving the model at the
steps the benchmark evaluates.

    python -m atgrpo_jax.bench.trl_side SPEC.json

SPEC.json (written by bench/trl.py): model (a Hugging Face directory), data (a jsonl file of
{"prompt", "answer"} rows), reward ("module:function", called as this project calls it:
(completions, records)), out, steps, seed, prompts_per_step, k, max_new_tokens, temperature, lr,
save_steps, dtype ("float32", or "bfloat16": autocast over the float32 model). Writes
out/trl_steps.json: each step's seconds and sampled tokens, and the peak RSS.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time


def trl_config(spec: dict):
    """GRPOConfig doing this project's plain GRPO step (bench/trl.py `SAME_WORK` lists each setting)."""
    from trl import GRPOConfig

    completions = spec["prompts_per_step"] * spec["k"]
    return GRPOConfig(
        output_dir=spec["out"], use_cpu=True, bf16=spec.get("dtype") == "bfloat16", seed=spec["seed"],
        max_steps=spec["steps"],
        per_device_train_batch_size=completions, num_generations=spec["k"],
        steps_per_generation=1, num_iterations=1, gradient_accumulation_steps=1,
        max_completion_length=spec["max_new_tokens"], temperature=spec["temperature"], top_p=1.0, top_k=0,
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        loss_type="dapo", beta=0.0, epsilon=0.2, scale_rewards="group",
        gradient_checkpointing=False, logging_steps=1, save_strategy="steps", save_steps=spec["save_steps"],
        save_only_model=True, report_to=[], dataloader_num_workers=0, disable_tqdm=True)


def trl_reward(reward):
    """A TRL reward function (prompts, completions, **columns) around this project's (completions, records)."""
    def score(prompts, completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return reward(texts, [{"answer": a} for a in answer])
    score.__name__ = "reward"
    return score


def main(argv: list[str]) -> int:
    import datasets
    import torch
    import transformers
    from trl import GRPOTrainer

    from atgrpo_jax.registry import import_function

    with open(argv[0]) as f:
        spec = json.load(f)
    torch.set_num_threads(os.cpu_count() or 1)
    rows = [json.loads(line) for line in open(spec["data"]) if line.strip()]
    data = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                                       for r in rows])
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec["model"], padding_side="left")
    model = transformers.AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    steps: list[dict] = []

    class StepClock(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs and len(steps) < state.global_step:
                steps.append({"step": state.global_step, "seconds": time.perf_counter() - self.start,
                              "sampled_tokens": logs["completions/mean_length"] * spec["prompts_per_step"] * spec["k"],
                              "reward": logs.get("reward")})

    trainer = GRPOTrainer(model=model, reward_funcs=trl_reward(import_function(spec["reward"], "reward")),
                          args=trl_config(spec), train_dataset=data, processing_class=tokenizer, callbacks=[StepClock()])
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with open(os.path.join(spec["out"], "trl_steps.json"), "w") as f:
        json.dump({"steps": steps, "peak_rss_bytes": peak, "trl": __import__("trl").__version__}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
