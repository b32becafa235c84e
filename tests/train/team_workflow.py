"""A team of any size for the tests: N roles relay an answer for two turns (the demo's characters only).
Named by import path: --config.env.workflow=team_workflow:make, env.kwargs.roles=N."""
from atgrpo_jax.envs.episode import EpisodeWorkflow


class Relay:
    """Role i sees the last answer and says something; its own reward counts the "U"s it said, the team's
    is whether the answer has an even length: both vary over K branches, so every group learns."""

    max_turns = 2
    splits = {"test": 4}

    def __init__(self, roles: int):
        self.roles = tuple(f"r{i}" for i in range(roles))

    def reset(self, task, split):
        return {"last": str(task % 10)}

    def prompt(self, role, turn, state):
        return [{"role": "user", "content": f"{self.roles.index(role)}{turn}:{state['last']}"}]

    def step(self, role, turn, state, text):
        state["last"] = "".join(c for c in text if c in "UDLR0123456789")[:4]  # (no <unk> into the next prompt)
        return state, float(text.count("U")), float(len(text) % 2 == 0), False


def make(single_agent=False, roles=3, **demo_settings):
    """(demo_settings: the demo config's env.kwargs, for its own workflow: a relay has none.)"""
    return EpisodeWorkflow(Relay(1 if single_agent else int(roles)))
