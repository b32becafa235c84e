"""The architecture a training config names, as the planner and `plan --compile` build it: the model of a
preset or checkpoint, the attention backend its update runs, and the largest of its roles' models."""
from __future__ import annotations

from typing import Any

from atgrpo_jax.models.attention import configured_backend, resolve_backend
from atgrpo_jax.models.architecture import model_architecture
from atgrpo_jax.models.config import Qwen3Config
from atgrpo_jax.train.roles import role_config


def model_config(config) -> Qwen3Config:
    """The architecture a training config names (preset, or the HF checkpoint's config.json), as the trainer
    builds it (models/architecture.py), with the LoRA adapters of a LoRA layout."""
    return model_architecture(config.model, lora=config.lora if config.policy.routing.lora else None)


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
               enumerate([config] + [role_config(config, role) for role in roles])]
    size, _, largest = max(options)
    return largest, (f"policy.role_models: planned as if every role's model were the largest ({size:,} "
                     "parameters), an upper bound; plan --compile builds each role's own")
