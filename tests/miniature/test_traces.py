"""Solver traces for the paper's grid workflows: the noiseless ones solve every level under both recipes."""
import numpy as np
import pytest

from atgrpo_jax.envs.workflow_registry import make_workflow
from atgrpo_jax.envs.workflow import take_branch
from atgrpo_jax.miniature import traces

LEVELS = {"plan_path": dict(params=dict(height=6, width=6, min_distance=1, max_distance=6)), "sokoban": {}}


def play(workflow, game, tasks, noise):
    """Drive the workflow with the traces' replies; (success per task, the chat rows)."""
    rows = list(traces.episodes(workflow, game, tasks, noise, seed=0))
    state = workflow.reset(list(tasks), "train")  # again, feeding back the rows' replies in order
    replies = iter(r["messages"][-1]["content"] for r in rows)
    for turn in range(workflow.max_turns):
        for agent in range(len(workflow.agents)):
            active = ~workflow.done(state)
            if not active.any():
                break
            texts = [[next(replies) if a else ""] for a in active]
            state = take_branch(workflow.step(state, agent, turn, texts).state, np.zeros(len(tasks), np.int32))
    return workflow.success(state), rows


@pytest.mark.parametrize("game,recipe,single", [("plan_path", "reference", False), ("sokoban", "paper", False)])
def test_noiseless_traces_solve_every_level(game, recipe, single):
    wf = make_workflow(f"{game}_tool_plan", single_agent=single, recipe=recipe, max_turns=3, **LEVELS[game])
    success, rows = play(wf, game, range(6), noise=0.0)
    assert success.all()
    roles = [r["messages"][0]["content"] for r in rows]
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows) and len(rows) >= 6
    if not single:  # the tool agent's program, then the plan agent's answer, each with the workflow's prompt
        assert rows[0]["messages"][-1]["content"].startswith("```python\nprint('**Actions List**: [")
        assert rows[6]["messages"][-1]["content"].startswith("#### [") and roles[0] != roles[6]  # 6 tasks a turn


def test_noise_replaces_a_reply_with_random_moves():
    rng = np.random.default_rng(0)
    noisy = [traces.noised([0, 0, 0, 0, 0, 0], 0.5, rng) for _ in range(400)]
    kept = sum(n == [0] * 6 for n in noisy)
    assert 150 < kept < 250 and all(1 <= len(n) <= 4 for n in noisy if n != [0] * 6)
    wf = make_workflow("plan_path_tool_plan", recipe="paper", max_turns=3, **LEVELS["plan_path"])
    assert not play(wf, "plan_path", range(6), noise=1.0)[0].all()
