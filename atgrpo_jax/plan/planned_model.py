"""The architecture a training config names, as the planner and `plan --compile` build it: the model of a
preset or checkpoint, the attention backend its update runs, and the largest of its roles' models."""
from __future__ import annotations

from typing import Any

from atgrpo_jax.models.attention import configured_backend, resolve_backend
from atgrpo_jax.models.model_config import Qwen3Config


def model_config(config) -> Qwen3Config:
    """The architecture a training config names (`Config.architecture`, the model the trainer builds), with
    the adapters of a LoRA layout (the trainer attaches them to that model: train/policies.py)."""
    if not config.policy.routing.lora:
        return config.architecture
    return config.architecture.replace(lora_rank=config.lora.rank, lora_alpha=config.lora.alpha)


def planned_backend(config, cfg: Qwen3Config, platform: str, seq: int) -> str:
    """The attention backend the update runs on `platform` (as train/setup.py and the model choose it)."""

    backend = configured_backend(config.model.attention, platform, config.optim.share_prompts)
    return resolve_backend(backend, seq, seq, cfg.dtype, cached=False, platform=platform)


def largest_role(config) -> tuple[Any, str]:
    """(config with the largest of its roles' models as the model of every role, a note saying so) with
    policy.role_models set: the plan is then an upper bound (`plan --compile` builds each role's own);
    (config, "") otherwise."""
    roles = list(config.policy.role_models)
    if not roles:
        return config, ""
    options = [(model_config(c).num_params(), i, c) for i, c in
               enumerate([config] + [config.role(role) for role in roles])]
    size, _, largest = max(options)
    return largest, (f"policy.role_models: planned as if every role's model were the largest ({size:,} "
                     "parameters), an upper bound; plan --compile builds each role's own")


def planned_roles(config) -> tuple[str, ...]:
    """The roles of the config's workflow, as the trainer will build it (envs/workflow_registry.py
    `workflow_roles`: known without the data for the built-in workflows): one model, adapter or pool each
    where the regime says so. A workflow of yours that cannot be built here is one error saying why."""
    env = config.env
    try:
        return config.roles  # made once per config: plan --compile asks three times
    except Exception as e:  # noqa: BLE001  (a workflow of yours: whatever it raises, said in one line)
        raise ValueError(f"env.workflow={env.workflow!r}: the plan counts its roles by building it here, which "
                         f"failed ({type(e).__name__}: {str(e)[:200]})") from None
