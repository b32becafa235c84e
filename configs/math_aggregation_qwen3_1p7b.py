"""Math aggregation with Qwen3-1.7B: three roles (reasoner, tool agent, aggregator), one model each.

The math task's settings (atgrpo_jax/train/paper.py) in one round of envs/math_aggregation.py: the
reasoner and the tool agent solve the problem independently, the aggregator reads both and answers.
Weights: --config.model.hf_path; teams of three and more: docs/guides/teams.md."""
from atgrpo_jax.train.paper import paper_config


def get_config():
    c = paper_config("math", "qwen3-1.7b")
    c.env.workflow = "math_aggregation"
    c.env.kwargs.update(tool_first=False, simultaneous=False)  # one round: the two solvers never see each other
    c.rollout.max_turns = 1
    c.policy.sharing = "per_role"
    return c
