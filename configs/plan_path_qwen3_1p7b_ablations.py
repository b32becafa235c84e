"""The paper's ablations on Plan-Path with Qwen3-1.7B, by name
(--config=configs/plan_path_qwen3_1p7b_ablations.py:NAME): "together" trains both roles (AT-GRPO,
one policy per role); "tool_alone" / "plan_alone" train one role in its single-agent environment (its
own actions play the game), as the paper does; "tool_beside_frozen" / "plan_beside_frozen" train one
role beside the other kept at the base model. Combine roles trained apart, or swap the roles of a run,
at evaluation: `evaluate --config=...:together --hf_path=BASE --policies=tool=TOOL_RUN:policy,plan=PLAN_RUN:policy`
(README, "Regimes and ablations")."""
from atgrpo_jax.train.paper import paper_config

ALONE = {"tool_alone": "tool", "plan_alone": "plan"}
FROZEN = {"together": (), "tool_beside_frozen": ("plan",), "plan_beside_frozen": ("tool",)}


def get_config(name: str = "together"):
    if name not in {**ALONE, **FROZEN}:
        raise ValueError(f"ablation {name!r}: choose one of {sorted({**ALONE, **FROZEN})}")
    c = paper_config("plan_path", "qwen3-1.7b")
    if name in ALONE:  # one agent, one policy: the role's single-agent environment
        c.env.single_agent, c.env.kwargs.alone = True, ALONE[name]
        return c
    c.policy.sharing = "per_role"
    c.policy.frozen_agents = FROZEN[name]
    return c
