"""The config's `env` section (atgrpo_jax/typed_config.py): the task and its agents."""
from __future__ import annotations

import dataclasses

from atgrpo_jax.typed_config import Section, key


@dataclasses.dataclass(frozen=True)
class EnvSettings(Section):
    PATH = "env"

    workflow: str = key("plan_path_tool_plan", "a registered workflow name (envs/workflow_registry.py) or "
                        '"package.module:factory"')
    single_agent: bool = key(False, "the workflow's one-agent variant (the paper's single-agent baseline)")
    kwargs: dict = key({}, "keyword arguments of the workflow's factory; any key may be set")
