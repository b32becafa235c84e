"""AT-GRPO on code with qwen3-1.7b as in the paper's system.

Set model.hf_path to the Qwen3 checkpoint directory; the regime is one field
(shared, per_role, lora, single_agent, plain_grpo), e.g. --config.regime=per_role.
"""
from atgrpo_jax.train.config import paper_config


def get_config():
    c = paper_config("code", "qwen3-1.7b")
    c.regime = "shared"
    return c
