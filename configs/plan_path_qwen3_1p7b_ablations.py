"""The paper's ablations on Plan-Path with Qwen3-1.7B and one policy per role, by name
(--config=configs/plan_path_qwen3_1p7b_ablations.py:NAME): "together" trains both roles (AT-GRPO
per_role), "tool_alone" / "plan_alone" train one role while the other stays the base model.
Combine the two roles trained alone, or swap the roles of a run, at evaluation (README, "Ablations")."""
from atgrpo_jax.train.config import paper_config

FROZEN = {"together": (), "tool_alone": ("plan",), "plan_alone": ("tool",)}


def get_config(name: str = "together"):
    c = paper_config("plan_path", "qwen3-1.7b")
    c.policy.sharing = "per_role"
    c.policy.frozen_agents = FROZEN[name]
    return c
