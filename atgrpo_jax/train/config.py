"""The training config: every number a user sets, its default and what it means.

Config files in `configs/` start from `base_config()` (an ml-collections ConfigDict, the file format
and the command line's `--config.KEY=VALUE` edge) and change what their task needs. `resolve`
(validate.py) converts it once into a typed `Config`: frozen sections defined next to the code that
reads them, each field carrying its documentation (the config reference, `config_docs.py`), its
checks and whether a resumed run may change it (`RESUMABLE`).
"""
from __future__ import annotations

import dataclasses
import functools

import ml_collections

from atgrpo_jax.algo.loss import LossSettings
from atgrpo_jax.algo.section import AlgoSettings
from atgrpo_jax.cli import OPEN_SECTIONS
from atgrpo_jax.distributed import DistributedSettings
from atgrpo_jax.envs.section import EnvSettings
from atgrpo_jax.envs.workflow import RECIPES
from atgrpo_jax.errors import ConfigError  # noqa: F401  (raised here; also importable from here)
from atgrpo_jax.models.architecture import model_architecture
from atgrpo_jax.models.model_config import Qwen3Config
from atgrpo_jax.models.section import LoraSettings, ModelSettings
from atgrpo_jax.rollout.section import AgentSampling, RolloutSettings, SystemSettings
from atgrpo_jax.typed_config import Section, key, resumable, sub
from atgrpo_jax.sharding import MeshSettings
from atgrpo_jax.train.roles import Layout, RoleSchedule, role_config, role_optim
from atgrpo_jax.train.section import (OptimSettings, PolicySettings, ReferenceSettings, SHARINGS,  # noqa: F401
                                       SftSettings, Sharing, TrainSettings)

__all__ = ["AgentSampling", "Config", "ConfigError", "SHARINGS", "Sharing", "base_config"]


@dataclasses.dataclass(frozen=True)
class Config(Section):
    """A run's config, typed and checked: what `resolve` returns and every part of a run reads."""

    model: ModelSettings = sub(ModelSettings, "the policy model (Qwen3)")
    tokenizer: str = key("qwen3", '"qwen3" (offline, or model.hf_path\'s own), "char", or a directory (or hub id) '
                         "with tokenizer files")
    char_alphabet: str = key("", 'the char tokenizer\'s characters ("" = printable ASCII and newline)')
    mesh: MeshSettings = sub(MeshSettings, "device mesh (see atgrpo_jax/sharding.py); -1 = all remaining devices",
                           resumable=True)  # where it runs, not what it computes
    env: EnvSettings = sub(EnvSettings, "the task and its agents")
    policy: PolicySettings = sub(PolicySettings, "who shares weights")
    recipe: str = key("paper", '"paper": the paper\'s intent with the reference system\'s bugs fixed; "reference": '
                      'PettingLLMs as it runs (docs/paper.md "Recipes"): every switch left at None below, and the '
                      "workflow's own (env.kwargs, see each workflow), take the reference's behaviour", choices=RECIPES)
    reference: ReferenceSettings = sub(ReferenceSettings, "one switch per difference from the reference that is a "
                                       "run setting; None: as `recipe` says, True: the reference's behaviour, False: "
                                       "this project's")
    regime: str = key("", "shorthand expanded once by resolve(): shared, per_role, lora, shared_lora, single_agent, "
                      "plain_grpo (see REGIMES)")
    rollout: RolloutSettings = sub(RolloutSettings, "sampling of training episodes")
    algo: AlgoSettings = sub(AlgoSettings, "rewards, advantages, group filters")
    loss: LossSettings = sub(LossSettings, "the clipped policy-gradient loss")
    optim: OptimSettings = sub(OptimSettings, "AdamW")
    system: SystemSettings = sub(SystemSettings, "how a step's work is scheduled (atgrpo_jax/rollout/dispatch.py)")
    lora: LoraSettings = sub(LoraSettings, 'adapters (policy.sharing = "lora" or "shared_lora")')
    train: TrainSettings = sub(TrainSettings, "the run")
    sft: SftSettings = sub(SftSettings, "supervised warm start, `python -m atgrpo_jax.sft` (docs/guides/sft.md); it "
                           "also reads model.*, tokenizer, rollout.thinking (the chat template's), optim.*, train.seed, "
                           "train.checkpoint_every, train.keep_last, train.loggers")
    distributed: DistributedSettings = sub(DistributedSettings, "several processes (hosts); see "
                                           "atgrpo_jax/distributed.py", resumable=True)

    # Facts derived from the keys, each in one place and once per config (`resolve` derives the role views,
    # optimizers and schedule before it returns, so their errors come first); every part of a run reads
    # these instead of deriving them again.

    @functools.cached_property
    def role_views(self) -> dict[str, "Config"]:
        """{role: this config with the role's policy.role_models keys in its model section} (roles.role_config)."""
        return {role: role_config(self, role) for role in self.policy.role_models}

    def role(self, name: str | None) -> "Config":
        """The config agent `name`'s model is built from: its role view, or this config when it has none."""
        return self.role_views.get(name, self)

    @functools.cached_property
    def role_optims(self) -> dict[str, OptimSettings]:
        """{role: its policy's optimizer settings} of the roles with policy.role_optim keys."""
        return {role: role_optim(self, role) for role in self.policy.role_optim}

    def optim_of(self, name: str | None) -> OptimSettings:
        """The optimizer settings of agent `name`'s policy (config.optim unless the role has its own)."""
        return self.role_optims.get(name, self.optim)

    @functools.cached_property
    def role_schedule(self) -> RoleSchedule:
        """Which agents train at each step (policy.phases, policy.frozen_agents)."""
        return RoleSchedule.of(self.policy)

    @functools.cached_property
    def architecture(self) -> Qwen3Config:
        """The model the `model` section names, as models/architecture.py maps it (a preset, or the
        checkpoint's config.json): read on first use, since a checkpoint's config is a file."""
        return model_architecture(self.model)

    @functools.cached_property
    def roles(self) -> tuple[str, ...]:
        """The workflow's roles in turn order (envs/workflow_registry.py `workflow_roles`: known without the
        data for the built-in workflows; a workflow of yours is built once to ask it)."""
        from atgrpo_jax.envs.workflow_registry import workflow_roles  # (when asked: it loads every workflow)
        return tuple(workflow_roles(self.env.workflow, self.env.single_agent, self.recipe, **dict(self.env.kwargs)))

    def layout(self, agents: int) -> Layout:
        """How `agents` agents map onto trained weights and device pools (policy.sharing, policy.pools)."""
        routing = self.policy.routing
        return Layout(tuple(int(p) for p in routing.route(agents)), routing.lora, self.policy.pools)


def base_config() -> ml_collections.ConfigDict:
    """Every key at its default, as the ConfigDict that config files and --config.KEY=VALUE change."""
    return as_configdict(Config())


def as_configdict(section: Section) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, Section):
            value = as_configdict(value)
        elif isinstance(value, dict):
            value = ml_collections.ConfigDict(value)
        c[f.name] = value
    return c


# The keys a resumed run may change (how long, how often, where; never the math), from the sections'
# fields; a train run reads none of the sft command's keys.
RESUMABLE = resumable(Config) + ("sft.",)


# The shorthand `regime` -> the three settings it stands for.
REGIMES = {
    "shared": {"policy.sharing": "shared", "rollout.tree": True, "env.single_agent": False},
    "per_role": {"policy.sharing": "per_role", "rollout.tree": True, "env.single_agent": False},
    "lora": {"policy.sharing": "lora", "rollout.tree": True, "env.single_agent": False},
    "shared_lora": {"policy.sharing": "shared_lora", "rollout.tree": True, "env.single_agent": False},
    "single_agent": {"policy.sharing": "shared", "rollout.tree": True, "env.single_agent": True},
    "plain_grpo": {"policy.sharing": "shared", "rollout.tree": False, "env.single_agent": False},
}


# ---------------------------------------------------------------- configs saved by earlier versions

def upgrade(saved: dict) -> dict:
    """A config dict (e.g. a run's config.json) written by an earlier version, in today's keys:
    `regime` and `policy_pools` became policy.sharing / rollout.tree / env.single_agent /
    policy.pools; `algo.use_std` became algo.advantage."""
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in saved.items()}
    regime = d.get("regime", "")
    if "policy_pools" in d:
        d.setdefault("policy", {})["pools"] = bool(d.pop("policy_pools"))
    if regime in REGIMES:
        for name, value in REGIMES[regime].items():
            section, leaf = name.split(".")
            d.setdefault(section, {})[leaf] = value
        d["regime"] = ""
    algo = d.get("algo", {})
    if "use_std" in algo:
        algo["advantage"] = "grpo" if algo.pop("use_std") else "drgrpo"
    return d


def from_saved(saved: dict) -> ml_collections.ConfigDict:
    """A run's saved config (its config.json, of this or an earlier version) as today's ConfigDict."""
    c = base_config()
    _merge(c, upgrade(saved), "")
    return c


def _merge(c: ml_collections.ConfigDict, d: dict, prefix: str):
    for name, value in d.items():
        if name not in c:
            raise ConfigError(f"config.{prefix}{name}: in the saved config but not a name of this version")
        if f"{prefix}{name}" in OPEN_SECTIONS:  # keys the user chose (agent names, kwargs): the saved ones
            c[name] = ml_collections.ConfigDict(value)
        elif isinstance(c[name], ml_collections.ConfigDict):
            _merge(c[name], value, f"{prefix}{name}.")
        else:
            c[name] = tuple(value) if isinstance(c[name], tuple) and isinstance(value, list) else value


def flat(c) -> dict:
    """{dotted name: value} of every leaf (env.kwargs as one dict) of a Config or a ConfigDict."""
    return _flat(c.to_dict(), "")


def _flat(d: dict, prefix: str) -> dict:
    out = {}
    for name, value in d.items():
        if isinstance(value, dict) and name != "kwargs":
            out.update(_flat(value, f"{prefix}{name}."))
        else:
            out[prefix + name] = value
    return out


def changed_keys(saved, now) -> dict[str, tuple]:
    """{name: (saved value, current value)} of the keys that differ, both resolved."""
    a, b = flat(saved), flat(now)
    norm = lambda v: list(v) if isinstance(v, tuple) else v
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if norm(a.get(k)) != norm(b.get(k))}
