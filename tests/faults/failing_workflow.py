"""The demo's workflow with an environment step that fails during training step FAIL_AT_STEP (an
environment variable; unset: it never does) as a reward function or a user's environment would:
FAIL_KIND "reward" raises a RewardError (one line), "bug" a RuntimeError (a traceback), "slow" takes
60 s (a slow reward call or sandboxed program), first creating the file FAIL_MARKER. Named by import
path: --config.env.workflow=failing_workflow:make."""
import os
import time

import numpy as np

from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.errors import RewardError
from atgrpo_jax.train.step import TRAIN_TASK_STRIDE


class Failing:
    def __init__(self, wf):
        self.wf = wf
        self.agents, self.max_turns, self.name, self.splits = wf.agents, wf.max_turns, wf.name, wf.splits
        self.fail = False

    def __getattr__(self, name):
        return getattr(self.wf, name)

    def reset(self, task_ids, split):
        at = int(os.environ.get("FAIL_AT_STEP", "0"))  # step s draws tasks from s * TRAIN_TASK_STRIDE on
        first = int(np.min(task_ids))
        self.fail = split == "train" and at > 0 and at * TRAIN_TASK_STRIDE <= first < (at + 1) * TRAIN_TASK_STRIDE
        return self.wf.reset(task_ids, split)

    def step(self, state, agent, turn, responses):
        if self.fail:
            if os.environ.get("FAIL_KIND") == "slow":
                open(os.environ["FAIL_MARKER"], "w").close()
                time.sleep(60)
            elif os.environ.get("FAIL_KIND", "reward") == "bug":
                raise RuntimeError("the environment broke")
            else:
                raise RewardError("env.kwargs.reward_fn='mine:score' raised ZeroDivisionError: division by zero")
        return self.wf.step(state, agent, turn, responses)


def make(single_agent=False, **kwargs):
    return Failing(make_workflow("plan_path_demo", single_agent=single_agent, **kwargs))
