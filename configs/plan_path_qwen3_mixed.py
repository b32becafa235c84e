"""A team of unequal models on Plan-Path: the plan agent a Qwen3-1.7B, the tool agent a Qwen3-0.6B, one
policy per role (policy.role_models), otherwise the paper's 1.7B settings. Both checkpoints are given:

    python -m atgrpo_jax.train --config=configs/plan_path_qwen3_mixed.py --workdir=runs/mixed \\
        --config.model.hf_path=CKPT_1P7B --config.policy.role_models.tool.hf_path=CKPT_0P6B

`python -m atgrpo_jax.plan --config=configs/plan_path_qwen3_mixed.py --compile=v5p-8` compiles each
role's programs for its own model."""
import ml_collections

from atgrpo_jax.train.paper import paper_config


def get_config():
    c = paper_config("plan_path", "qwen3-1.7b")
    c.policy.sharing = "per_role"
    c.policy.role_models = ml_collections.ConfigDict({"tool": {"preset": "qwen3-0.6b"}})
    return c
