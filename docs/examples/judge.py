"""Three roles, as math aggregation's at toy size (atgrpo_jax.Episode): two solvers each name the digit they
are asked for, each without seeing the other; a judge, who is shown their two answers and not the question,
gives the team's answer. Each role earns its own correctness; the team reward, and the success, are the
judge's. The judge can only be right by reading the solvers. docs/guides/teams.md has what it measured on
a 2-core CPU from random weights:   python docs/examples/judge.py"""
from atgrpo_jax import Trainer


class Judge:
    roles = ("left", "right", "judge")  # turn order
    max_turns = 1
    splits = {"test": 10}  # held-out tasks

    def reset(self, task, split):
        return {"target": str(task % 10), "left": "", "right": ""}

    def prompt(self, role, turn, state):
        if role == "judge":  # the two answers only
            return [{"role": "user", "content": f"{state['left']} {state['right']}"}]
        return [{"role": "user", "content": f"say {state['target']}"}]

    def step(self, role, turn, state, text):  # -> (state, own reward, team reward, done)
        answer = text.strip()[:1]
        right = float(answer == state["target"])
        if role != "judge":
            state[role] = answer
            return state, right, 0.0, False
        return state, right, right, True  # team reward > 0: a success


def trainer(workdir="runs/judge", **overrides):
    return Trainer("configs/demo.py", workdir=workdir, workflow=Judge(), overrides={
        "char_alphabet": "0123456789 ?y\nuseraitn", "rollout.max_new_tokens": 1, "rollout.max_turns": 1,
        "rollout.num_tasks": 16, "optim.lr": 1e-3, "train.steps": 60, "train.eval_every": 15,
        "train.eval_tasks": 10, **overrides})


if __name__ == "__main__":
    print(trainer().train())
