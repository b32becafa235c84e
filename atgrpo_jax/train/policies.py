"""The trained policies of a run, as `config.policy.sharing` lays them out (`train.config.SHARINGS`):

  shared: one model for every agent
  per_role: one model per agent, each updated only on its own agent's samples
  lora: one adapter per agent on a frozen shared base (no base copy)

The router (`Sharing.route`) says which policy acts for, and learns from, each agent.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from atgrpo_jax.algo.logprobs import SampledFrom
from atgrpo_jax.algo.loss import LossConfig
from atgrpo_jax.models.lora import attach_lora, merge_lora, split_lora
from atgrpo_jax.models.qwen3 import Qwen3
from atgrpo_jax.sampling.cache import shard_model
from atgrpo_jax.train.config import Sharing
from atgrpo_jax.train.update import TrainState, init_state, make_update_fns


@dataclasses.dataclass
class Policy:
    name: str
    graphdef: Any
    frozen: Any  # non-trainable state (the LoRA base), or an empty State
    state: TrainState
    logprobs_fn: Callable
    update_fn: Callable
    is_lora: bool = False
    mesh: Any = None  # where its weights live and its update runs
    local_mesh: Any = None  # with several processes: this process's part of `mesh` (it samples there)
    # system.staleness = 1: the weights the sampler uses while an update runs (a copy of the params
    # from before it) and the optimizer step they are from; None: the sampler uses `state`.
    behavior: Any = None
    behavior_step: int = 0
    # Mixed precision: the trained params are float32 masters and the sampler runs a copy cast to the
    # model's param_dtype (bf16 updates of lr x grad vanish below a bf16 weight's last bit); None: as trained.
    sample_dtype: Any = None
    _merged: Any = dataclasses.field(default=None, repr=False)  # (params, sampler model) cache

    def model(self, params=None) -> Qwen3:
        return nnx.merge(self.graphdef, self.state.params if params is None else params, self.frozen)

    def sampler_model(self) -> Qwen3:
        """The model the sampler runs (its behavior weights if set): adapters merged into the
        weights once per update (the merge is cached until the params change)."""
        params = self.state.params if self.behavior is None else self.behavior
        if not self.is_lora and self.sample_dtype is None:
            return self.model(params)
        if self._merged is None or self._merged[0] is not params:
            model = merge_lora(self.model(params)) if self.is_lora else \
                self.model(cast_floats(params, self.sample_dtype))
            self._merged = (params, model)
        return self._merged[1]

    def export_model(self) -> Qwen3:
        """The weights a checkpoint of this policy should hold: what the sampler runs (LoRA
        adapters merged; masters cast to the model's param_dtype)."""
        return self.sampler_model() if self.behavior is None else \
            dataclasses.replace(self, behavior=None, _merged=None).sampler_model()

    def hold_behavior(self):
        """Keep a copy of the current params for the sampler (the update then replaces `state`)."""
        self.behavior, self.behavior_step = jax.tree.map(jax.numpy.copy, self.state.params), int(self.state.step)


MASTER_DTYPES = ("float32", "param_dtype")  # optim.master_dtype


def cast_floats(tree, dtype):
    """Every floating leaf of `tree` in `dtype` (shardings kept: an eager cast stays where it is)."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def build_policies(sharing: Sharing, base: Qwen3, agent_names, tx, loss_cfg: LossConfig, chunk: int,
                   lora_rank: int = 16, lora_alpha: float = 32.0, seed: int = 0,
                   model_copy: Callable[[int], Qwen3] | None = None,
                   how: SampledFrom = SampledFrom(), master_dtype: str = "float32") -> list[Policy]:
    """The policies of a sharing layout, all starting from `base`'s weights.

    One full model per agent calls `model_copy(i)` for every agent i after the
    first (a fresh load of the same weights, possibly on another device pool).
    master_dtype: "float32" trains full models in float32 (AdamW's moments too) when the model's
    param_dtype is lower, the sampler running a copy in param_dtype; "param_dtype" trains in it.
    LoRA adapters are float32 whatever the base's dtype.
    """
    lower = master_dtype == "float32" and base.cfg.param_dtype != "float32"

    def plain(model, name):
        graphdef, params = nnx.split(model)
        frozen = nnx.State({})
        params = cast_floats(params, jnp.float32) if lower else params
        lp, up = make_update_fns(graphdef, frozen, tx, loss_cfg, chunk, how)
        return Policy(name, graphdef, frozen, init_state(params, tx), lp, up,
                      sample_dtype=base.cfg.weight_dtype if lower else None)

    if sharing.per_agent and not sharing.lora:
        models = [base] + [model_copy(i) for i in range(1, len(agent_names))]
        return [plain(m, f"policy_{name}") for m, name in zip(models, agent_names)]
    if sharing.lora:
        mesh = getattr(base.embed[...].sharding, "mesh", None)  # the adapters live where the base does
        out = []
        for i, name in enumerate(agent_names):
            adapted = attach_lora(base, lora_rank, lora_alpha, seed + i)
            adapted = shard_model(adapted, mesh) if isinstance(mesh, jax.sharding.Mesh) else adapted
            graphdef, adapters, frozen = split_lora(adapted)
            lp, up = make_update_fns(graphdef, frozen, tx, loss_cfg, chunk, how)
            out.append(Policy(f"lora_{name}", graphdef, frozen, init_state(adapters, tx), lp, up, True))
        return out
    return [plain(base, "policy")]
