"""Roles that differ: which agents train at a step (`policy.phases`, as PettingLLMs alternates the roles
it trains), each role's own optimizer settings (`policy.role_optim`) and model (`policy.role_models`: a
team of unequal models, as the paper's L3 and MARTI's)."""
from __future__ import annotations

import copy
from typing import Sequence

import ml_collections

ROLE_OPTIM_KEYS = ("lr", "schedule", "warmup_steps", "min_lr_ratio", "weight_decay", "grad_clip", "b1", "b2")
# the keys that say which weights a role's model has; the rest of `model` (attention, unrolls, ...) is the run's
ROLE_MODEL_KEYS = ("preset", "hf_path", "init", "init_from", "param_dtype", "compute_dtype", "remat", "vocab_size",
                   "init_seed")


def phase_agents(config, step: int) -> tuple[str, ...] | None:
    """The agents that train at training step `step` (1-based) under policy.phases: the phases take
    turns, policy.phase_steps steps each, the first at step 1; None: no schedule (every agent)."""
    phases = config.policy.phases
    if not phases:
        return None
    phase = ((step - 1) // config.policy.phase_steps) % len(phases)
    return tuple(name.strip() for name in phases[phase].split("+"))


def trained_agents(config, names: Sequence[str], step: int) -> list[bool]:
    """Per agent: are its samples trained on at `step`? Not when it is in policy.frozen_agents, nor
    when the step's phase leaves it out."""
    now = phase_agents(config, step)
    return [name not in config.policy.frozen_agents and (now is None or name in now) for name in names]


def role_optim(config, role: str | None) -> ml_collections.ConfigDict:
    """The optimizer settings of `role`'s policy: config.optim with the role's policy.role_optim keys
    (None, or a role with none: config.optim as it is)."""
    own = config.policy.role_optim.get(role) if role is not None else None
    if not own:
        return config.optim
    optim = ml_collections.ConfigDict(config.optim.to_dict())
    optim.update(dict(own))
    return optim


def role_config(config, role: str | None):
    """`config` with `role`'s policy.role_models keys in its model section (a copy; `config` itself when the
    role has none). A role naming its architecture (preset) or checkpoint (hf_path) has its own weights:
    it does not inherit the run's hf_path or init_from, and a checkpoint without a preset brings its own
    architecture, not the run's preset."""
    own = config.policy.role_models.get(role) if role is not None else None
    if not own:
        return config
    c = copy.deepcopy(config)
    with c.unlocked():
        if "preset" in own or "hf_path" in own:
            c.model.update(hf_path="", init_from="", preset="" if "preset" not in own else c.model.preset)
        c.model.update(dict(own))
    return c


def roles_problem(config, names: Sequence[str], per_agent: bool) -> str | None:
    """What is wrong with the role keys for a workflow with agents `names` (None: nothing): unknown
    agents, a phase that trains nobody, optimizer keys a role cannot set, role_optim without a policy
    per agent."""
    p = config.policy
    for i, phase in enumerate(p.phases):
        agents = [a.strip() for a in str(phase).split("+")]
        unknown = [a for a in agents if a not in names]
        if unknown:
            return f"policy.phases[{i}]: {unknown} are not agents ({list(names)}); join several with '+'"
    for role, keys in p.role_optim.items():
        if role not in names:
            return f"policy.role_optim.{role}: not an agent ({list(names)})"
        bad = sorted(set(keys) - set(ROLE_OPTIM_KEYS))
        if bad:
            return f"policy.role_optim.{role}: {bad} cannot differ per role; known: {', '.join(ROLE_OPTIM_KEYS)}"
    for role in p.role_models:
        if role not in names:
            return f"policy.role_models.{role}: not an agent ({list(names)})"
    if p.role_optim and not per_agent:
        return (f"policy.role_optim: policy.sharing={p.sharing!r} trains one policy for every agent; "
                "per_role or lora gives each agent its own")
    return None
