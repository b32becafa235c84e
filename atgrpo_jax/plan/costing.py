"""A model of a training step's time on a target, from compiled programs and measured efficiencies.

It is a model, not a measurement. What it assumes:
- Sampling: every agent, every turn, runs one call of the step's tasks (each host its share, at
  the same time): a prefill of the prompts, then `response_tokens` decode steps with every row
  live, each as long as the compiled step (which reads the widest cache: an upper bound).
- Update: every sample of every turn is kept but for the low-mean group filter's share; each
  holds `prompt_tokens` + `response_tokens` tokens, a group's prompt once when prompts are shared.
  Per-role policies on their own pools update at the same time; on one mesh, one after the other.
- Environment steps, the host's work and evaluation are left out.
A decode step reads the weights and the KV cache: its time is those bytes per chip at the chip's
HBM bandwidth over the decode efficiency measured on an H200 (a step against that floor), plus a
per-row cost (choosing each row's token over the vocabulary: penalty, top-k, top-p); prefill and
the update are their useful FLOPs (as `atgrpo_jax.bench` counts MFU) at the chip's peak over an
MFU measured there: the update's is the trainer's whole update at the paper's width (old
log-probs, mini-batch packing and host work included), not the dense 4,096-token kernel figure. Both are counted from the model, not taken from
XLA's cost analysis, which counts a loop's body once (the layer loop, the log-prob chunks) and
counts an in-place cache update as a read and write of the whole cache.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from atgrpo_jax.models.model_config import DTYPES, Qwen3Config

# Measured on one H200 (docs/device.md, docs/device_results/):
DENSE_MFU = 0.353  # Qwen3-1.7B update, 4,096 dense tokens, layers in a loop (as TPUs run it)
DECODE_EFFICIENCY = 2.67 / 4.30  # a decode step at 64 rows against its weights + KV-cache read floor
# The paper-width step (`bench device --parts=paper_step`: Plan-Path 1.7B, 32 tasks x K=8, both agents,
# 2 turns of 512 tokens) took 20.3 s sampling and 18.4 s updating where the two figures above alone
# modelled 9.5 and 12.2 s. The gaps, as the model now counts them:
ROW_STEP_SECONDS = 20.5e-6  # per row per decode step: (9.6 ms measured - 4.3 ms modelled) / 256 rows
UPDATE_MFU = DENSE_MFU * 12.18 / 18.41  # the trainer's update at that width: 23.4%


@dataclasses.dataclass(frozen=True)
class Assumptions:
    prompt_tokens: int  # tokens of a prompt
    response_tokens: int  # tokens of a response; decode steps per sampling call
    kept_fraction: float  # samples the group filters keep

    @staticmethod
    def of(config, prompt_tokens: int = 0, response_tokens: int = 0) -> "Assumptions":
        """Defaults: half the config's prompt and response budgets."""
        r = config.rollout
        return Assumptions(prompt_tokens or r.max_prompt_len // 2, response_tokens or r.longest_response() // 2,
                           1.0 - config.algo.drop_low_mean_frac)


def layer_flops_per_token(cfg: Qwen3Config) -> float:
    """2 x the parameters a token meets in the layers and the LM head (one forward)."""
    d = cfg.hidden_size
    layers = cfg.num_layers * (d * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
                               + 3 * d * cfg.intermediate_size)
    return 2 * (layers + d * cfg.vocab_size)


def attention_flops(cfg: Qwen3Config, queries: int, keys: float) -> float:
    """One forward's attention: scores and outputs, each query against `keys` keys."""
    return 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * queries * keys


def forward_flops(cfg: Qwen3Config, rows: int, length: int) -> float:
    """Useful FLOPs of a causal forward over rows x length tokens."""
    return rows * (layer_flops_per_token(cfg) * length + attention_flops(cfg, length, (length + 1) / 2))


def decode_step_bytes(cfg: Qwen3Config, mesh: dict, prompts: int, prompt_tokens: float, rows: int,
                      own_tokens: float) -> float:
    """Bytes one chip reads in a decode step: the layer weights and the LM head (whole over fsdp
    with model.decode_gather, its shard without), each prompt's keys and values once (its branch rows
    read them in place) and each row's own new tokens' (rows over data x fsdp, kv heads over tensor)."""
    d = cfg.hidden_size
    weights = (layer_flops_per_token(cfg) / 2 - d * cfg.vocab_size) * jnp.dtype(cfg.weight_dtype).itemsize
    head = d * cfg.vocab_size * jnp.dtype(DTYPES[cfg.compute_dtype]).itemsize
    split = mesh["tensor"] * (1 if cfg.decode_gather else mesh["fsdp"])
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(DTYPES[cfg.compute_dtype]).itemsize
    row_split = mesh["data"] * mesh["fsdp"]
    cache = kv * (prompts * prompt_tokens + rows * own_tokens)
    return (weights + head) / split + cache / (row_split * mesh["tensor"])


def decode_step_seconds(cfg: Qwen3Config, chip, mesh: dict, prompts: int, prompt_tokens: float, rows: int,
                        own_tokens: float) -> float:
    bytes_ = decode_step_bytes(cfg, mesh, prompts, prompt_tokens, rows, own_tokens)
    rows_per_chip = rows / (mesh["data"] * mesh["fsdp"])
    return bytes_ / (chip.hbm_bytes_per_s * DECODE_EFFICIENCY) + rows_per_chip * ROW_STEP_SECONDS


@dataclasses.dataclass(frozen=True)
class PoolWork:
    """What one policy's pool does in a step, for the time model."""

    agents: int  # agents it samples for and learns from
    sampler_mesh: dict  # mesh sizes one sampling call runs on (one host's part of the pool)
    prompts: int  # prompts of one sampling call (one host's share of the tasks)
    rows: int  # rows it decodes (prompts x branches)
    update_chips: int  # chips its update runs on
    cfg: Qwen3Config | None = None  # its own model (policy.role_models); None: the step's


def step_time(step_cfg: Qwen3Config, config, chip, pools: list[PoolWork], pools_in_parallel: bool,
              a: Assumptions) -> dict:
    """Modelled seconds of one training step: {"sampling", "update", "total"} (module docstring).
    Sampling calls run one after another (agents act in turn); updates of pools on their own devices
    at the same time."""
    r, o = config.rollout, config.optim
    flops_per_s = chip.peak_flops * UPDATE_MFU
    dense_flops_per_s = chip.peak_flops * DENSE_MFU
    sampling, updates = 0.0, []
    for pool in pools:
        cfg = pool.cfg or step_cfg
        calls = pool.agents * r.max_turns
        chips = math.prod(pool.sampler_mesh.values())
        prefill = forward_flops(cfg, pool.prompts, a.prompt_tokens) / (chips * dense_flops_per_s)
        step = decode_step_seconds(cfg, chip, pool.sampler_mesh, pool.prompts, a.prompt_tokens, pool.rows,
                                   a.response_tokens / 2)  # the mean step reads half the response's slots
        sampling += calls * (prefill + a.response_tokens * step)
        samples = r.num_tasks * r.k * pool.agents * (r.max_turns if r.tree else 1) * a.kept_fraction
        per_row = r.k if (o.share_prompts and r.tree) else 1  # a group's responses share its prompt's row
        p_, s_ = a.prompt_tokens, a.response_tokens
        row = (layer_flops_per_token(cfg) * (p_ + per_row * s_) + attention_flops(cfg, p_, (p_ + 1) / 2)
               + per_row * attention_flops(cfg, s_, p_ + (s_ + 1) / 2))  # a response sees its prompt and itself
        forward = row * samples / per_row
        passes = 3 * o.epochs + 1 + (1 if config.loss.kl_coef else 0)  # fwd+bwd per epoch; old (and ref) log-probs
        updates.append(forward * passes / (pool.update_chips * flops_per_s))
    update = max(updates) if pools_in_parallel else sum(updates)
    return {"sampling": sampling, "update": update, "total": sampling + update}
