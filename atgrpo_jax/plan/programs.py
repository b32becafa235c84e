"""The jitted programs of one training step, built for a target's devices without running anything.

The trainer (train/setup.py, train/policies.py) builds, per policy, a model on its pool's mesh, a
train state (float32 masters and AdamW moments where the model's weights are lower), the update's
two jitted functions (`make_update_fns`) and, for sampling, the sampler's copy of the weights
on the part of the pool this process holds. Here the same functions are given abstract arrays
with the same shapes, dtypes and shardings, and lowered under the same mesh (`on_mesh`), so a
CPU process builds what a TPU pod or a GPU will run:

  prefill         sampling/decode.py: one sampling call's prompts (the largest prompt bucket)
  decode segment  its decode loop over every row of the call at the widest cache (all rows
                  decoding to max_new_tokens: the most memory a call can need)
  old log-probs   train/update.py logprobs_fn on one packed mini-batch (also the KL reference's)
  update          train/update.py update_fn: one optimizer step on that mini-batch

Each program's arrays are what the trainer passes: prefill's outputs feed the decode loop's start,
whose outputs (with their compiled shardings) feed the segment. The mini-batch is the planner's
case: one sample per row at the widest row the config allows (train/step.py packs no wider).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from optax.tree_utils import tree_map_params
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from atgrpo_jax.distributed import local_mesh
from atgrpo_jax.models import Qwen3
from atgrpo_jax.models.attention import configured_backend
from atgrpo_jax.models.lora import attach_lora, merge_lora, split_lora
from atgrpo_jax.plan.planned_model import model_config, planned_roles
from atgrpo_jax.sampling import decode as dec
from atgrpo_jax.sampling.generate import bucket_for
from atgrpo_jax.sharding import (RULES, TRAIN_RULES, batch_shards, logical_sharding, make_mesh, platform_of,
                                 pool_compiler_options, sub_meshes)
from atgrpo_jax.train.batch import fine_bucket, length_bucket
from atgrpo_jax.train.policies import SHARED_ADAPTER, on_mesh
from atgrpo_jax.train.setup import make_tokenizer, scored_as, scoring_of
from atgrpo_jax.train.update import Packed, TrainState, make_optimizer, update_steps

# How the TPU compiler refuses a program that does not fit: (what it needs, what the chip has).
_OOM = (re.compile(r"Used ([\d.]+)([KMGT])? of ([\d.]+)([KMGT])? hbm"),
        re.compile(r"required for [^(]*\(([\d.]+)([KMGT])?\) exceeds available HBM \(([\d.]+)([KMGT])?\)"))
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, None: 1, "": 1}


class DoesNotFit(Exception):
    """A program the compiler refused for lack of memory on the target's chip (`name` of `pool`)."""

    def __init__(self, name: str, pool: str, need: int, have: int):
        super().__init__(f"{name} of {pool} needs {need / 2**30:.2f} GiB per chip, more than "
                         f"the {have / 2**30:.2f} GiB the compiler may use of each chip")
        self.name, self.pool, self.need, self.have = name, pool, need, have

    def __reduce__(self):  # raised in plan --compile's child process, raised again in the command's
        return DoesNotFit, (self.name, self.pool, self.need, self.have)


_PROGRESS: list[Callable] = []  # called as f(program, seconds): seconds None before its compile starts


@contextlib.contextmanager
def compile_progress(report: Callable):
    """Inside: `report(program, None)` before each program compiles and `report(program, seconds)` after."""
    _PROGRESS.append(report)
    try:
        yield
    finally:
        _PROGRESS.remove(report)


@dataclasses.dataclass
class Program:
    """One jitted function with the abstract arguments the trainer gives it, on `mesh`."""

    name: str
    pool: str  # the policy it belongs to
    mesh: Any
    fn: Callable
    args: tuple
    static: dict = dataclasses.field(default_factory=dict)
    resident: int = 0  # bytes per device that stay on the chip beside its arguments (other live state)
    rows: int = 0  # rows x length: the tokens one call processes (prefill, log-probs, update)
    length: int = 0
    reported: bool = True  # False: a helper the report leaves out (it only feeds the next program)
    compile_s: float = 0.0  # seconds its compile took (set by `compiled`)
    _compiled: Any = None

    def lower(self):
        with on_mesh(self.mesh):
            return self.fn.lower(*self.args, **self.static)

    def compiled(self):
        """The compiled program (once); DoesNotFit when the compiler refuses it for lack of memory."""
        if self._compiled is None:
            for report in _PROGRESS:
                report(self, None)
            start = time.perf_counter()
            try:
                self._compiled = self.lower().compile()
            except Exception as e:  # noqa: BLE001  (XlaRuntimeError: RESOURCE_EXHAUSTED with the sizes in its text)
                m = next((m for m in (p.search(str(e)) for p in _OOM) if m), None)
                if "RESOURCE_EXHAUSTED" not in str(e) or not m:
                    raise
                need, have = (float(m.group(i)) * _UNITS[m.group(i + 1)] for i in (1, 3))
                raise DoesNotFit(self.name, self.pool, int(need) + self.resident, int(have)) from None
            self.compile_s = time.perf_counter() - start
            for report in _PROGRESS:
                report(self, self.compile_s)
        return self._compiled


def _abstract(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def placed(state, mesh, dtype=None, rules: dict = RULES):
    """An nnx.State of abstract arrays placed on `mesh` by each variable's logical axes and `rules` (as
    `sampling.shard_model` places real ones), in `dtype` for floats if given."""
    def place(var):
        axes = getattr(var, "logical_axes", None) or (None,) * var.ndim
        dt = dtype if dtype is not None and jnp.issubdtype(var.dtype, jnp.floating) else var.dtype
        return var.replace(_abstract(var.shape, dt, logical_sharding(mesh, axes, var.shape, rules)))
    return jax.tree.map(place, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def on(tree, mesh):
    """`tree`'s abstract arrays with their shardings moved to `mesh` (same specs)."""
    return jax.tree.map(lambda x: _abstract(x.shape, x.dtype, NamedSharding(mesh, x.sharding.spec)), tree)


def device_bytes(tree) -> int:
    """Bytes one device holds of a tree of abstract arrays."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return total


def outputs(program: "Program"):
    """A program's outputs as abstract arrays with the shardings the compiler gave them."""
    compiled = program.compiled()
    return jax.tree.map(lambda a, s: _abstract(a.shape, a.dtype, s), program.lower().out_info,
                        compiled.output_shardings)


def tokenizer_size(config) -> tuple[int, int]:
    """(ids the tokenizer has, its pad id): what the sampler limits the vocabulary to."""
    tok = make_tokenizer(config.tokenizer, config.model.hf_path, config.char_alphabet)
    return len(tok), tok.pad_token_id or 0


@dataclasses.dataclass
class PoolState:
    """One policy's abstract state on its pool: what the trainer keeps there."""

    name: str
    mesh: Any
    graphdef: Any
    frozen: Any
    train: TrainState
    sampler_graphdef: Any
    sampler_weights: Any  # the weights the sampler runs (cast or merged); `train.params` when the same
    sampler_copy: bool  # whether those are a copy beside the train state
    agents: list[int]


def _pool_state(config, cfg, name, mesh, tx, lora: bool, seed: int, agents) -> PoolState:
    lower = config.optim.master_dtype == "float32" and cfg.param_dtype != "float32"
    if lora:
        base = cfg.replace(lora_rank=0)  # the shared base, as train/setup.py builds it; the adapters come next
        model = nnx.eval_shape(lambda: attach_lora(Qwen3(base, rngs=nnx.Rngs(0)), config.lora.rank, config.lora.alpha,
                                                   seed))
        graphdef, adapters, frozen = split_lora(model)
        params, frozen = placed(adapters, mesh), placed(frozen, mesh)
        merged = nnx.eval_shape(lambda a, f: merge_lora(nnx.merge(graphdef, a, f)), params, frozen)
        s_graphdef, s_weights = nnx.split(merged)
        s_weights, copy = placed(s_weights, mesh), True
    else:  # as train/policies.py lays them out: see `build_policies`
        graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
        frozen = nnx.State({})
        regather = mesh.shape["data"] > 1
        params = placed(state, mesh, jnp.float32 if lower else None, TRAIN_RULES if regather else RULES)
        s_graphdef = graphdef
        s_weights, copy = (placed(state, mesh), True) if lower or regather else (params, False)
    replicated = NamedSharding(mesh, PartitionSpec())
    opt = jax.eval_shape(tx.init, params)
    opt = tree_map_params(tx, lambda s, p: _abstract(s.shape, s.dtype, p.sharding), opt, params,
                          transform_non_params=lambda s: _abstract(s.shape, s.dtype, replicated))
    train = TrainState(params, opt, _abstract((), jnp.int32, replicated))
    return PoolState(name, mesh, graphdef, frozen, train, s_graphdef, s_weights, copy, agents)


def _packed(mesh, rows: int, width: int, scored: int, samples: int, penalty: bool, logps: int,
            loss=None) -> Packed:
    """An abstract packed mini-batch as `global_array` places it (rows over the batch axes), with the
    per-entry inputs the loss settings `loss` (a LossSettings; None: the log-probs program's) read."""
    def arr(shape, dtype):
        return _abstract(shape, dtype, logical_sharding(mesh, ("batch",) + (None,) * (len(shape) - 1), shape))
    rw, rm = (rows, width), (rows, scored)
    logp = [arr(rm, jnp.float32) if i < logps else None for i in range(2)]
    sample_ids = penalty or (loss is not None and loss.ratio_level == "sequence")
    return Packed(arr(rw, jnp.int32), arr(rw, jnp.int32), arr(rw, jnp.int32), arr(rm, jnp.int32), arr(rm, jnp.int32),
                  arr(rm, bool), arr(rm, jnp.int32), arr(rm, jnp.float32), arr(rm, jnp.float32), arr(rm, jnp.float32),
                  *logp, penalty=arr(rm, jnp.float32) if penalty else None,
                  sample=arr(rm, jnp.int32) if sample_ids else None,
                  sample_row=arr((samples,), jnp.int32) if penalty else None,
                  is_weight=arr(rm, jnp.float32) if loss is not None and loss.is_correction != "none" else None)


@dataclasses.dataclass
class StepPrograms:
    """A training step's programs on a target, and what they were built from."""

    programs: list[Program]
    pools: list[PoolState]
    mesh: Any
    cfg: Any  # the model's Qwen3Config
    pool_cfgs: dict  # policy name -> its model's Qwen3Config (unequal with policy.role_models)
    prompts: int  # prompts of one host's sampling call
    notes: list[str]


def step_programs(config, devices, hosts: int, on_one_host: Callable = lambda devices: devices) -> StepPrograms:
    """Every program of one training step of `config` (resolved) on `devices` (a target's). on_one_host:
    one host's devices as the devices to compile that host's own programs (sampling) for."""
    mesh = make_mesh(config.mesh.to_dict(), devices)
    platform = platform_of(mesh)
    names = list(planned_roles(config))
    notes = []
    def cfg_of(c):  # the model of config `c` as this platform runs it
        return model_config(c).replace(
            attention=configured_backend(config.model.attention, platform, config.optim.share_prompts),
            decode_attention=config.model.decode_attention)
    cfg = cfg_of(config)
    layout = config.layout(len(names))
    route = layout.policy_of_agent
    pools = sub_meshes(mesh, layout.pools) if layout.pools > 1 else [mesh] * len(names)
    tx, _ = make_optimizer(config.optim, config.train.steps)
    per_pool = layout.per_agent
    routing = config.policy.routing
    prefix = {(True, True): "lora_", (True, False): "policy_"}.get((routing.per_agent, routing.lora))
    states, cfgs = [], {}
    for p in range(layout.policies):
        name = f"{prefix}{names[p]}" if prefix else f"lora_{SHARED_ADAPTER}" if layout.lora else "policy"
        agents = [a for a in range(len(names)) if route[a] == p]
        cfgs[name] = cfg_of(config.role(names[p])) if per_pool else cfg  # a role's own (role_models)
        states.append(_pool_state(config, cfgs[name], name, pools[p] if per_pool else mesh, tx, layout.lora,
                                  config.model.init_seed + p, agents))
    vocab_limit, pad_id = tokenizer_size(config)
    vocab_limit = vocab_limit if vocab_limit < cfg.vocab_size else None
    sampling = [config.rollout.agent(n) for n in names]
    r = config.rollout
    tasks = r.num_tasks // hosts
    prompts, k = (tasks, r.k) if r.tree else (tasks * r.k, 1)
    programs = []
    for s in states:
        others = [o for o in states if o is not s and o.mesh is s.mesh]  # policies sharing these devices
        programs += _sampler_programs(config, s, others, sampling, prompts, k, pad_id, vocab_limit, on_one_host)
        programs += _update_programs(config, s, others, sampling, vocab_limit, tx)
    return StepPrograms(programs, states, mesh, cfg, cfgs, prompts, notes)


def _resident(state: PoolState, others, program: str) -> int:
    """Bytes per device outside a program's arguments that stay on the chip: the other policies' state on
    these devices, and of this policy's: in sampling its train state; in the update the sampler's cached
    copy; in the log-probs pass that copy and the optimizer's moments. A LoRA base (`frozen`) is shared by
    the policies on a mesh: an argument of their updates, resident while they sample."""
    total = sum(device_bytes(o.train) + (device_bytes(o.sampler_weights) if o.sampler_copy else 0) for o in others)
    if program == "sampling":
        return total + device_bytes(state.train) + device_bytes(state.frozen)
    total += device_bytes(state.sampler_weights) if state.sampler_copy else 0
    return total + (device_bytes(state.train.opt_state) if program == "log-probs" else 0)


def _sampler_programs(config, s: PoolState, others, sampling, prompts: int, k: int, pad_id: int,
                      vocab_limit, on_one_host: Callable) -> list[Program]:
    mesh = s.mesh
    if _hosts_of(s.mesh) > 1:  # each host samples on its own part of the pool (process 0's, here)
        mesh = local_mesh(s.mesh, process=0)
        mesh = Mesh(np.asarray(on_one_host(list(mesh.devices.flat)), dtype=object).reshape(mesh.devices.shape),
                    mesh.axis_names, axis_types=mesh.axis_types)
    weights = on(s.sampler_weights, mesh)
    r = config.rollout
    length = bucket_for(r.max_prompt_len, r.prompt_buckets)
    out, seen = [], set()
    for a in s.agents:
        sa = sampling[a]
        settings = dec.DecodeSettings(sa.max_new_tokens, k, sa.top_k, sa.top_p, 256, pad_id, None, False,
                                      vocab_limit, sa.repetition_penalty != 1.0)
        if settings in seen:
            continue
        seen.add(settings)
        rows = prompts * k
        batch = lambda *shape, dt: _abstract(shape, dt, logical_sharding(mesh, ("batch",) + (None,) * (len(shape) - 1),
                                                                         shape))  # noqa: E731
        ids, mask = batch(prompts, length, dt=jnp.int32), batch(prompts, length, dt=bool)
        resident = _resident(s, others, "sampling")
        prefill = Program("prefill", s.name, mesh, dec.prefill_jit, (s.sampler_graphdef, weights, ids, mask),
                          dict(cache_dtype=None, presence=settings.repetition_penalty), resident, prompts, length)
        layers = Program("decode weights", s.name, mesh, dec.layer_weights_jit, (s.sampler_graphdef, weights),
                         reported=False)
        keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), rows))
        keys = _abstract(keys.shape, keys.dtype, logical_sharding(mesh, ("batch",), keys.shape))
        stops, budget = batch(prompts, 4, dt=jnp.int32), batch(prompts, dt=jnp.int32)
        start = Program("decode start", s.name, mesh, dec.start_jit,
                        (s.sampler_graphdef, weights, outputs(prefill), stops, keys, budget), dict(settings=settings),
                        reported=False)
        first, full = outputs(start)
        replicated = NamedSharding(mesh, PartitionSpec())
        args = (s.sampler_graphdef, weights, outputs(layers), first, full, batch(rows, dt=jnp.int32),
                _abstract((), jnp.int32, replicated), jax.tree.map(lambda _: _abstract((), jnp.float32, replicated),
                                                                   dec.sampling_params()))
        segment = Program("decode segment", s.name, mesh, dec.segment_jit, args, dict(settings=settings), resident,
                          rows, length)
        out += [prefill, layers, start, segment]
    return out


def _hosts_of(mesh) -> int:
    return len({d.process_index for d in mesh.devices.flat})


def _update_programs(config, s: PoolState, others, sampling, vocab_limit, tx) -> list[Program]:
    r, o = config.rollout, config.optim
    how = scoring_of(scored_as(config, sampling), vocab_limit)
    loss = config.loss
    logprobs_fn, update_fn = update_steps(s.graphdef, tx, loss, config.loss.logprob_chunk, how,
                                          train_head=not jax.tree.leaves(s.frozen),
                                          compiler_options=pool_compiler_options(s.mesh))
    width = length_bucket(r.max_prompt_len + config.rollout.longest_response())
    rows = length_bucket(o.mini_batch_size, 1)
    rows = -(-max(rows, batch_shards(s.mesh)) // batch_shards(s.mesh)) * batch_shards(s.mesh)
    scored = min(fine_bucket(config.rollout.longest_response(), 8, per_octave=4), width)
    penalty = how.repetition_penalty
    logps = 2 if config.loss.kl_coef else 1
    old = Program("old log-probs", s.name, s.mesh, logprobs_fn,
                  (s.train.params, _packed(s.mesh, rows, width, scored, o.mini_batch_size, penalty, 0), s.frozen), {},
                  _resident(s, others, "log-probs"), rows, width)
    update = Program("update", s.name, s.mesh, update_fn,
                     (s.train, _packed(s.mesh, rows, width, scored, o.mini_batch_size, penalty, logps, loss), s.frozen),
                     {},
                     _resident(s, others, "update"), rows, width)
    return [old, update]
