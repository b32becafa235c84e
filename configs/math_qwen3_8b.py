"""AT-GRPO on math with qwen3-8b as in the paper's system.

Set model.hf_path to the Qwen3 checkpoint directory; the regime is one field
(shared, per_role, lora, single_agent, plain_grpo), e.g. --config.regime=per_role.
"""
from atgrpo_jax.train.config import paper_config


def get_config():
    c = paper_config("math", "qwen3-8b")
    c.regime = "shared"
    return c
