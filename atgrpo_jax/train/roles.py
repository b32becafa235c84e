"""Roles that differ: which agents train at a step (`policy.phases`, as PettingLLMs alternates the roles
it trains), each role's own optimizer settings (`policy.role_optim`) and model (`policy.role_models`: a
team of unequal models, as the paper's L3 and MARTI's)."""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from atgrpo_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class RoleSchedule:
    """Which agents train at each step (`Config.role_schedule`, derived once from the policy section): the
    phases of policy.phases take turns, policy.phase_steps steps each, the first at step 1, and an agent in
    policy.frozen_agents never trains (it still samples)."""

    phases: tuple[tuple[str, ...], ...] = ()  # each phase's agents, as named; () = every agent every step
    phase_steps: int = 1
    frozen: frozenset = frozenset()

    @classmethod
    def of(cls, policy) -> "RoleSchedule":
        phases = tuple(tuple(name.strip() for name in phase.split("+")) for phase in policy.phases)
        return cls(phases, policy.phase_steps, frozenset(policy.frozen_agents))

    def phase(self, step: int) -> tuple[str, ...] | None:
        """The agents of the phase of training step `step` (1-based); None: no schedule (every agent)."""
        if not self.phases:
            return None
        return self.phases[((step - 1) // self.phase_steps) % len(self.phases)]

    def trains(self, names: Sequence[str], step: int) -> list[bool]:
        """Per agent: are its samples trained on at `step`? Not when it is frozen, nor when the step's phase
        leaves it out."""
        now = self.phase(step)
        return [name not in self.frozen and (now is None or name in now) for name in names]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a run's agents map onto trained weights and devices (`Config.layout`): what the trainer builds
    (train/setup.py) and the planner plans (plan/memory.py), read from one place."""

    policy_of_agent: tuple[int, ...]  # [A] the policy that acts for (and learns from) each agent
    lora: bool  # the policies are adapters on one frozen shared base
    pooled: bool  # policy.pools: each policy on its own part of the mesh

    @property
    def policies(self) -> int:
        """Trained weight sets: full models, or adapters."""
        return max(self.policy_of_agent) + 1

    @property
    def per_agent(self) -> bool:
        """One policy per agent (each then on its agent's pool, with its role's optimizer)."""
        return self.policies == len(self.policy_of_agent)

    @property
    def pools(self) -> int:
        """The parts the mesh is cut into."""
        return self.policies if self.pooled else 1

    @property
    def adapter_sets(self) -> int:
        """Adapter sets on the shared base (1 for a layout of full models)."""
        return self.policies if self.lora else 1


def scheduler_turns(config, names: Sequence[str], policies: int) -> list[tuple[int, int]]:
    """Per policy, (its turn, turns per training step) on the learning-rate scheduler: (0, 1) each, its own
    scheduler stepped once per training step; with reference.shared_scheduler and one LoRA adapter per agent
    (L2), the reference's one scheduler, which every agent's update steps in turn, the agents in the order of
    their names and the frozen ones skipped (docs/paper.md, "Recipes", row 8): agent k of n trains step s at
    the scheduler's position (s - 1) * n + k. The paper workflows' names sort as the reference's do (plan
    before tool, reasoner before tool, coder before tester)."""
    sharing = config.policy.routing
    if not (config.reference.shared_scheduler and sharing.lora and sharing.per_agent and policies == len(names)):
        return [(0, 1)] * policies
    order = sorted(name for name in names if name not in config.policy.frozen_agents)
    return [(order.index(name), len(order)) if name in order else (0, 1) for name in names]


def role_optim(config, role: str | None):
    """The optimizer settings of `role`'s policy: config.optim with the role's policy.role_optim keys
    (None, or a role with none: config.optim as it is)."""
    own = config.policy.role_optim.get(role) if role is not None else None
    if not own:
        return config.optim
    return _as_role(lambda: config.optim.replace(**own), "optim", f"policy.role_optim.{role}")


def role_config(config, role: str | None):
    """`config` with `role`'s policy.role_models keys in its model section (`config` itself when the role
    has none). A role naming its architecture (preset) or checkpoint (hf_path) has its own weights: it does
    not inherit the run's hf_path or init_from, and a checkpoint without a preset brings its own
    architecture, not the run's preset."""
    own = config.policy.role_models.get(role) if role is not None else None
    if not own:
        return config
    changes = dict(own)
    if "preset" in own or "hf_path" in own:
        changes = {"hf_path": "", "init_from": "", "preset": config.model.preset if "preset" in own else "", **own}
    model = _as_role(lambda: config.model.replace(**changes), "model", f"policy.role_models.{role}")
    return config.replace(model=model)


def model_key(config, role: str | None, key: str) -> str:
    """Where `role`'s model key `key` (hf_path, init_from) is set: its own policy.role_models entry, else
    the run's model section (for errors that name it)."""
    own = config.policy.role_models.get(role) if role is not None else None
    return f"policy.role_models.{role}.{key}" if own and key in own else f"model.{key}"


def _as_role(build: Callable, section: str, where: str):
    """build(), its errors naming the role's keys (`where`) instead of the run's section."""
    try:
        return build()
    except ConfigError as e:
        raise ConfigError(str(e).replace(f"config.{section}.", f"config.{where}.")
                          .replace(f" {section}.", f" {where}.")) from None


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
    frozen = set(p.frozen_agents)
    if frozen >= set(names):
        return (f"policy.frozen_agents: every agent ({', '.join(names)}) is frozen, so the run would train nothing; "
                "leave at least one out")
    for i, phase in enumerate(p.phases):
        agents = [a.strip() for a in str(phase).split("+")]
        if frozen >= set(agents):
            return (f"policy.phases[{i}]: {'+'.join(agents)} {'is' if len(agents) == 1 else 'are all'} in "
                    "policy.frozen_agents, so its steps would train nothing; give it an agent that trains")
    for role, keys in p.role_optim.items():
        if role not in names:
            return f"policy.role_optim.{role}: not an agent ({list(names)})"
    for role in p.role_models:
        if role not in names:
            return f"policy.role_models.{role}: not an agent ({list(names)})"
    if p.role_optim and not per_agent:
        return (f"policy.role_optim: policy.sharing={p.sharing!r} trains one policy for every agent; "
                "per_role or lora gives each agent its own")
    return None
