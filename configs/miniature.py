"""The paper's table in miniature: its Plan-Path or Sokoban tool + plan workflow on a CPU.

    python -m atgrpo_jax.miniature --config=configs/miniature.py:plan_path --out=runs/mini_plan_path

The paper's run (`paper_config`: its workflow, prompts, parsers, rewards, filters, sampling and schedule
shape, the real Qwen3 tokenizer and chat template) with what a CPU can afford changed: a 2-layer
Qwen3-architecture model on a trimmed Qwen3 vocabulary (atgrpo_jax/models/trimmed.py), warm-started by
SFT on noised solver play; 3 turns instead of 5; 4 tasks x 4 branches per step instead of 32 x 8;
6x6 Plan-Path levels (the paper's are 10x10; Sokoban's are 6x6 with one box in both); a learning rate
for a small model trained from scratch; training temperature 1.0, not 1.5 (a tiny model's distribution is
far flatter than a pretrained 1.7B's: at 1.5 nearly all its replies are out of format, so groups carry
no signal; docs/results/miniature.md). The driver (atgrpo_jax/miniature) fills in the tokenizer,
model.vocab_size, sft.train_path and model.init_from.
"""
from atgrpo_jax.train.paper import paper_config

LEVELS = {"plan_path": dict(height=6, width=6, wall_prob=0.22, min_distance=1, max_distance=6),
          "sokoban": None}  # the game's default: 6x6, one box


def get_config(game: str = "plan_path"):
    if game not in LEVELS:
        raise ValueError(f"configs/miniature.py:{game}: the game is one of {', '.join(LEVELS)}")
    c = paper_config(game, "demo-tiny")
    c.model.update(param_dtype="float32", compute_dtype="float32", remat=False)
    c.mesh = dict(data=1, fsdp=1, tensor=1)
    if LEVELS[game]:
        c.env.kwargs.params = LEVELS[game]
    c.env.kwargs.max_turns = 3
    c.rollout.update(num_tasks=4, k=4, max_turns=3, temperature=1.0, max_prompt_len=640, prompt_buckets=(384, 640), max_new_tokens=32)
    c.optim.update(lr=3e-4, warmup_steps=3, mini_batch_size=64, weight_decay=0.01)
    c.train.update(steps=24, eval_every=12, eval_tasks=32, checkpoint_every=20, keep_last=1, time_budget_s=0.0)
    c.sft.update(steps=150, rows=8, row_tokens=1024, eval_every=0)
    return c
