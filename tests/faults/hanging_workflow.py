"""The demo's workflow with an environment step that hangs from training step 2 on (a stuck sandbox
wait): for the CLI test of system.stage_timeout_s. Named by import path:
--config.env.workflow=hanging_workflow:make."""
import time

import numpy as np

from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.train.step import TRAIN_TASK_STRIDE


class Hanging:
    def __init__(self, wf):
        self.wf = wf
        self.agents, self.max_turns, self.name, self.splits = wf.agents, wf.max_turns, wf.name, wf.splits
        self.hang = False

    def __getattr__(self, name):
        return getattr(self.wf, name)

    def reset(self, task_ids, split):
        # step 2's tasks: step 1 compiled everything, so no stage but this one is slow
        self.hang = split == "train" and int(np.min(task_ids)) >= 2 * TRAIN_TASK_STRIDE
        return self.wf.reset(task_ids, split)

    def step(self, state, agent, turn, responses):
        if self.hang:
            time.sleep(600)
        return self.wf.step(state, agent, turn, responses)


def make(single_agent=False, **kwargs):
    return Hanging(make_workflow("plan_path_demo", single_agent=single_agent, **kwargs))
