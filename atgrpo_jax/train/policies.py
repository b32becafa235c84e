"""The trained policies of a run, as `config.policy.sharing` lays them out (`train.config.SHARINGS`):

  shared: one model for every agent
  per_role: one model per agent, each updated only on its own agent's samples
  lora: one adapter per agent on a frozen shared base (no base copy)
  shared_lora: one adapter for every agent on a frozen base

The router (`Sharing.route`) says which policy acts for, and learns from, each agent.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from atgrpo_jax.algo.logprobs import SampledFrom
from atgrpo_jax.distributed import local_model
from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.models.lora import attach_lora, merge_lora, split_lora
from atgrpo_jax.models.qwen3 import Qwen3
from atgrpo_jax.sampling import generate
from atgrpo_jax.sampling.cache import shard_model
from atgrpo_jax.sharding import TRAIN_RULES, pool_compiler_options
from atgrpo_jax.train.section import Sharing
from atgrpo_jax.train.update import Packed, TrainState, init_state, make_update_fns, with_lr


class Snapshot(NamedTuple):
    """A copy of a policy's params and the optimizer step they are from (what a stale rollout samples with)."""

    params: Any
    step: int


class Policy:
    """One sharing unit: its model (graphdef, frozen part), train state, the devices it lives on and its
    jitted functions. The methods are thin: `update` is the pure `state, batch -> state, metrics` of
    train.update, applied to the state this object keeps. Nothing outside assigns its fields."""

    def __init__(self, name: str, graphdef, frozen, state: TrainState, fns: tuple[Callable, Callable], *,
                 is_lora: bool = False, mesh=None, local_mesh=None, sample_dtype=None, regather: bool = False,
                 samples_base: bool = False):
        self.name, self.graphdef, self.frozen, self.is_lora = name, graphdef, frozen, is_lora
        # reference.shared_lora_samples_base: the sampler runs the base weights, the adapter left out (as the
        # reference's L1 with LoRA samples, docs/paper.md "Recipes", row L); what is trained and exported keeps it
        self.samples_base = samples_base
        self.mesh = mesh  # where its weights live and its update runs
        self.local_mesh = local_mesh  # with several processes: this process's part of `mesh` (it samples there)
        # Mixed precision: the trained params are float32 masters and the sampler runs a copy cast to the
        # model's param_dtype (bf16 updates of lr x grad vanish below a bf16 weight's last bit); None: as trained.
        self.sample_dtype = sample_dtype
        # The trained params are split over the data axis too (TRAIN_RULES): the sampler's copy is gathered
        # into a whole one per data row (RULES), as each host samples with its own.
        self.regather = regather
        self._state = state
        self._logprobs_fn, self._update_fn = fns
        self._sampling: Snapshot | None = None  # the weights the sampler uses instead of the state's
        self._merged = None  # (params, sampler model, without adapter) cache

    @property
    def state(self) -> TrainState:
        return self._state

    def model(self, params=None) -> Qwen3:
        return nnx.merge(self.graphdef, self._state.params if params is None else params, self.frozen)

    def sampler_model(self) -> Qwen3:
        """The model the sampler runs (a snapshot's weights inside `sampling_with`): adapters merged into
        the weights once per update (the merge is cached until the params change)."""
        params = self._state.params if self._sampling is None else self._sampling.params
        return self._runnable(params, without_adapter=self.samples_base)

    def _runnable(self, params, without_adapter: bool = False) -> Qwen3:
        if not self.is_lora and self.sample_dtype is None and not self.regather:
            return self.model(params)
        if self._merged is None or self._merged[0] is not params or self._merged[2] != without_adapter:
            if self.is_lora:
                adapters = jax.tree.map(jnp.zeros_like, params) if without_adapter else params
                model = merge_lora(self.model(adapters))
            else:
                model = self.model(params if self.sample_dtype is None else cast_floats(params, self.sample_dtype))
                model = shard_model(model, self.mesh) if self.regather else model
            self._merged = (params, model, without_adapter)
        return self._merged[1]

    def export_model(self) -> Qwen3:
        """The weights a checkpoint of this policy should hold: what the sampler runs (LoRA
        adapters merged; masters cast to the model's param_dtype)."""
        return self._runnable(self._state.params)

    def generate(self, prompts, settings=None, **kw):
        """sampling.generate on the sampler's model, where this process samples (its part of the pool)."""
        model = local_model(self.sampler_model(), self.local_mesh)
        with on_mesh(self.local_mesh or self.mesh):
            return generate(model, prompts, settings, **kw)

    def logprobs(self, batch: Packed, params=None) -> jax.Array:
        """log p [R, M] of a packed batch's scored tokens under `params` (default: the current ones)."""
        with on_mesh(self.mesh):
            return self._logprobs_fn(self._state.params if params is None else params, batch)

    def update(self, batch: Packed) -> dict:
        """One optimizer step on `batch` (dispatched, not waited for); returns its metrics (device arrays)."""
        with on_mesh(self.mesh):
            self._state, metrics = self._update_fn(self._state, batch)
        return metrics

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next optimizer steps (the schedule moves once per training step)."""
        self._state = with_lr(self._state, lr)

    def load(self, state) -> None:
        """Take a restored train state (a checkpoint's, as a TrainState or its fields)."""
        self._state = state if isinstance(state, TrainState) else TrainState(*state)

    def snapshot(self) -> Snapshot:
        """A copy of the current params (an update then replaces, and donates, the state's)."""
        return Snapshot(jax.tree.map(jnp.copy, self._state.params), int(self._state.step))

    @contextlib.contextmanager
    def sampling_with(self, snapshot: Snapshot | None):
        """Inside: the sampler runs `snapshot`'s weights (None: the current ones)."""
        before, self._sampling = self._sampling, snapshot
        try:
            yield
        finally:
            self._sampling = before


SHARED_ADAPTER = "shared"  # policy.sharing = "shared_lora": the one adapter, policy "lora_shared"


def on_mesh(mesh) -> contextlib.AbstractContextManager:
    """Trace under `mesh` (`jax.set_mesh`): the model's sharding constraints and per-device kernels
    (splash attention under shard_map) then apply, and its code paths follow the mesh's platform
    (`sharding.target_platform`), so `plan --compile` builds on a TPU topology what a pod runs."""
    return jax.set_mesh(mesh) if isinstance(mesh, jax.sharding.Mesh) else contextlib.nullcontext()


def cast_floats(tree, dtype):
    """Every floating leaf of `tree` in `dtype` (shardings kept: an eager cast stays where it is)."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """What the policies of a run are, besides their starting weights: the sharing layout, the loss (and
    its LM-head chunk), the adapters of LoRA layouts, the dtype full models train in, and the distribution
    the update scores tokens under."""

    sharing: Sharing
    loss: LossSettings = LossSettings()
    lora_rank: int = 16
    lora_alpha: float = 32.0
    seed: int = 0  # of the adapters (one more per agent)
    master_dtype: str = "float32"
    how: SampledFrom = SampledFrom()
    lora_a_init: str = "normal"  # models/lora.py:A_INITS
    samples_base: bool = False  # one shared adapter (shared_lora) whose sampler runs the base (Policy.samples_base)


def build_policies(spec: PolicySpec, base: Qwen3, agent_names, tx, model_copy: Callable[[int], Qwen3] | None = None,
                   meshes: Callable[[int], tuple] = lambda i: (None, None)) -> list[Policy]:
    """The policies of `spec`'s layout, all starting from `base`'s weights.

    One full model per agent calls `model_copy(i)` for every agent i after the
    first (a fresh load of the same weights, possibly on another device pool; or of the agent's own model,
    policy.role_models).
    spec.master_dtype: "float32" trains full models in float32 (AdamW's moments too) when the model's
    param_dtype is lower, the sampler running a copy in param_dtype; "param_dtype" trains in it.
    LoRA adapters are float32 whatever the base's dtype. meshes(i): (mesh, local mesh) of policy i.
    tx: the optimizer, or a function of the policy's index giving each its own (policy.role_optim).
    """
    sharing, loss_cfg, chunk, how = spec.sharing, spec.loss, spec.loss.logprob_chunk, spec.how
    tx_of = tx if callable(tx) else (lambda i: tx)

    def plain(model, name, i):
        mesh, local = meshes(i)
        lower = spec.master_dtype == "float32" and model.cfg.param_dtype != "float32"  # (each model's own, role_models)
        # Over several data rows (hosts) the trained state is split over all of the pool's devices; the
        # sampler gathers a whole copy per row (Policy.regather).
        regather = isinstance(mesh, jax.sharding.Mesh) and mesh.shape["data"] > 1
        trained = shard_model(model, mesh, TRAIN_RULES) if regather else model
        graphdef, params = nnx.split(trained)
        frozen = nnx.State({})
        params = cast_floats(params, jnp.float32) if lower else params
        fns = make_update_fns(graphdef, frozen, tx_of(i), loss_cfg, chunk, how, pool_compiler_options(mesh))
        return Policy(name, graphdef, frozen, init_state(params, tx_of(i)), fns, mesh=mesh, local_mesh=local,
                      sample_dtype=model.cfg.weight_dtype if lower else None, regather=regather)

    if sharing.per_agent and not sharing.lora:
        models = [base] + [model_copy(i) for i in range(1, len(agent_names))]
        return [plain(m, f"policy_{name}", i) for i, (m, name) in enumerate(zip(models, agent_names))]
    if sharing.lora:
        mesh = getattr(base.embed[...].sharding, "mesh", None)  # the adapters live where the base does
        out = []
        for i, name in enumerate(agent_names if sharing.per_agent else [SHARED_ADAPTER]):
            adapted = attach_lora(base, spec.lora_rank, spec.lora_alpha, spec.seed + i, spec.lora_a_init)
            adapted = shard_model(adapted, mesh) if isinstance(mesh, jax.sharding.Mesh) else adapted
            graphdef, adapters, frozen = split_lora(adapted)
            mesh_i, local = meshes(i)
            fns = make_update_fns(graphdef, frozen, tx_of(i), loss_cfg, chunk, how, pool_compiler_options(mesh_i))
            out.append(Policy(f"lora_{name}", graphdef, frozen, init_state(adapters, tx_of(i)), fns, is_lora=True,
                              mesh=mesh_i, local_mesh=local, samples_base=spec.samples_base and not sharing.per_agent))
        return out
    return [plain(base, "policy", 0)]
