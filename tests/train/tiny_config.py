"""A training config small enough for tests: the demo task, 2 tasks x 2 branches, 2 turns."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "configs"))
from demo import get_config as demo_config  # noqa: E402


def get_config():
    c = demo_config()
    c.model.preset = "demo-tiny"
    c.rollout.update(num_tasks=2, k=2, max_turns=2)
    c.optim.mini_batch_size = 8
    c.train.update(steps=4, eval_every=2, eval_tasks=4, checkpoint_every=1, keep_last=3, time_budget_s=0.0)
    return c


def tiny(**changes):
    """The tests' one tiny config: get_config() with dotted changes at any depth, e.g.
    tiny(**{"train.steps": 2, "policy.sharing": "per_role", "recipe": "reference"})."""
    c = get_config()
    for key, value in changes.items():
        *path, leaf = key.split(".")
        node = c
        for name in path:
            node = node[name]
        node[leaf] = value
    return c
