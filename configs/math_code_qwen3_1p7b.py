"""Math and code trained together with Qwen3-1.7B (env.workflow = "mixture", as PettingLLMs' mixed
environment): each workflow with its paper settings, drawn equally often; the rollout and optimizer
settings are the math run's (docs/guides/multi-agent.md, "Several tasks in one run")."""
import ml_collections

from atgrpo_jax.train.paper import paper_config


def get_config():
    c = paper_config("math", "qwen3-1.7b")
    parts = {task: dict(paper_config(task, "qwen3-1.7b").env.kwargs) for task in ("math", "code")}
    c.env.workflow = "mixture"
    c.env.kwargs = ml_collections.ConfigDict({"weights": {"math": 1.0, "code": 1.0}, **parts})
    return c
