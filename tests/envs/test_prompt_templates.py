"""Prompt templates: the shipped ones, any of them replaced from a directory, and the errors a bad one gives."""
import os

import pytest

from atgrpo_jax.envs.math_workflow import MathWorkflow
from atgrpo_jax.envs.prompt_templates import SHIPPED, Prompts, copy_shipped
from atgrpo_jax.envs.workflow_registry import make_workflow


def math(**kw):
    return MathWorkflow(test_sets=("aime24",), **kw)


def test_a_copy_of_the_shipped_templates_gives_the_same_prompts(tmp_path):
    written = copy_shipped(str(tmp_path))
    assert len(written) == sum(len(os.listdir(os.path.join(SHIPPED, f))) for f in os.listdir(SHIPPED)) > 10
    for name in ("plan_path_tool_plan", "sokoban_tool_plan", "plan_path_demo"):
        shipped, copied = make_workflow(name), make_workflow(name, prompt_dir=str(tmp_path))
        for agent in range(len(shipped.agents)):
            state = shipped.reset([0, 1], "test")
            assert copied.prompts(state, agent, 0) == shipped.prompts(state, agent, 0)
    state = math().reset([0], "aime24")
    assert math(prompt_dir=str(tmp_path)).prompts(state, 0, 0) == math().prompts(state, 0, 0)


def test_a_template_of_the_directory_replaces_the_shipped_one(tmp_path):
    (tmp_path / "math").mkdir()
    (tmp_path / "math" / "reasoner.system.j2").write_text("Think step by step.\n")
    (tmp_path / "math" / "user.j2").write_text("{{ problem }}\nPlease reason step by step (turn {{ turn }}).\n")
    wf = math(prompt_dir=str(tmp_path))
    state = wf.reset([0], "aime24")
    [system, user] = wf.prompts(state, 0, 0)[0]
    assert system["content"] == "Think step by step."  # (a template's last newline is dropped)
    assert user["content"] == f"{state['problem'][0]}\nPlease reason step by step (turn 0)."
    [tool_system, _] = wf.prompts(state, 1, 0)[0]  # not replaced: the shipped one
    assert tool_system["content"] == math().prompts(state, 1, 0)[0][0]["content"]


def test_bad_templates_are_named_with_what_is_wrong(tmp_path):
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "plan.sytem.j2").write_text("typo in the name")
    with pytest.raises(ValueError, match=r"plan.sytem.j2'\], which replace no template of grid; its templates: "):
        Prompts("grid", str(tmp_path))
    os.remove(tmp_path / "grid" / "plan.sytem.j2")
    (tmp_path / "grid" / "handoff.j2").write_text("{% if code %}\nno end")
    with pytest.raises(ValueError, match=r"grid/handoff.j2, line \d: Unexpected end of template"):
        Prompts("grid", str(tmp_path))
    (tmp_path / "grid" / "handoff.j2").write_text("{{ program }}")
    prompts = Prompts("grid", str(tmp_path))
    with pytest.raises(ValueError, match=r"handoff.j2: 'program' is undefined; it is given actions, code, output"):
        prompts.render("handoff.j2", code="x", output="", actions="")
    with pytest.raises(ValueError, match="is not a directory"):
        Prompts("grid", str(tmp_path / "missing"))


def test_a_blank_system_template_gives_one_user_message(tmp_path):
    """The reference's prompts are one user message: a directory of its texts blanks the system templates."""
    (tmp_path / "math").mkdir()
    (tmp_path / "math" / "reasoner.system.j2").write_text("{# none: the reference sends no system message #}\n")
    wf = math(prompt_dir=str(tmp_path))
    state = wf.reset([0], "aime24")
    assert [m["role"] for m in wf.prompts(state, 0, 0)[0]] == ["user"]
    assert [m["role"] for m in math().prompts(state, 0, 0)[0]] == ["system", "user"]  # the shipped one
