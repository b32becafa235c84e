"""Everything a run is built from, made from a validated config."""
from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from transformers import PreTrainedTokenizerFast

from atgrpo_jax.algo.logprobs import SampledFrom
from atgrpo_jax.distributed import init_distributed, is_multiprocess, local_mesh
from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.envs.workflow import Workflow
from atgrpo_jax.models import Qwen3, get_preset
from atgrpo_jax.models.architecture import run_fields
from atgrpo_jax.models.attention import configured_backend
from atgrpo_jax.models.hf_io import load_pretrained
from atgrpo_jax.models.hub_ids import local_model_dir
from atgrpo_jax.models.tokenizer import char_tokenizer, checkpoint_tokenizer, encode_chat, qwen3_tokenizer
from atgrpo_jax.models.trimmed import is_trimmed, load_trimmed
from atgrpo_jax.sampling import shard_model
from atgrpo_jax.sharding import make_mesh, platform_of, sub_meshes
from atgrpo_jax.train import compile_cache
from atgrpo_jax.errors import CheckpointError
from atgrpo_jax.train.config import AgentSampling, Config, ConfigError
from atgrpo_jax.train.init_from import load_weights
from atgrpo_jax.train.policies import Policy, PolicySpec, build_policies
from atgrpo_jax.train.roles import model_key, roles_problem, scheduler_turns
from atgrpo_jax.train.update import make_optimizer


@dataclasses.dataclass
class Run:
    """A run's parts, built once from its resolved config: what every step, evaluation and export reads."""

    config: Config
    mesh: Mesh  # every device of the run (a per-role run with policy.pools cuts it into each policy's pool)
    tokenizer: PreTrainedTokenizerFast  # one for every agent (the roles' models share its embedding rows)
    workflow: Workflow
    policies: list[Policy]
    policy_of_agent: np.ndarray
    stop_ids: tuple[int, ...]
    lr_schedules: list  # per policy: training step (1-based) -> its learning rate (policy.role_optim)
    sampling: list[AgentSampling]  # per agent, in training
    eval_sampling: list[AgentSampling]  # per agent, in evaluation (rollout.eval_*)
    scored_as: list[AgentSampling]  # per agent, the distribution the update scores its tokens under
    ref_params: dict = dataclasses.field(default_factory=dict)  # policy name -> frozen params (KL)
    warned: set = dataclasses.field(default_factory=set)  # prompt warnings already printed

    def encode(self, messages, agent: int = 0) -> list[int]:
        """Agent `agent`'s chat prompt ids (its thinking mode), cut from the left to rollout.max_prompt_len."""
        ids = encode_chat(self.tokenizer, messages, enable_thinking=self.sampling[agent].thinking)
        limit = self.config.rollout.max_prompt_len
        for kind, text in prompt_warnings(self.tokenizer, messages, len(ids), limit, f"agent {agent}", self.warned):
            if kind not in self.warned and jax.process_index() == 0:  # once per run and kind: not per prompt
                self.warned.add(kind)
                print(f"warning: {text}", file=sys.stderr, flush=True)
        return ids[-limit:]


def prompt_warnings(tokenizer, messages, length: int, limit: int, who: str, said=()) -> list[tuple[str, str]]:
    """(kind, message) for what would silently change a prompt: characters a vocabulary has no id for
    (they become <unk>) and a prompt longer than rollout.max_prompt_len (its start is cut). Kinds in
    `said` are not looked for again (the unk check encodes the prompt a second time)."""
    out = []
    unk = tokenizer.unk_token_id
    if unk is not None and "unk" not in said:
        text = "".join(str(m.get("content", "")) for m in messages)
        missing = []  # encoded, not looked up: a byte-level BPE has no token " " (it is "Ġ") yet encodes it
        if unk in tokenizer(text, add_special_tokens=False)["input_ids"]:
            missing = sorted(ch for ch in set(text) if unk in tokenizer(ch, add_special_tokens=False)["input_ids"])
        if missing:
            out.append(("unk", f"{who}'s prompt has characters the tokenizer has no id for: {''.join(missing)!r}; "
                               "they become <unk> (add them to char_alphabet)"))
    if length > limit:
        out.append(("cut", f"{who}'s prompt has {length} tokens, cut from the left to rollout.max_prompt_len="
                           f"{limit} (raise it to keep the whole prompt)"))
    return out


def make_tokenizer(name: str, hf_path: str = "", alphabet: str = ""):
    if name == "char":
        return char_tokenizer(alphabet) if alphabet else char_tokenizer()
    if name == "qwen3":  # model.hf_path's own when it has one (a Llama's, an export's), else Qwen3's
        return checkpoint_tokenizer(local_model_dir(hf_path)) if hf_path else qwen3_tokenizer()
    name = local_model_dir(name, "tokenizer")
    if os.path.isdir(name) and is_trimmed(name):  # Qwen3's tokens a corpus uses, renumbered
        return load_trimmed(name)
    if os.path.isdir(name):  # a checkpoint's: Qwen3's, or a Llama / Qwen2 checkpoint's own
        return checkpoint_tokenizer(name)
    raise ConfigError(f"config.tokenizer: {name!r} is not 'char', 'qwen3', a checkpoint directory or a hub id")


def build_model(config, mesh, hf_key: str = "model.hf_path") -> Qwen3:
    """config.model's Qwen3 on `mesh`: model.hf_path's weights, else random ones (hf_key: where the path
    was given, for its errors)."""
    m = config.model
    attention = configured_backend(m.attention, platform_of(mesh), config.optim.share_prompts)
    if m.hf_path:
        sized = {"vocab_size": m.vocab_size} if m.vocab_size else {}  # the preset as the config sizes it
        expected = get_preset(m.preset, **sized) if m.preset else None
        local = local_model_dir(m.hf_path, hf_key)
        if not os.path.isdir(local):
            raise CheckpointError(f"config.{hf_key}={m.hf_path!r}: no such directory (nor a hub id)")
        return load_pretrained(local, mesh=mesh, expected=expected,
                               expected_name=f"model.preset={m.preset!r}", **run_fields(m, attention))
    return shard_model(Qwen3(config.architecture.replace(attention=attention), rngs=nnx.Rngs(m.init_seed)), mesh)


def scored_as(config, sampling: list[AgentSampling]) -> list[AgentSampling]:
    """The distribution the update scores each agent's tokens under: the one it sampled from, or with
    reference.logprobs_at_t1 (as the reference's trainer) temperature 1 with no filter or penalty."""
    if not config.reference.logprobs_at_t1:
        return sampling
    return [dataclasses.replace(s, temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0) for s in sampling]


def scoring_of(scored: list[AgentSampling], vocab_limit: int | None) -> SampledFrom:
    """The static part of `scored_as`'s distributions (what the update's programs are compiled for)."""
    return SampledFrom(vocab_limit=vocab_limit, top_k=max(s.top_k for s in scored),
                       top_p=any(s.top_p < 1 for s in scored),
                       repetition_penalty=any(s.repetition_penalty != 1 for s in scored))


def starting_model(config, mesh, init_from: bool = False, role: str | None = None) -> Qwen3:
    """`build_model`, with `init_from` and config.model.init_from set the weights of that run's newest
    checkpoint (train/init_from.py): a run's start; a resumed run's checkpoint replaces them anyway.
    role: the agent whose model this is (`config` is its `Config.role` view), for errors naming its keys."""
    model = build_model(config, mesh, model_key(config, role, "hf_path"))
    if init_from and config.model.init_from:
        model = load_weights(model, config.model.init_from, "config." + model_key(config, role, "init_from"))
    return model


def role_model(config, names, i: int, mesh, init_from: bool, first: Qwen3) -> Qwen3:
    """Agent i's starting model (its policy.role_models entry, else the run's model); every role's model has
    the first's embedding rows, as one tokenizer and one sampling distribution serve them all."""
    model = starting_model(config.role(names[i]), mesh, init_from, names[i])
    if model.cfg.vocab_size != first.cfg.vocab_size:
        raise ConfigError(f"config.policy.role_models: {names[i]}'s model has {model.cfg.vocab_size} embedding rows, "
                          f"{names[0]}'s {first.cfg.vocab_size}; the roles share one tokenizer, so they must agree")
    return model


def build_run(config: Config, workdir: str | None = None, *, init_from: bool = False) -> Run:
    """Everything a run needs from its resolved config (`validate.resolve`, which each command calls once);
    with `workdir`, the run's compilation cache is switched on first (`compile_cache`: before anything
    compiles). init_from: every policy (LoRA: the base) starts from config.model.init_from's weights (the
    trainer's fresh start; a command that restores a checkpoint of its own, as export and evaluate do,
    needs no such run)."""
    if not isinstance(config, Config):
        raise TypeError(f"build_run takes a resolved Config (train.validate.resolve), not a {type(config).__name__}")
    init_distributed(config.distributed)
    if workdir is not None:
        compile_cache.enable(config.train.compile_cache, workdir)
    mesh = make_mesh(config.mesh)
    if is_multiprocess():
        n = jax.process_count()
        for key, tasks in (("rollout.num_tasks", config.rollout.num_tasks), ("train.eval_tasks", config.train.eval_tasks)):
            if tasks % n:
                raise ConfigError(f"config.{key}: {tasks} tasks cannot be split evenly over {n} processes")
    tokenizer = make_tokenizer(config.tokenizer, config.model.hf_path, config.char_alphabet)
    try:
        workflow = make_workflow(config.env.workflow, single_agent=config.env.single_agent, recipe=config.recipe,
                                 **dict(config.env.kwargs))
    except ValueError as e:
        raise ConfigError(f"config.{e}" if str(e).startswith("env.") else f"config.env: {e}") from None
    declared = getattr(workflow, "max_turns", None)
    if declared and config.rollout.max_turns < declared and (
            "max_turns" in config.env.kwargs or config.env.workflow.startswith("py:")):
        raise ConfigError(f"config.rollout.max_turns: {config.rollout.max_turns} would cut {config.env.workflow}'s "
                          f"episodes of {declared} turns short; raise it to {declared} (or give the workflow fewer)")
    names = [a.name for a in workflow.agents]
    for key, given in (("rollout.agents", set(config.rollout.agents)), ("policy.frozen_agents",
                                                                          set(config.policy.frozen_agents)),
                       ("algo.role_advantage", set(config.algo.role_advantage))):
        if given - set(names):
            raise ConfigError(f"config.{key}: {sorted(given - set(names))} are not agents of "
                              f"{config.env.workflow} ({names})")
    problem = roles_problem(config, names, config.policy.routing.per_agent)
    if problem:
        raise ConfigError(f"config.{problem}")
    sampling = [config.rollout.agent(n) for n in names]
    layout = config.layout(len(names))
    try:
        pools = sub_meshes(mesh, layout.pools) if layout.pools > 1 else [mesh] * len(names)
        local_meshes = [local_mesh(m) if is_multiprocess() else None for m in pools]
    except ValueError as e:
        raise ConfigError(f"config.mesh: {e}") from None
    base = starting_model(config.role(names[0]), pools[0], init_from, names[0])
    if base.cfg.vocab_size < len(tokenizer):
        raise ConfigError(f"config.model: vocab_size {base.cfg.vocab_size} < tokenizer size {len(tokenizer)}")
    limit = len(tokenizer) if len(tokenizer) < base.cfg.vocab_size else None  # as the sampler's (rollout.router)
    scored = scored_as(config, sampling)
    how = scoring_of(scored, limit)
    route = np.asarray(layout.policy_of_agent)
    per_agent_pool = layout.per_agent  # one policy per agent: each on its agent's pool, with its role's optimizer
    turns = scheduler_turns(config, names, layout.policies)
    optimizers = [make_optimizer(config.optim_of(names[i] if per_agent_pool else None), config.train.steps,
                                 config.reference.lr_schedule, turns[i]) for i in range(layout.policies)]
    spec = PolicySpec(config.policy.routing, config.loss, config.lora.rank, config.lora.alpha, config.model.init_seed,
                      config.optim.master_dtype, how, "peft" if config.reference.peft_lora_init else "normal",
                      config.reference.shared_lora_samples_base)
    policies = build_policies(spec, base, names, lambda i: optimizers[i][0],
                              model_copy=lambda i: role_model(config, names, i, pools[i], init_from, base),
                              meshes=lambda i: (pools[i], local_meshes[i]) if per_agent_pool else
                              (mesh, local_meshes[0]))
    stops = tuple(sorted({tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}))
    # The KL reference is the starting policy; nothing is kept when the KL is off.
    ref = {p.name: jax.tree.map(jnp.copy, p.state.params) for p in policies} if config.loss.kl_coef else {}
    return Run(config, mesh, tokenizer, workflow, policies, route, stops, [lr for _, lr in optimizers], sampling,
               [config.rollout.agent(n, evaluation=True) for n in names], scored, ref)
