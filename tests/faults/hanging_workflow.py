"""The demo's workflow with an environment step that hangs (a stuck sandbox wait): for the CLI test of
system.stage_timeout_s. Named by import path: --config.env.workflow=hanging_workflow:make."""
import time

from atgrpo_jax.envs.registry import make_workflow

CALLS_PER_STEP = 8  # tiny config: 2 turns x 2 agents x 2 cohorts (of one task each)


class Hanging:
    def __init__(self, wf):
        self.wf = wf
        self.agents, self.max_turns, self.name, self.splits = wf.agents, wf.max_turns, wf.name, wf.splits

    def __getattr__(self, name):
        return getattr(self.wf, name)

    calls = 0

    def step(self, state, agent, turn, responses):
        Hanging.calls += 1
        if Hanging.calls > CALLS_PER_STEP:  # step 2: step 1 compiled everything, so no stage is slow but this
            time.sleep(600)
        return self.wf.step(state, agent, turn, responses)


def make(single_agent=False, **kwargs):
    return Hanging(make_workflow("plan_path_demo", single_agent=single_agent, **kwargs))
