"""The training config: every number a user sets, with its defaults, and its validation.

Config files in `configs/` start from `base_config()` and change what their
task needs; `validate` runs before anything compiles and names the bad key.
Defaults follow the paper's system (REFERENCE.md).
"""
from __future__ import annotations

import ml_collections

REGIMES = ("shared", "per_role", "lora", "single_agent", "plain_grpo")
SCHEDULES = ("constant", "cosine")


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = dict(preset="qwen3-1.7b", hf_path="", param_dtype="float32", compute_dtype="float32",
                   remat=False, init_seed=0, vocab_size=0)  # vocab_size 0: the preset's
    c.tokenizer = "qwen3"  # "qwen3", "char", or a checkpoint directory
    c.char_alphabet = ""  # the char tokenizer's characters ("" = printable ASCII)
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    c.env = dict(workflow="plan_path_tool", kwargs=ml_collections.ConfigDict())
    c.regime = "shared"
    c.policy_pools = False  # per_role: each policy on its own disjoint part of the mesh
    c.rollout = dict(num_tasks=32, k=8, max_turns=4, temperature=1.0, top_p=1.0, top_k=0,
                     max_prompt_len=4096, prompt_buckets=(512, 1024, 2048, 4096),
                     max_new_tokens=2048, eval_temperature=0.0)
    c.algo = dict(alpha=1.0, use_std=True, drop_low_mean_frac=0.5, drop_zero_variance=False)
    c.loss = dict(eps_low=0.2, eps_high=0.2, dual_clip=0.0, aggregation="token-mean",
                  kl_coef=0.0, entropy_coef=0.0, logprob_chunk=512)
    c.optim = dict(lr=1e-6, schedule="constant", warmup_steps=0, weight_decay=0.01, grad_clip=1.0,
                   b1=0.9, b2=0.999, mini_batch_size=16, epochs=1,
                   share_prompts=True)  # a group's samples share one forward pass of their prompt
    c.lora = dict(rank=16, alpha=32.0)
    c.train = dict(steps=200, seed=0, eval_every=10, eval_tasks=100, eval_k=1, log_every=1,
                   checkpoint_every=10, keep_last=2, time_budget_s=0.0)
    # Several processes: an explicit coordinator (or ATGRPO_* variables, see atgrpo_jax.launch),
    # or auto=True where jax.distributed finds the hosts itself (TPU pods; tpu_scripts/launch.sh).
    c.distributed = dict(coordinator_address="", num_processes=0, process_id=-1, auto=False)
    return c


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key."""


def _require(ok: bool, key: str, msg: str):
    if not ok:
        raise ConfigError(f"config.{key}: {msg}")


def validate(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Check every field that can be wrong before anything compiles."""
    from atgrpo_jax.models.config import DTYPES, PRESETS

    _require(c.model.preset in PRESETS or bool(c.model.hf_path), "model.preset",
             f"unknown preset {c.model.preset!r}; known: {sorted(PRESETS)} (or set model.hf_path)")
    for key in ("param_dtype", "compute_dtype"):
        _require(c.model[key] in DTYPES, f"model.{key}", f"must be one of {sorted(DTYPES)}")
    _require(c.model.vocab_size >= 0, "model.vocab_size", "must be >= 0 (0 = the preset's)")
    _require(c.regime in REGIMES, "regime", f"must be one of {REGIMES}, got {c.regime!r}")
    _require(not c.policy_pools or c.regime == "per_role", "policy_pools",
             f"only the per_role regime has one model per agent to place on its own pool, got {c.regime!r}")
    for key in ("data", "fsdp", "tensor"):
        v = c.mesh[key]
        _require(isinstance(v, int) and (v > 0 or v == -1), f"mesh.{key}", f"must be > 0 or -1, got {v!r}")
    r = c.rollout
    for key in ("num_tasks", "k", "max_turns", "max_new_tokens", "max_prompt_len"):
        _require(isinstance(r[key], int) and r[key] > 0, f"rollout.{key}", f"must be a positive int, got {r[key]!r}")
    _require(r.k >= 2 or c.regime == "plain_grpo", "rollout.k", "tree sampling needs k >= 2 branches")
    _require(r.temperature >= 0 and r.eval_temperature >= 0, "rollout.temperature", "must be >= 0")
    _require(0 < r.top_p <= 1, "rollout.top_p", f"must be in (0, 1], got {r.top_p}")
    _require(r.top_k >= 0, "rollout.top_k", "must be >= 0 (0 = off)")
    _require(list(r.prompt_buckets) == sorted(r.prompt_buckets) and len(r.prompt_buckets) > 0,
             "rollout.prompt_buckets", "must be a non-empty increasing list")
    _require(r.prompt_buckets[-1] >= r.max_prompt_len, "rollout.prompt_buckets",
             f"largest bucket {r.prompt_buckets[-1]} < rollout.max_prompt_len {r.max_prompt_len}")
    a = c.algo
    _require(0 <= a.drop_low_mean_frac < 1, "algo.drop_low_mean_frac", "must be in [0, 1)")
    from atgrpo_jax.algo.loss import LossConfig
    try:
        LossConfig(**{k: v for k, v in c.loss.items() if k != "logprob_chunk"})
    except ValueError as e:
        raise ConfigError(f"config.{e}") from None
    _require(c.loss.logprob_chunk > 0, "loss.logprob_chunk", "must be > 0")
    o = c.optim
    _require(o.lr > 0, "optim.lr", f"must be > 0, got {o.lr}")
    _require(o.schedule in SCHEDULES, "optim.schedule", f"must be one of {SCHEDULES}")
    _require(o.warmup_steps >= 0 and o.weight_decay >= 0 and o.grad_clip > 0, "optim",
             "warmup_steps and weight_decay must be >= 0 and grad_clip > 0")
    _require(o.mini_batch_size > 0 and o.epochs > 0, "optim.mini_batch_size", "mini_batch_size and epochs must be > 0")
    _require(c.lora.rank > 0, "lora.rank", "must be > 0")
    t = c.train
    _require(t.steps > 0, "train.steps", "must be > 0")
    for key in ("eval_every", "checkpoint_every", "log_every", "keep_last"):
        _require(t[key] >= 0, f"train.{key}", "must be >= 0")
    return c


# Per-task settings of the paper's system (REFERENCE.md): filters, turns, eval temperature.
_TASKS = {
    "plan_path": dict(workflow="plan_path_tool_plan", max_turns=4, eval_temperature=0.0,
                      drop_low_mean_frac=0.5, drop_zero_variance=False),
    "sokoban": dict(workflow="sokoban_tool_plan", max_turns=4, eval_temperature=0.0,
                    drop_low_mean_frac=0.5, drop_zero_variance=False),
    "sudoku": dict(workflow="sudoku_tool_plan", max_turns=4, eval_temperature=0.0,
                   drop_low_mean_frac=0.5, drop_zero_variance=False),
    "math": dict(workflow="math", max_turns=4, eval_temperature=0.6,
                 drop_low_mean_frac=0.0, drop_zero_variance=False),
    "code": dict(workflow="code", max_turns=4, eval_temperature=0.6,
                 drop_low_mean_frac=0.0, drop_zero_variance=True),
}


def paper_config(task: str, preset: str) -> ml_collections.ConfigDict:
    """The paper's system for `task` with a Qwen3 `preset` (weights from model.hf_path)."""
    t = _TASKS[task]
    c = base_config()
    c.model.update(preset=preset, param_dtype="bfloat16", compute_dtype="bfloat16", remat=True)
    c.env.workflow = t["workflow"]
    c.rollout.update(num_tasks=32, k=8, max_turns=t["max_turns"], temperature=1.0, top_p=1.0,
                     eval_temperature=t["eval_temperature"], max_prompt_len=4096, max_new_tokens=2048)
    c.algo.update(drop_low_mean_frac=t["drop_low_mean_frac"], drop_zero_variance=t["drop_zero_variance"])
    c.optim.update(lr=1e-6, schedule="constant", mini_batch_size=16)
    c.train.update(steps=200, eval_every=10, eval_tasks=100, checkpoint_every=10, keep_last=2)
    return c
